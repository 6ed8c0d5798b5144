"""How a batch is kept in the graph's checkpoint, so a re-run never dispatches it again."""

from __future__ import annotations

from collections.abc import Sequence

import anyio.from_thread
import anyio.lowlevel

from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import ToolCall, ToolResult

from ..batch import RunRecall
from .loop import hooks_loop

with missing_extra("langchain", "runtime_hooks.adapters.langchain"):
    from langgraph.config import get_config
    from langgraph.func import task

_CHECKPOINTER = "__pregel_checkpointer"
"""Where LangGraph puts a run's checkpointer in its config (``CONFIG_KEY_CHECKPOINTER``)."""


async def dispatch_kept(run: RunRecall, calls: Sequence[ToolCall]) -> list[ToolResult]:
    """One deliberate round for ``calls``, kept in the graph's checkpoint when there is one.

    Inside a LangGraph node the batch runs as a task: a node re-run after an ``interrupt()``
    (in this process or after a restart, with the same checkpointer) gets the batch's results
    from the checkpoint and never dispatches it again; in a new process those searches answer
    with their evidence re-read under the run's validation bound (:meth:`RunRecall.replay`).
    Outside a graph it is :meth:`RunRecall.dispatch_batch`.
    """
    try:
        configurable = get_config().get("configurable", {})
    except RuntimeError:  # not inside a graph run: nothing to keep the batch in
        return await run.dispatch_batch(calls)
    if configurable.get(_CHECKPOINTER) is None:
        # No checkpointer: nothing is kept, and nothing can be resumed (an interrupt needs
        # one), so the task would only cost time (about 0.6 ms a batch).
        return await run.dispatch_batch(calls)
    dispatched = False

    async def recallbound_search_batch() -> list[dict[str, object]]:
        nonlocal dispatched
        dispatched = True
        results = await run.dispatch_batch(calls)
        return [run.record(c, r) for c, r in zip(calls, results, strict=True)]

    records = await task(recallbound_search_batch)()
    if not dispatched:  # the checkpoint's: the batch ran before this node re-ran
        await run.replay(records)
    return await run.dispatch_batch(calls)  # every call is stored now: no round


def dispatch_kept_sync(
    run: RunRecall, calls: Sequence[ToolCall], token: anyio.lowlevel.EventLoopToken | None
) -> list[ToolResult]:
    """:func:`dispatch_kept` from a sync graph run: the batch is dispatched on the hooks' loop
    (``token``) from this worker thread, and kept in the graph's checkpoint like the async
    form's. Raises :class:`NotDispatchedError` on the loop's own thread (waiting for the loop
    there would deadlock) or without a loop to run on."""
    loop = hooks_loop(token)

    def dispatch() -> list[ToolResult]:
        return anyio.from_thread.run(run.dispatch_batch, calls, token=loop)

    try:
        configurable = get_config().get("configurable", {})
    except RuntimeError:  # not inside a graph run
        return dispatch()
    if configurable.get(_CHECKPOINTER) is None:
        return dispatch()
    dispatched = False

    def recallbound_search_batch() -> list[dict[str, object]]:
        nonlocal dispatched
        dispatched = True
        results = dispatch()
        return [run.record(c, r) for c, r in zip(calls, results, strict=True)]

    records = task(recallbound_search_batch)().result()
    if not dispatched:  # the checkpoint's: the batch ran before this node re-ran
        anyio.from_thread.run(run.replay, records, token=loop)
    return dispatch()  # every call is stored now: no round
