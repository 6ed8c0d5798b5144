"""What the streaming-cancellation tests share: a retriever (and model hook) that hangs at a
chosen cut point, the ways a host stops a streaming run, and the checks made afterwards.

The scenario is the same for every framework: the automatic round, then one ``search_memory``
call (``CALL_ID``, ``QUERY``), then the final answer. The host stops the run at a cut point:

* ``automatic``: while the automatic round's search is in flight;
* ``search``: while the model's search is in flight;
* ``final``: after the final answer started (the model hangs after its first text).

Every hang waits on an ``anyio.Event`` nobody sets, so only the host's cancellation ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from plugin import AllowancePolicy, Clock, Evidence, SimpleRetriever
from runtime_hooks import RecallHooks, ToolCall
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.testing import Step, search

CUT_POINTS = ("automatic", "search", "final")
QUERY = "cutover date"
CALL_ID = "s0"
RUN_ID = "run-cut"
POLICY = AllowancePolicy(max_searches=8, max_rounds=4)
"""Room for more rounds than the scenario takes: a search sent again is refused by its claim,
never merely by the run running out of rounds."""
HALFWAY = POLICY.deadline_s / 2
"""When the next invocation comes: a round it opened must not push the deadline further."""

REPLAYED_AFTER_CUT: dict[str, tuple[str, str | None] | None] = {
    "automatic": None,  # the model's call was never dispatched
    "search": ("failed", "in_flight"),  # cancelled mid-flight: keeps its claim
    "final": ("ok", None),  # finished before the cut: its answer is stored
}


@attrs.define(eq=False)
class Cue:
    """Where the run hangs, and what was searched. ``reached`` is set when the hang begins."""

    point: str
    searched: list[str] = attrs.field(factory=list)
    reached: anyio.Event = attrs.field(factory=anyio.Event)
    armed: bool = True

    async def search(self, request: Any) -> list[Evidence]:
        self.searched.append(request.text)
        if self.armed and (self.point == "automatic"
                           or (self.point == "search" and request.text == QUERY)):
            await self._hang()
        n = len(self.searched)
        return [Evidence(id=f"m{n}", text=f"memo {n} about {request.text}")]

    async def final_started(self) -> None:
        """The model calls this once its final answer has begun."""
        if self.armed and self.point == "final":
            await self._hang()

    async def _hang(self) -> None:
        self.reached.set()
        await anyio.Event().wait()


@contextlib.asynccontextmanager
async def cue_hooks(tmp_path: Path, clock: Clock, cue: Cue) -> AsyncIterator[RecallHooks]:
    """Hooks over a SQLite ledger (``POLICY``) whose retriever is ``cue``'s."""
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", policy=POLICY)
    async with open_hooks(config, clock=clock, retriever=SimpleRetriever(cue.search)) as hooks:
        yield hooks


async def stop(way: str, consume: Callable[[], Awaitable[None]], cue: Cue) -> None:
    """Run ``consume`` and stop it once ``cue`` is reached: ``task`` cancels the consumer's
    task (only ``CancelledError`` may come back), ``scope`` cancels an anyio cancel scope around
    it (nothing may escape), any other way is the consumer's own (it breaks out itself)."""
    with anyio.fail_after(10):
        if way == "task":
            task = asyncio.ensure_future(consume())
            await cue.reached.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        elif way == "scope":
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as scope:
                    tg.start_soon(_cancel_when_reached, cue, scope)
                    await consume()
                assert scope.cancelled_caught
        else:
            await consume()


async def _cancel_when_reached(cue: Cue, scope: anyio.CancelScope) -> None:
    await cue.reached.wait()
    scope.cancel()


@contextlib.asynccontextmanager
async def nothing_left_running() -> AsyncIterator[None]:
    """Around a test: no task it started outlives it, no coroutine is left never awaited."""
    before = set(asyncio.all_tasks())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
        for _ in range(50):
            await anyio.sleep(0.01)
            if not _left(before):
                break
        gc.collect()
    assert [task.get_coro() for task in _left(before)] == []
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []


def _left(before: set[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() - before
            if task is not asyncio.current_task() and not task.done()]


async def replayed(hooks: RecallHooks, call_id: str = CALL_ID) -> tuple[str, str | None] | None:
    """The stored answer to ``call_id`` (with ``QUERY``), as (status, failure), if any."""
    [record] = await hooks.replay([ToolCall(call_id=call_id, arguments={"query": QUERY})],
                                  run_id=RUN_ID, scope="atlas", principal="ana")
    return None if record is None else (record.status, record.failure)


async def usage(hooks: RecallHooks) -> tuple[int, int, int]:
    """The run's (rounds, reserved, executed)."""
    counts = await hooks.allowance.ledger.usage(RUN_ID)
    return counts.rounds, counts.reserved, counts.executed


Invoke = Callable[..., Awaitable[Any]]
"""Runs one more invocation of the run on a cued scripted model playing the steps it is
given, and returns that model (its ``requests`` hold what the model read)."""

STEPS: tuple[Step, ...] = ([search(QUERY, call_id=CALL_ID)], "Final answer")


async def continue_after_cut(hooks: RecallHooks, clock: Any, cue: Cue, invoke: Invoke) -> None:
    """After a cut invocation: the run's next ones keep every claim and never renew it."""
    assert await replayed(hooks) == REPLAYED_AFTER_CUT[cue.point]

    # The next invocation of the run, half-way to its deadline, sends the same call again: a
    # claimed call is never searched twice (a call never dispatched before is searched now).
    cue.armed = False
    clock.advance(HALFWAY)
    again = await invoke(*STEPS)
    assert cue.searched.count(QUERY) == 1
    assert await replayed(hooks) == (REPLAYED_AFTER_CUT[cue.point] or ("ok", None))
    if cue.point == "search":
        assert "in_flight" in again.requests[1].tool_results[CALL_ID]

    # Past the run's original deadline, which the rounds since never renewed: no new round, no
    # search, and nothing the earlier invocations prepared comes back.
    counts, searched = await usage(hooks), list(cue.searched)
    clock.advance(POLICY.deadline_s - HALFWAY + 1)
    late = await invoke([search("deploy window", call_id="s1")], "Done.")
    assert await usage(hooks) == counts
    assert cue.searched == searched
    assert "deadline has passed" in late.requests[0].instructions
    assert "Recalled memory" not in late.requests[0].instructions
    assert "deadline" in late.requests[1].tool_results["s1"]
