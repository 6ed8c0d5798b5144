"""A native asyncio cancel (``asyncio.gather``, ``wait_for``, a framework's own task handling)
passes any anyio shield: the round's trace must still be written, and the attempt counted as
executed (asyncio only: trio has no native cancel)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import pytest
from agents import Agent, RunConfig
from agents.testing import ScriptedModel, assistant_message, function_call

from plugin import Evidence, ManualClock, SimpleRetriever, WorkingState
from plugin.control.shield import finish
from runtime_hooks.adapters import SEARCH_TOOL
from runtime_hooks.adapters.openai_agents import agents_recall
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.hooks import RecallHooks, ToolCall

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def slow_retriever(started: anyio.Event, calls: list[str]) -> SimpleRetriever:
    async def search(request: Any) -> list[Evidence]:
        calls.append(request.text)
        started.set()
        await anyio.sleep(3600)
        return [Evidence(id="m1", text="never shown")]

    return SimpleRetriever(search)


def phase(hooks: RecallHooks, which: str) -> Callable[[], Coroutine[Any, Any, object]]:
    if which == "dispatch":
        return lambda: hooks.dispatch([ToolCall(call_id="c0", arguments={"query": "backfill"})],
                                      run_id="r1", scope="atlas", principal="ana")
    return lambda: hooks.prepare(WorkingState("invoice backfill"), run_id="r1", scope="atlas",
                                 principal="ana")


async def cancel_natively(how: str, work: Callable[[], Coroutine[Any, Any, object]],
                          started: anyio.Event) -> None:
    if how == "gather under an anyio scope":
        async with anyio.create_task_group() as group:
            async def gathered() -> None:
                await asyncio.gather(work())
            group.start_soon(gathered)
            await started.wait()
            group.cancel_scope.cancel()
    elif how == "cancelled again and again":
        task = asyncio.ensure_future(work())
        await started.wait()
        while not task.done():
            task.cancel()
            await asyncio.sleep(0)
    else:
        # wait_for's own timeout, long enough for a busy machine to reach the search first
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(work()), timeout=2.0)


@pytest.mark.parametrize("how", ["gather under an anyio scope", "cancelled again and again",
                                 "wait_for"])
@pytest.mark.parametrize("which", ["dispatch", "prepare"])
async def test_a_native_cancel_mid_search_keeps_the_attempts_trace(
    tmp_path: Path, clock: ManualClock, how: str, which: str
) -> None:
    started, calls = anyio.Event(), []
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "m.db")
    async with open_hooks(config, clock=clock,
                          retriever=slow_retriever(started, calls)) as hooks:
        await cancel_natively(how, phase(hooks, which), started)
        usage = await hooks.allowance.ledger.usage("r1")
        traces = await hooks.allowance.ledger.attempts("r1")
    assert len(calls) == 1
    assert usage.executed == 1
    assert [trace.slot for trace in traces] == [1]


async def expire_once_started(timeout: anyio.CancelScope, started: anyio.Event) -> None:
    """The host's timeout runs out mid-search: its deadline is reached once the search began,
    however long the run took to get there (a fixed number of seconds could run out before)."""
    await started.wait()
    timeout.deadline = anyio.current_time()


async def test_a_host_timeout_around_an_agents_run_keeps_the_trace(
    tmp_path: Path, clock: ManualClock
) -> None:
    started, calls = anyio.Event(), []
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "m.db")
    async with open_hooks(config, clock=clock,
                          retriever=slow_retriever(started, calls)) as hooks:
        recall = agents_recall(hooks, automatic=False)
        model = ScriptedModel([
            [function_call(SEARCH_TOOL.name, {"query": "invoice backfill"}, call_id="s0")],
            [assistant_message("Done.")]])
        agent: Agent[Any] = Agent(name="a", instructions="hi", model=model, tools=[recall.tool])
        with anyio.move_on_after(math.inf) as timeout:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(expire_once_started, timeout, started)
                await recall.run(agent, "Continue", run_id="r1", scope="atlas", principal="ana",
                                 run_config=RunConfig(tracing_disabled=True))
                tasks.cancel_scope.cancel()  # the run ended without a search: nothing to expire
        usage = await hooks.allowance.ledger.usage("r1")
    assert len(calls) == 1
    assert (usage.rounds, usage.reserved, usage.executed) == (1, 1, 1)


async def test_finish_completes_its_work_and_then_re_raises_the_callers_cancel() -> None:
    done: list[str] = []

    async def work() -> str:
        for _ in range(5):
            await asyncio.sleep(0)
        done.append("written")
        return "ok"

    task = asyncio.ensure_future(finish(work))
    for _ in range(3):
        await asyncio.sleep(0)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == ["written"]


async def test_finish_raises_the_callers_cancel_from_the_works_own_error() -> None:
    async def work() -> None:
        await asyncio.sleep(0)
        raise LookupError("the write failed")

    task = asyncio.ensure_future(finish(work))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as caught:
        await task
    # asyncio before 3.11 replaces a task's CancelledError at the task's boundary by a new one
    # whose context is the one raised: the work's error is then one link further down the chain.
    raised = caught.value if sys.version_info >= (3, 11) else caught.value.__context__
    assert isinstance(raised, asyncio.CancelledError)
    assert isinstance(raised.__cause__, LookupError)
    with pytest.raises(LookupError):  # uncancelled, the work's error is the caller's
        await finish(work)


async def test_finish_re_raises_a_cancel_that_lands_as_the_work_ends() -> None:
    async def work() -> str:
        asyncio.get_running_loop().call_soon(caller.cancel)  # the host's cancel, right now
        return "ok"

    caller = asyncio.ensure_future(finish(work))
    with pytest.raises(asyncio.CancelledError):
        await caller


async def test_a_cancel_during_a_write_that_fails_still_cancels_and_the_records_stay_owed(
    tmp_path: Path, clock: ManualClock
) -> None:
    """The trace write meets a locked ledger while the host cancels: the host's task ends
    cancelled (never carries on as if not), and the records are owed, written later."""
    import sqlite3

    from plugin import AttemptKind, RecallAllowance, RoundKind, SqliteLedger

    path = tmp_path / "ledger.db"
    async with SqliteLedger(path, timeout=0.1) as ledger:
        allowance = RecallAllowance(ledger, clock=clock)
        locker = sqlite3.connect(path, isolation_level=None)
        carried_on: list[str] = []

        async def host() -> None:
            async with allowance.round("r1", RoundKind.AUTOMATIC) as permit:
                async with permit.attempt(kind=AttemptKind.BASE):
                    pass
                locker.execute("BEGIN IMMEDIATE")  # another process writes meanwhile
                asyncio.get_running_loop().call_soon(task.cancel)  # the host cancels now
            carried_on.append("after the round")

        task = asyncio.ensure_future(host())
        with pytest.raises(asyncio.CancelledError):
            await task
        locker.execute("ROLLBACK")
        locker.close()
        assert carried_on == []
        await allowance.flush()
        assert [trace.slot for trace in await ledger.attempts("r1")] == [1]


async def test_no_task_of_finish_or_of_an_admission_leaves_an_unread_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from plugin.memory.planning import QueryPlanner, QueryStrategy

    class Stop(BaseException):
        pass

    async def work() -> None:
        raise Stop

    async def admission(experiment: str) -> bool:
        raise Stop

    with pytest.raises(Stop):
        await finish(work)
    planned = await QueryPlanner(QueryStrategy.TASK_CONTEXT, admission).plan(WorkingState("x"))
    assert planned.strategy is QueryStrategy.BASELINE  # the admission's failure
    import gc

    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text


async def _round_beside_a_cancelled_batch(path: Path, steps: int) -> tuple[int, int]:
    """A round (2 attempts, 1 refusal) whose end writes in one group-commit batch with other
    host tasks' writes, one of which (maybe the batch's runner) is cancelled natively after
    ``steps`` loop steps; then a late refusal on the closed permit. The run's usage."""
    from plugin import AttemptKind, RecallAllowance, RecallBudgetExceeded, RoundKind, SqliteLedger
    from plugin.control.ledger import RefusalRecord
    from plugin.control.refusal import RefusalReason

    def other(run_id: str) -> RefusalRecord:
        return RefusalRecord(run_id=run_id, round_index=0, what="attempt", kind="base",
                             reason=RefusalReason.CLOSED, at_wall=1_800_000_000.0)

    def cancel_later(task: asyncio.Future[None], left: int) -> None:
        if left == 0:
            task.cancel()
        else:
            asyncio.get_running_loop().call_soon(cancel_later, task, left - 1)

    async with SqliteLedger(path) as ledger:
        allowance = RecallAllowance(ledger, clock=ManualClock(wall=1.8e9, monotonic=1.0))
        async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
            for _ in range(3):  # two attempts, then a refused one (SLOTS)
                with contextlib.suppress(RecallBudgetExceeded):
                    async with permit.attempt(kind=AttemptKind.BASE):
                        pass
            first = asyncio.ensure_future(ledger.record([], [other("x")]))
            await asyncio.sleep(0)
            cancelled = asyncio.ensure_future(ledger.record([], [other("y")]))
            await asyncio.sleep(0)
            asyncio.get_running_loop().call_soon(cancel_later, cancelled, steps)
        await asyncio.gather(first, cancelled, return_exceptions=True)
        with contextlib.suppress(RecallBudgetExceeded):  # a late one: refused, CLOSED
            async with permit.attempt(kind=AttemptKind.BASE):
                pass
        await allowance.flush()
        usage = await ledger.usage("r")
    return usage.executed, usage.refused


async def test_a_batch_whose_runner_is_cancelled_writes_every_request_once(
    tmp_path: Path,
) -> None:
    """Another task's native cancel never fails this round's write, nor writes it twice:
    whichever step the cancel lands on, the run holds its 2 attempts and 2 refusals."""
    for steps in range(0, 60, 3):
        assert await _round_beside_a_cancelled_batch(tmp_path / f"l{steps}.db", steps) == (2, 2)
