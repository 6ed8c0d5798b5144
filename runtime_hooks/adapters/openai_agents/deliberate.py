"""The deliberate round: every search call of a model response, dispatched as one batch."""

from __future__ import annotations

import inspect
from typing import Any

import attrs

from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import ToolCall

from ..tool import SEARCH_TOOL
from .binding import bound_run
from .guardrail import is_search_tool

with missing_extra("openai-agents", "runtime_hooks.adapters.openai_agents"):
    from agents import Agent, RunContextWrapper, RunHooks, Tool
    from agents.items import ModelResponse, TResponseInputItem
    from agents.run_context import AgentHookContext
    from openai.types.responses import ResponseFunctionToolCall


def search_calls(
    response: ModelResponse, name: str = SEARCH_TOOL.name,
    namespaces: frozenset[str | None] = frozenset({None}),
) -> list[ToolCall]:
    """The search calls of one model response, in order: the calls of ``name`` in one of
    ``namespaces`` (None: no tool namespace)."""
    return [
        ToolCall(call_id=item.call_id, arguments=item.arguments)
        for item in response.output
        if isinstance(item, ResponseFunctionToolCall) and item.name == name
        and (getattr(item, "namespace", None) or None) in namespaces
    ]


async def offered(context: RunContextWrapper[Any], agent: Agent[Any]) -> frozenset[str | None]:
    """The tool namespaces (None: none) under which ``agent`` offers the search tool now: the
    SDK runs a call only on a tool of the agent that answers to the call's name and namespace
    and is enabled (``is_enabled``, asked as the SDK asks it). Another tool of that name (a
    host's own ``crm.search_memory``) or a search tool the agent lacks or disabled (a triage
    agent's) is not recall's, so its calls are never searched."""
    found: set[str | None] = set()
    for tool in getattr(agent, "tools", ()):
        if not is_search_tool(tool):
            continue
        enabled: Any = tool.is_enabled
        if not isinstance(enabled, bool):
            enabled = enabled(context, agent)
            if inspect.isawaitable(enabled):
                enabled = await enabled
        if enabled:
            namespace = getattr(tool, "_tool_namespace", None)
            found.add(namespace if isinstance(namespace, str) and namespace else None)
    return frozenset(found)


@attrs.define(eq=False)
class RecallRunHooks(RunHooks[Any]):
    """Run hooks whose ``on_llm_end`` dispatches a response's search calls as one batch (the
    calls the responding agent would run on its search tool, :func:`offered`).

    Every other hook, and ``on_llm_end`` itself afterwards, is passed on to ``inner`` (the
    host's own run hooks), since the SDK takes a single ``hooks`` object per run.
    """

    inner: RunHooks[Any] | None = None

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        calls = search_calls(response, namespaces=await offered(context, agent))
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
