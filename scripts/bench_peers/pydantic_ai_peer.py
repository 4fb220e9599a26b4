"""Pydantic AI (pydantic-ai-slim) on the workload of common.py: an Agent
with one async tool on a FunctionModel (pydantic_ai's in-process model),
whose no-op middleware are capabilities overriding before_model_request and
after_model_request to pass the request and the response through."""

import asyncio
from importlib.metadata import version

from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import common


class Noop(AbstractCapability):
    async def before_model_request(self, ctx, request_context):
        return request_context

    async def after_model_request(self, ctx, *, request_context, response):
        return response


def build(middleware: int, latency: float):
    async def model(messages, info: AgentInfo) -> ModelResponse:
        if latency:
            await asyncio.sleep(latency)
        returns = sum(
            1 for m in messages for p in m.parts if isinstance(p, ToolReturnPart)
        )
        if returns < 2:
            return ModelResponse(parts=[ToolCallPart("lookup", {"id": 7}, tool_call_id=f"c{returns}")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(
        FunctionModel(model),
        capabilities=[Noop() for _ in range(middleware)],
    )

    @agent.tool_plain
    async def lookup(id: int) -> int:
        """Looks up."""
        return id

    async def run(i: int) -> str:
        result = await agent.run(f"question {i}")
        return result.output

    return run


if __name__ == "__main__":
    common.main(
        "Pydantic AI",
        "pydantic-ai-slim " + version("pydantic-ai-slim"),
        build,
        "capability with before/after_model_request pass-through",
    )
