"""A hand-built LangGraph graph's tools node."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio.lowlevel
import attrs

from runtime_hooks._extras import missing_extra

from .kept import dispatch_kept, dispatch_kept_sync
from .messages import pending_search_calls
from .recall import LangChainRecall, NodeBatch, node_run

with missing_extra("langchain", "runtime_hooks.adapters.langchain"):
    from langchain_core.tools import BaseTool
    from langgraph.prebuilt import ToolNode
    from langgraph.runtime import Runtime


@attrs.define(eq=False)
class RecallToolNode:
    """A hand-built LangGraph graph's tools node: dispatch the batch, then run the ToolNode.

    ``ainvoke`` is the async node. ``invoke`` is the node for a sync ``graph.invoke`` run from
    a worker thread of the loop the hooks were opened on (``await anyio.to_thread.run_sync(
    graph.invoke, ...)``): it dispatches on that loop (``token``, taken when the node is built
    inside the loop) and then lets the ToolNode run its tools in pool threads, where each tool
    only reads its stored result. Build it inside the running loop.
    """

    recall: LangChainRecall
    tools: ToolNode
    token: anyio.lowlevel.EventLoopToken = attrs.field(factory=anyio.lowlevel.current_token)

    @classmethod
    def with_tools(cls, recall: LangChainRecall, tools: Sequence[BaseTool] = ()) -> RecallToolNode:
        """A node whose ToolNode holds ``search_memory`` and ``tools``."""
        return cls(recall, ToolNode([recall.tool, *tools]))

    async def ainvoke(self, state: dict[str, Any], runtime: Runtime[Any]) -> Any:
        """The async node: one round for the batch (kept in the checkpoint:
        :func:`dispatch_kept`), then the ToolNode; an ``interrupt()`` in a sibling tool never
        makes the batch dispatch again, after a restart either."""
        run = self.recall.run(runtime.context)
        calls = pending_search_calls(state["messages"])
        results = await dispatch_kept(run, calls) if calls else []
        token = node_run.set(NodeBatch.of(run, calls, results))  # the tool tasks copy it
        try:
            return await self.tools.ainvoke(state)
        finally:
            node_run.reset(token)

    def invoke(self, state: dict[str, Any], runtime: Runtime[Any]) -> Any:
        """The sync node: the batch dispatched on the hooks' loop (as a task, like
        :meth:`ainvoke`), then the ToolNode."""
        calls = pending_search_calls(state["messages"])
        run = self.recall.run(runtime.context)
        results = dispatch_kept_sync(run, calls, self.token) if calls else []
        token = node_run.set(NodeBatch.of(run, calls, results))  # the pool threads copy it
        try:
            return self.tools.invoke(state)
        finally:
            node_run.reset(token)
