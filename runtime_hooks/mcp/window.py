"""Parallel ``search_memory`` requests of one run share one deliberate round (group commit).

An MCP client sends a model response's parallel tool calls as separate requests, so no hook
sees the batch. The server rebuilds it: the first request of a run opens a batch, and every
request of that run that arrives before the batch closes joins it; the batch then goes to
:meth:`RecallHooks.dispatch <runtime_hooks.hooks.RecallHooks.dispatch>` as one turn (one
round, one slot per valid call, the rest refused). Rounds of one run run one at a time;
requests that arrive while a round is in flight form the next batch.

When a batch closes. The window asks the allowance what the run has left as this process
last learned it from the run's own rounds
(:meth:`RecallAllowance.known_room <plugin.control.allowance.RecallAllowance.known_room>`; a
run it has reserved nothing for is taken as fresh): no ledger read or write stands between a
burst's first call and the rest of it, so the server's own bookkeeping never splits a burst.
Then

* a batch stays open until ``window_s`` after its first call arrived, to take the rest of
  the burst. This holds for a batch of one call too: the first call of a burst often arrives
  alone (on stdio the client writes each request on its own, and the server may read the
  first before the others are written), and closing its batch at once would spend a round on
  it and send the rest of the burst to another. So a lone call waits the window (at most
  ``window_s``; 20 ms by default) before its round opens; a window of 0 never waits, and then
  only the calls that have already arrived share a round;
* it closes as soon as it holds as many calls as the run has slots left (no later call could
  get a slot in it), and at once when the run has no slot or round left (every call is refused
  without waiting).

The wait is bounded: a batch never stays open past ``window_s`` after its first call,
however many calls trickle in meanwhile, nor past half of what its run has left before its
deadline (a window longer than that would hold a live run's call until the deadline refuses
it), and a round never takes more than the allowance grants (the ledger's reservation
decides).

What the allowance knows is an estimate: only the ledger's reservation decides what a round is
granted, so a stale estimate can cost a burst its shared round, never an extra slot.

A request whose call id is already in the collecting batch (a client that sent the same call
again before its batch closed) waits for that batch and joins a later one, where the ledger's
record of the call answers it: one batch never holds one call id twice.

A batch runs in the window's own task group, not in any request's task: a client that
disconnects or cancels its request leaves the round running for the others; its slot stays
consumed (no refunds) and its result is dropped.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import attrs
from anyio.abc import TaskGroup

from runtime_hooks.hooks import RecallHooks, ToolCall, ToolResult

DEFAULT_WINDOW_S = 0.02
"""How long a batch stays open for the rest of its burst (the most a lone call waits)."""



def check_window(value: object) -> float:
    """``value`` as a window in seconds: a finite number >= 0 (``ValueError``/``TypeError``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"the batch window must be a number of seconds, got {type(value).__name__}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"the batch window must be finite and >= 0 seconds, got {value!r}")
    return float(value)


@attrs.define(eq=False)
class _Batch:
    run_id: str
    principal: str
    scope: str
    opened: float
    calls: list[ToolCall] = attrs.field(factory=list)
    grew: anyio.Event = attrs.field(factory=anyio.Event)
    done: anyio.Event = attrs.field(factory=anyio.Event)
    results: dict[str, ToolResult] = attrs.field(factory=dict)
    error: Exception | None = None

    def add(self, call: ToolCall) -> None:
        self.calls.append(call)
        self.grew.set()
        self.grew = anyio.Event()


@attrs.define(eq=False)
class _Run:
    lock: anyio.Lock = attrs.field(factory=anyio.Lock)
    collecting: _Batch | None = None
    users: int = 0


@attrs.define(eq=False)
class BatchWindow:
    """The per-run batches of one server (enter it with ``async with`` to run batches)."""

    hooks: RecallHooks
    window_s: float = attrs.field(default=DEFAULT_WINDOW_S, converter=check_window)
    _runs: dict[str, _Run] = attrs.field(factory=dict, init=False, repr=False)
    _tasks: TaskGroup | None = attrs.field(default=None, init=False, repr=False)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[BatchWindow]:
        """Run batches in a task group of their own; cancel those still in flight on exit."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield self
            finally:
                self._tasks = None
                tasks.cancel_scope.cancel()

    def rounds_in_use(self) -> int:
        """Runs with a batch or a round in flight (for tests: 0 when nothing leaked)."""
        return len(self._runs)

    @asynccontextmanager
    async def _use(self, run_id: str) -> AsyncIterator[_Run]:
        run = self._runs.setdefault(run_id, _Run())
        run.users += 1
        try:
            yield run
        finally:
            run.users -= 1
            if run.users == 0 and self._runs.get(run_id) is run:
                del self._runs[run_id]

    async def search(
        self, call: ToolCall, *, run_id: str, principal: str, scope: str
    ) -> ToolResult:
        """The result of ``call``, searched in the run's current batch.

        Raises what :meth:`RecallHooks.dispatch` raised for the batch (a ledger that is
        locked or unavailable: nothing was searched).
        """
        if self._tasks is None:
            raise RuntimeError("BatchWindow.search needs `async with window.running()`")
        async with self._use(run_id) as run:
            while True:
                batch = run.collecting
                if batch is None or (batch.principal, batch.scope) != (principal, scope):
                    batch = run.collecting = _Batch(run_id, principal, scope,
                                                    anyio.current_time())
                    run.users += 1  # the batch's task holds the run too
                    self._tasks.start_soon(self._flush, run_id, run, batch)
                if any(held.call_id == call.call_id for held in batch.calls):
                    # The same call id sent again before its batch closed: wait for that
                    # batch, then go in a later one (which answers from the ledger's record).
                    await batch.done.wait()
                    continue
                batch.add(call)
                await batch.done.wait()
                break
        if batch.error is not None:
            raise batch.error
        return batch.results[call.call_id]

    @asynccontextmanager
    async def exclusive(self, run_id: str) -> AsyncIterator[None]:
        """Hold the run's round lock (an automatic round never overlaps a batch's round)."""
        async with self._use(run_id) as run, run.lock:
            yield

    async def _flush(self, run_id: str, run: _Run, batch: _Batch) -> None:
        try:
            async with run.lock:
                await self._hold(batch)
                if run.collecting is batch:
                    run.collecting = None
                try:
                    results = await self.hooks.dispatch(
                        batch.calls, run_id=run_id, scope=batch.scope, principal=batch.principal
                    )
                    batch.results = {result.call_id: result for result in results}
                except Exception as exc:  # the batch's own failure, handed to each request
                    batch.error = exc
                if run.collecting is batch:
                    run.collecting = None
        finally:
            if run.collecting is batch:
                run.collecting = None
            batch.done.set()
            run.users -= 1
            if run.users == 0 and self._runs.get(run_id) is run:
                del self._runs[run_id]

    async def _hold(self, batch: _Batch) -> None:
        """Wait while the batch may still grow usefully (see the module docstring)."""
        allowance = self.hooks.allowance
        if allowance.is_legacy:
            return
        room = allowance.known_room(batch.run_id) or allowance.fresh_room()
        wall = allowance.checked_clock.wall()
        slots_left = room.slots_at(wall)
        if slots_left <= 0 or room.rounds <= 0:
            return
        closes = batch.opened + self.window_s
        if room.deadline_wall is not None:  # a live run's call is not held to its deadline
            closes = min(closes, anyio.current_time() + (room.deadline_wall - wall) / 2)
        while len(batch.calls) < slots_left:
            left = closes - anyio.current_time()
            if left <= 0:
                return
            with anyio.move_on_after(left):
                await batch.grew.wait()
