"""Permits over the real SQLite ledger: worker threads, both loops' spawn primitives, traces."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
import trio

from plugin import (
    AllowancePolicy,
    AttemptKind,
    ManualClock,
    RecallAllowance,
    RecallBudgetExceeded,
    RefusalReason,
    RoundKind,
    SqliteLedger,
    current_permit,
)
from plugin.control import AttemptOutcome

pytestmark = pytest.mark.anyio



@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[SqliteLedger]:
    async with SqliteLedger(tmp_path / "ledger.db") as ledger:
        yield ledger


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _search_in_thread(results: list[object]) -> None:
    permit = current_permit()  # the context was copied into the worker thread
    assert permit is not None
    try:
        with permit.attempt_sync(AttemptKind.DELIBERATE) as slot:
            results.append(slot)
    except RecallBudgetExceeded as exc:
        results.append(exc.refusal.reason)


async def test_worker_threads_never_over_spend(ledger: SqliteLedger, clock: ManualClock) -> None:
    allowance = RecallAllowance(ledger, clock=clock)
    results: list[object] = []
    async with allowance.round("r", RoundKind.DELIBERATE, slots=3):
        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(anyio.to_thread.run_sync, _search_in_thread, results)
    slots = sorted(r for r in results if isinstance(r, int))
    assert slots == [1, 2, 3]
    assert results.count(RefusalReason.SLOTS) == 9
    usage = await ledger.usage("r")
    assert (usage.reserved, usage.executed, usage.refused) == (3, 3, 9)


async def test_raw_threads_racing_on_one_permit_take_distinct_slots(
    ledger: SqliteLedger, clock: ManualClock
) -> None:
    allowance = RecallAllowance(ledger, clock=clock)
    results: list[object] = []
    async with allowance.round("r", RoundKind.DELIBERATE, slots=4):
        ctx = contextvars.copy_context()
        start = threading.Barrier(32)

        def worker() -> None:
            start.wait()
            ctx.copy().run(_search_in_thread, results)

        threads = [threading.Thread(target=worker) for _ in range(32)]
        for t in threads:
            t.start()
        await anyio.to_thread.run_sync(lambda: [t.join() for t in threads])
    assert sorted(r for r in results if isinstance(r, int)) == [1, 2, 3, 4]
    assert results.count(RefusalReason.SLOTS) == 28


async def test_traces_are_persisted_when_the_phase_ends(
    ledger: SqliteLedger, clock: ManualClock
) -> None:
    allowance = RecallAllowance(ledger, clock=clock)
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        async with permit.attempt(AttemptKind.BASE, strategy="baseline", fingerprint="f1"):
            clock.advance(0.5)
        with permit.attempt_sync(AttemptKind.DELTA):
            pass
        assert await ledger.attempts("r") == []  # buffered until the phase ends
    traces = await ledger.attempts("r")
    assert [(t.slot, t.kind, t.outcome) for t in traces] == [
        (1, "base", AttemptOutcome.OK), (2, "delta", AttemptOutcome.OK)
    ]
    assert traces[0].elapsed_s == 0.5 and traces[0].fingerprint == "f1"


async def test_attempt_still_running_at_phase_end_is_recorded_twice(
    ledger: SqliteLedger, clock: ManualClock
) -> None:
    allowance = RecallAllowance(ledger, clock=clock)
    release = anyio.Event()
    async with anyio.create_task_group() as outer:
        async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
            started = anyio.Event()

            async def slow() -> None:
                async with permit.attempt():
                    started.set()
                    await release.wait()

            outer.start_soon(slow)
            await started.wait()
        (trace,) = await ledger.attempts("r")
        assert trace.outcome is AttemptOutcome.IN_FLIGHT
        release.set()
    (trace,) = await ledger.attempts("r")
    assert trace.outcome is AttemptOutcome.OK
    assert (await ledger.usage("r")).executed == 1  # replaced, not counted twice


async def test_a_new_allowance_resumes_by_reserving_again(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path) as ledger:
        async with RecallAllowance(ledger, clock=clock).round("r", RoundKind.AUTOMATIC) as old:
            pass
    clock.advance(3.0)
    async with SqliteLedger(path) as ledger:  # a "restarted process": no memory of the permit
        (reservation,) = await ledger.reservations("r")
        assert (reservation.first_slot, reservation.slots) == (1, 2)
        assert old.closed
        async with RecallAllowance(ledger, clock=clock).round(
            "r", RoundKind.DELIBERATE, slots=4
        ) as permit:
            assert (permit.round_index, permit.first_slot, permit.slots) == (2, 3, 2)
            assert permit.seconds_left() == 7.0
        with pytest.raises(RecallBudgetExceeded) as info:
            async with RecallAllowance(ledger, clock=clock).round("r", RoundKind.AUTOMATIC):
                pass
        assert info.value.refusal.reason is RefusalReason.ROUNDS


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_asyncio_spawn_primitives_share_the_permit(
    ledger: SqliteLedger, clock: ManualClock
) -> None:
    allowance = RecallAllowance(ledger, clock=clock, policy=_wide())
    async with allowance.round("r", RoundKind.DELIBERATE, slots=8) as permit:

        async def probe() -> object:
            return current_permit()

        task = asyncio.create_task(probe())
        gathered = await asyncio.gather(probe(), probe())
        threaded = await asyncio.to_thread(current_permit)
        loop = asyncio.get_running_loop()
        bare = await loop.run_in_executor(None, current_permit)  # does NOT copy the context
        ctx = contextvars.copy_context()
        copied = await loop.run_in_executor(None, ctx.run, current_permit)
        assert await task is permit
        assert gathered == [permit, permit]
        assert threaded is permit and copied is permit
        assert bare is None


@pytest.mark.trio
async def test_trio_spawn_primitives_share_the_permit(tmp_path: Path) -> None:
    async with SqliteLedger(tmp_path / "l.db") as ledger:
        allowance = RecallAllowance(ledger, clock=ManualClock())
        async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
            seen: list[object] = []

            async def probe() -> None:
                seen.append(current_permit())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe)
            seen.append(await trio.to_thread.run_sync(current_permit))
            assert seen == [permit, permit]


def _wide() -> AllowancePolicy:
    return AllowancePolicy(max_searches=8, automatic_slots=2)


async def test_many_tasks_share_one_ledger_connection(
    ledger: SqliteLedger, clock: ManualClock
) -> None:
    # Transactions of concurrent tasks on one connection must not interleave
    # ("cannot start a transaction within a transaction").
    allowance = RecallAllowance(ledger, clock=clock)

    async def run(i: int) -> None:
        async with allowance.round(f"run-{i}", RoundKind.AUTOMATIC) as permit:
            async with permit.attempt(AttemptKind.BASE):
                await anyio.sleep(0)
        await ledger.usage(f"run-{i}")

    async with anyio.create_task_group() as tg:
        for i in range(40):
            tg.start_soon(run, i)
    for i in range(40):
        usage = await ledger.usage(f"run-{i}")
        assert (usage.rounds, usage.reserved, usage.executed) == (1, 2, 1)


async def test_worker_thread_attempt_outliving_its_phase_writes_its_final_trace(
    ledger: SqliteLedger, clock: ManualClock
) -> None:
    allowance = RecallAllowance(ledger, clock=clock)
    started, release = threading.Event(), threading.Event()
    late: list[object] = []

    def tool() -> None:
        permit = current_permit()
        assert permit is not None
        with permit.attempt_sync():
            started.set()
            release.wait()
        try:  # after the phase: refused, and the refusal is written too
            with permit.attempt_sync():
                late.append("searched")
        except RecallBudgetExceeded as exc:
            late.append(exc.refusal.reason)

    async with anyio.create_task_group() as outer:
        async with allowance.round("r", RoundKind.AUTOMATIC):
            outer.start_soon(anyio.to_thread.run_sync, tool)
            await anyio.to_thread.run_sync(started.wait)
        (trace,) = await ledger.attempts("r")
        assert trace.outcome is AttemptOutcome.IN_FLIGHT
        release.set()
    (trace,) = await ledger.attempts("r")
    assert trace.outcome is AttemptOutcome.OK
    assert late == [RefusalReason.CLOSED]
    assert [r.reason for r in await ledger.refusals("r")] == [RefusalReason.CLOSED]


@pytest.mark.parametrize("other", ["asyncio", "trio"])
async def test_an_attempt_on_another_event_loop_that_outlives_its_phase_is_owed(
    ledger: SqliteLedger, clock: ManualClock, other: str
) -> None:
    # The permit handed to an event loop of its own in another thread (either library): the
    # ledger belongs to the allowance's loop, so what the late attempt recorded is owed to the
    # allowance, never written from the other loop, and the attempt's body ends as it ended.
    allowance = RecallAllowance(ledger, clock=clock)
    started, release = threading.Event(), threading.Event()
    ended: list[object] = []

    def elsewhere(permit: object) -> None:
        async def body() -> None:
            async with permit.attempt():  # type: ignore[attr-defined]
                started.set()
                await anyio.to_thread.run_sync(release.wait)
            ended.append("returned")

        anyio.run(body, backend=other)

    async with anyio.create_task_group() as outer:
        async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
            outer.start_soon(anyio.to_thread.run_sync, elsewhere, permit)
            await anyio.to_thread.run_sync(started.wait)
        release.set()
    assert ended == ["returned"]
    await allowance.flush()
    (trace,) = await ledger.attempts("r")
    assert trace.outcome is AttemptOutcome.OK
