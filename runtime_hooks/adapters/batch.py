"""One run's deliberate rounds, batched per model response.

Frameworks call each tool separately (pydantic-ai, the Agents SDK, LangChain's ``Send``). One
``dispatch([call])`` per tool call would open one round per call and lose calls to the
``rounds`` limit while slots are still unreserved. An adapter therefore hands the *whole*
batch of a model response to :meth:`RunRecall.dispatch_batch` from the one hook that sees it
before any tool runs; each tool call then returns its stored result
(:meth:`RunRecall.result`). A batch seen again (a resume, a re-run hook) never reserves twice:
calls that already have a result are skipped.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import anyio
import attrs

from plugin.memory.state import WorkingState
from runtime_hooks.hooks import PreparedContext, RecallHooks, ToolCall, ToolResult


@attrs.define(eq=False)
class RunRecall:
    """The recall of one agent run: trusted identity, and the results of its search calls.

    ``run_id``, ``scope`` and ``principal`` come from the host (the framework's deps or
    context), never from the model or from task text.
    """

    hooks: RecallHooks
    run_id: str
    scope: str
    principal: str
    _results: dict[str, ToolResult] = attrs.field(factory=dict, init=False, repr=False)
    _lock: anyio.Lock = attrs.field(factory=anyio.Lock, init=False, repr=False)

    async def prepare(self, state: WorkingState) -> PreparedContext:
        """The automatic round for this model request."""
        return await self.hooks.prepare(
            state, run_id=self.run_id, scope=self.scope, principal=self.principal
        )

    async def dispatch_batch(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One deliberate round for the calls of one model response that have no result yet.

        Returns the results of every call in ``calls`` (stored ones included), in order.
        Batches of one run are serialized, so a batch seen twice reserves once.
        """
        async with self._lock:
            unique = {call.call_id: call for call in calls}
            pending = [call for call in unique.values() if call.call_id not in self._results]
            if pending:
                for result in await self.hooks.dispatch(
                    pending, run_id=self.run_id, scope=self.scope, principal=self.principal
                ):
                    self._results[result.call_id] = result
        return [self._results[call.call_id] for call in calls]

    def result(self, call_id: str) -> ToolResult | None:
        """The stored result of a call dispatched in a batch, or None."""
        return self._results.get(call_id)

    def answered(self, call_id: str) -> bool:
        return call_id in self._results


@attrs.define(eq=False)
class RunRecalls:
    """One :class:`RunRecall` per host run id, so a run's stored results outlive one hook call.

    A run continued, resumed or re-run in this process finds the answers its batches stored.
    The most recent ``max_runs`` runs are kept (oldest forgotten first). A run id asked for
    again with another scope or principal raises ``mismatch(message)``: the adapter's own
    error type.
    """

    hooks: RecallHooks
    mismatch: Callable[[str], Exception]
    max_runs: int = 1024
    _runs: collections.OrderedDict[str, RunRecall] = attrs.field(
        factory=collections.OrderedDict, init=False, repr=False
    )

    def get(self, run_id: str, *, scope: str, principal: str) -> RunRecall:
        """The run's recall; created on first use, checked against its identity after."""
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = RunRecall(self.hooks, run_id, scope, principal)
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)
        elif (run.scope, run.principal) != (scope, principal):
            raise self.mismatch(f"run {run_id!r} was opened for another scope or principal")
        else:
            self._runs.move_to_end(run_id)
        return run
