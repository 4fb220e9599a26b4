"""The OpenAI Agents SDK (openai-agents) on the workload of common.py: an
Agent with one async function tool on an in-process Model subclass, tracing
off. The SDK takes one RunHooks object per run, so the N no-op middleware
are N RunHooks whose on_llm_start and on_llm_end do nothing, behind one
RunHooks that awaits each in turn."""

import asyncio
from importlib.metadata import version

from agents import Agent, RunHooks, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.testing import assistant_message, function_call
from agents.usage import Usage

import common

set_tracing_disabled(True)


class Noop(RunHooks):
    async def on_llm_start(self, context, agent, system_prompt, input_items):
        return None

    async def on_llm_end(self, context, agent, response):
        return None


class Each(RunHooks):
    """Runs every hook of `hooks`, in order."""

    def __init__(self, hooks):
        self.hooks = hooks

    async def on_llm_start(self, context, agent, system_prompt, input_items):
        for hook in self.hooks:
            await hook.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(self, context, agent, response):
        for hook in self.hooks:
            await hook.on_llm_end(context, agent, response)


class FakeModel(Model):
    def __init__(self, latency: float):
        self.latency = latency

    async def get_response(self, system_instructions, input, model_settings, tools,
                           output_schema, handoffs, tracing, **kwargs):
        if self.latency:
            await asyncio.sleep(self.latency)
        returns = 0
        if isinstance(input, list):
            returns = sum(
                1 for item in input
                if (item.get("type") if isinstance(item, dict) else getattr(item, "type", None))
                == "function_call_output"
            )
        if returns < 2:
            output = [function_call("lookup", {"id": 7}, call_id=f"c{returns}")]
        else:
            output = [assistant_message("done")]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the workload does not stream")


@function_tool
async def lookup(id: int) -> int:
    """Looks up."""
    return id


def build(middleware: int, latency: float):
    agent = Agent(name="bench", model=FakeModel(latency), tools=[lookup])
    hooks = Each([Noop() for _ in range(middleware)]) if middleware else None

    async def run(i: int) -> str:
        result = await Runner.run(agent, f"question {i}", hooks=hooks)
        return result.final_output

    return run


if __name__ == "__main__":
    common.main(
        "OpenAI Agents SDK",
        "openai-agents " + version("openai-agents"),
        build,
        "RunHooks with on_llm_start/on_llm_end no-ops, fanned out by one RunHooks",
    )
