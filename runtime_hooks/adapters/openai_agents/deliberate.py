"""The deliberate round: every search call of a model response, dispatched as one batch."""

from __future__ import annotations

from typing import Any

import attrs

from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import ToolCall

from ..tool import SEARCH_TOOL
from .binding import bound_run

with missing_extra("openai-agents", "runtime_hooks.adapters.openai_agents"):
    from agents import Agent, RunContextWrapper, RunHooks, Tool
    from agents.items import ModelResponse, TResponseInputItem
    from agents.run_context import AgentHookContext
    from openai.types.responses import ResponseFunctionToolCall


def search_calls(response: ModelResponse, name: str = SEARCH_TOOL.name) -> list[ToolCall]:
    """The search calls of one model response, in order."""
    return [
        ToolCall(call_id=item.call_id, arguments=item.arguments)
        for item in response.output
        if isinstance(item, ResponseFunctionToolCall) and item.name == name
    ]


@attrs.define(eq=False)
class RecallRunHooks(RunHooks[Any]):
    """Run hooks whose ``on_llm_end`` dispatches a response's search calls as one batch.

    Every other hook, and ``on_llm_end`` itself afterwards, is passed on to ``inner`` (the
    host's own run hooks), since the SDK takes a single ``hooks`` object per run.
    """

    inner: RunHooks[Any] | None = None

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        calls = search_calls(response)
        if calls:
            await bound_run("RecallRunHooks.on_llm_end").dispatch_batch(calls)
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_agent_start(self, context: AgentHookContext[Any], agent: Any) -> None:
        if self.inner is not None:
            await self.inner.on_agent_start(context, agent)

    async def on_agent_end(
        self, context: AgentHookContext[Any], agent: Any, output: Any
    ) -> None:
        if self.inner is not None:
            await self.inner.on_agent_end(context, agent, output)

    async def on_handoff(
        self, context: RunContextWrapper[Any], from_agent: Any, to_agent: Any
    ) -> None:
        if self.inner is not None:
            await self.inner.on_handoff(context, from_agent, to_agent)

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Any, tool: Tool
    ) -> None:
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Any, tool: Tool, result: Any
    ) -> None:
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)
