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
    from agents import Agent, FunctionTool, RunContextWrapper, RunHooks, Tool
    from agents.items import ModelResponse, TResponseInputItem
    from agents.run_context import AgentHookContext
    from openai.types.responses import ResponseFunctionToolCall


try:  # the SDK's own keys, where it has them (a deferred-loading tool has a key of its own)
    from agents._tool_identity import (
        get_function_tool_lookup_key_for_call,
        get_function_tool_lookup_keys,
    )
    _SDK_KEYS = True
except ImportError:  # pragma: no cover - older SDKs resolve by name and namespace alone
    _SDK_KEYS = False


def _call_key(item: ResponseFunctionToolCall) -> object:
    """The key the SDK resolves a call to a tool by (its name and tool namespace)."""
    if _SDK_KEYS:
        return get_function_tool_lookup_key_for_call(item)
    namespace = getattr(item, "namespace", None)
    return ("namespaced", namespace, item.name) if namespace else ("bare", item.name)


def _tool_keys(tool: FunctionTool) -> tuple[object, ...]:
    """The keys of calls the SDK resolves to ``tool``."""
    if _SDK_KEYS:
        return get_function_tool_lookup_keys(tool)
    namespace = getattr(tool, "_tool_namespace", None)
    return (("namespaced", namespace, tool.name) if namespace else ("bare", tool.name),)


def search_calls(
    response: ModelResponse, name: str = SEARCH_TOOL.name,
    offered: frozenset[object] | None = None,
) -> list[ToolCall]:
    """The search calls of one model response, in order: the calls of ``name`` (those the
    SDK resolves to a tool of ``offered``, :func:`offered`, when it is given)."""
    return [
        ToolCall(call_id=item.call_id, arguments=item.arguments)
        for item in response.output
        if isinstance(item, ResponseFunctionToolCall) and item.name == name
        and (offered is None or _call_key(item) in offered)
    ]


async def offered(context: RunContextWrapper[Any], agent: Agent[Any]) -> frozenset[object]:
    """The keys (name and tool namespace, as the SDK resolves a call) of the search tools
    ``agent`` offers now: the SDK runs a call only on a tool of the agent that answers to the
    call's name and namespace and is enabled (``is_enabled``, asked as the SDK asks it).
    Another tool of that name (a host's own ``crm.search_memory``) or a search tool the agent
    lacks or disabled (a triage agent's) is not recall's, so its calls are never searched."""
    found: set[object] = set()
    for tool in getattr(agent, "tools", ()):
        if not is_search_tool(tool):
            continue
        enabled: Any = tool.is_enabled
        if not isinstance(enabled, bool):
            enabled = enabled(context, agent)
            if inspect.isawaitable(enabled):
                enabled = await enabled
        if enabled:
            found.update(_tool_keys(tool))
    return frozenset(found)


_OFFERED_KEPT = 1024
"""Requests whose offered tools one run-hooks object remembers (shared by concurrent runs)."""


@attrs.define(eq=False)
class RecallRunHooks(RunHooks[Any]):
    """Run hooks whose ``on_llm_end`` dispatches a response's search calls as one batch (the
    calls the responding agent would run on its search tool, :func:`offered`).

    Every other hook, and ``on_llm_end`` itself afterwards, is passed on to ``inner`` (the
    host's own run hooks), since the SDK takes a single ``hooks`` object per run.
    """

    inner: RunHooks[Any] | None = None
    _offered: dict[tuple[int, int], frozenset[object]] = attrs.field(
        factory=dict, init=False, repr=False)
    """The search tools each request's agent offered as the request started."""

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        keys = self._offered.pop((id(context), id(agent)), None)
        calls = search_calls(response, offered=keys if keys is not None
                             else await offered(context, agent))
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
        # Asked as the request starts, as the SDK asked it for the tools it sent.
        self._offered[id(context), id(agent)] = await offered(context, agent)
        while len(self._offered) > _OFFERED_KEPT:  # requests whose response never came
            del self._offered[next(iter(self._offered))]
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
