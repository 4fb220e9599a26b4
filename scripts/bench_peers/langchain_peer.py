"""LangChain v1 (langchain, on langgraph) on the workload of common.py: an
agent of langchain.agents.create_agent with one async tool on an
in-process BaseChatModel subclass, whose no-op middleware are AgentMiddleware
overriding abefore_model and aafter_model to return None (no state change).
LangChain leaves out of the graph a middleware that overrides no hook, so
that one would cost nothing to measure."""

import asyncio
from importlib.metadata import version

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

import common


class Noop(AgentMiddleware):
    async def abefore_model(self, state, runtime):
        return None

    async def aafter_model(self, state, runtime):
        return None


class FakeModel(BaseChatModel):
    latency: float = 0.0

    @property
    def _llm_type(self) -> str:
        return "fake"

    def bind_tools(self, tools, **kwargs):
        return self

    def _answer(self, messages) -> ChatResult:
        returns = sum(1 for m in messages if isinstance(m, ToolMessage))
        if returns < 2:
            message = AIMessage(
                content="",
                tool_calls=[{"name": "lookup", "args": {"id": 7}, "id": f"c{returns}", "type": "tool_call"}],
            )
        else:
            message = AIMessage(content="done")
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        raise NotImplementedError("the workload is async")

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        if self.latency:
            await asyncio.sleep(self.latency)
        return self._answer(messages)


@tool
async def lookup(id: int) -> int:
    """Looks up."""
    return id


def build(middleware: int, latency: float):
    agent = create_agent(
        FakeModel(latency=latency),
        tools=[lookup],
        middleware=[type(f"Noop{i}", (Noop,), {})() for i in range(middleware)],
    )

    async def run(i: int) -> str:
        state = await agent.ainvoke({"messages": [{"role": "user", "content": f"question {i}"}]})
        return state["messages"][-1].content

    return run


if __name__ == "__main__":
    common.main(
        "LangChain v1",
        f"langchain {version('langchain')}, langgraph {version('langgraph')}",
        build,
        "AgentMiddleware with abefore_model/aafter_model returning None",
    )
