"""A round whose end finds the ledger locked (or unreachable, or full) still answers: its
traces and call outcomes stay owed by the allowance, and its next round writes them with its
own (so does ``allowance.flush()``, and the hooks when they close). A late attempt's trace is
owed the same way. A replay then finds the call's outcome.

A real SQLite ledger whose write lock another connection holds while the search runs; both
loops.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from plugin import Evidence, ManualClock, RecallAllowance, RecallBudgetExceeded, RoundKind
from plugin.control import SqliteLedger
from plugin.errors import (
    InvalidArgumentError,
    LedgerClosedError,
    LedgerCorruptError,
    LedgerLockedError,
)
from runtime_hooks import RecallConfig, ToolCall, ledgers, open_hooks

from ._calls_env import MEMORIES, WALL, Counting, P, S, recall_hooks

pytestmark = pytest.mark.anyio

CALL = ToolCall(call_id="c1", arguments={"query": "cutover"})


class Locking(Counting):
    """A retriever that takes the ledger's write lock (another connection) as it first
    searches; ``release()`` lets it go."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.holder: sqlite3.Connection | None = None

    async def search(self, request: Any) -> list[Evidence]:
        self.searches += 1
        if self.searches == 1:
            self.holder = sqlite3.connect(self.path, isolation_level=None)
            self.holder.execute("BEGIN IMMEDIATE")
        return list(MEMORIES.values())

    def release(self) -> None:
        if self.holder is not None:
            self.holder.execute("COMMIT")
            self.holder.close()
            self.holder = None


async def test_a_locked_round_end_still_answers_and_writes_its_records_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, clock = tmp_path / "ledger.sqlite3", ManualClock(wall=WALL, monotonic=1.0)
    retriever = Locking(path)
    async with SqliteLedger(path, timeout=0.05) as ledger:
        hooks = recall_hooks(ledger, clock, retriever)
        with caplog.at_level(logging.WARNING, logger="recallbound.control"):
            (answer,) = await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
        assert (answer.status, answer.slot) == ("ok", 1)
        assert [e.id for e in answer.evidence] == sorted(MEMORIES)
        assert "round.traces_deferred" in caplog.text
        retriever.release()
        usage = await ledger.usage("r")
        assert (usage.reserved, usage.executed) == (1, 0)  # the trace is owed, not lost
        # the next reservation (any run) writes what is owed first
        await hooks.dispatch([ToolCall(call_id="c2", arguments={"query": "x"})],
                             run_id="other", scope=S, principal=P)
        assert (await ledger.usage("r")).executed == 1
    async with SqliteLedger(path) as reopened:  # another process replays the call
        fresh = Counting()
        (again,) = await recall_hooks(reopened, clock, fresh).dispatch(
            [CALL], run_id="r", scope=S, principal=P)
        assert (again.status, again.slot, fresh.searches) == ("ok", 1, 0)
        assert [e.id for e in again.evidence] == sorted(MEMORIES)


async def test_closing_the_hooks_writes_what_is_owed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, clock = tmp_path / "ledger.sqlite3", ManualClock(wall=WALL, monotonic=1.0)
    retriever = Locking(path)
    monkeypatch.setattr(ledgers, "SqliteLedger", functools.partial(SqliteLedger, timeout=0.05))
    config = RecallConfig(ledger_path=str(path))
    async with open_hooks(config, clock=clock, retriever=retriever.retriever) as hooks:
        (answer,) = await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
        assert answer.status == "ok"
        retriever.release()
    async with SqliteLedger(path) as reopened:
        assert (await reopened.usage("r")).executed == 1
        (record,) = await reopened.recorded_calls("r", ["c1"])
        assert (record.status, record.slot) == ("ok", 1)


async def _round_ending_locked(allowance: RecallAllowance, holder: sqlite3.Connection) -> None:
    """One round of run "r" with one attempt, whose end finds the ledger locked by
    ``holder``: its records are owed."""
    async with allowance.round("r", RoundKind.DELIBERATE, slots=1) as permit:
        async with permit.attempt():
            holder.execute("BEGIN IMMEDIATE")


async def test_allowance_flush_writes_owed_traces_and_raises_while_still_locked(
    tmp_path: Path,
) -> None:
    path, clock = tmp_path / "ledger.sqlite3", ManualClock(wall=WALL, monotonic=1.0)
    async with SqliteLedger(path, timeout=0.05) as ledger:
        allowance = RecallAllowance(ledger, clock=clock)
        holder = sqlite3.connect(path, isolation_level=None)
        await _round_ending_locked(allowance, holder)
        with pytest.raises(LedgerLockedError):
            await allowance.flush()
        holder.execute("COMMIT")
        holder.close()
        await allowance.flush()
        assert (await ledger.usage("r")).executed == 1
        await allowance.flush()  # nothing owed: nothing written twice
        assert len(await ledger.attempts("r")) == 1


@pytest.mark.parametrize("error", [LedgerClosedError("closed"), LedgerCorruptError("bad")])
async def test_a_ledger_that_cannot_recover_still_fails_the_round(
    tmp_path: Path, error: Exception
) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    async with SqliteLedger(tmp_path / "ledger.sqlite3") as ledger:
        allowance = RecallAllowance(ledger, clock=clock)

        async def broken(*args: Any, **kwargs: Any) -> None:
            raise error

        async def one_attempt() -> None:
            async with allowance.round("r", RoundKind.DELIBERATE, slots=1) as permit:
                ledger.record = broken  # type: ignore[method-assign]
                async with permit.attempt():
                    pass

        with pytest.raises(type(error)):
            await one_attempt()



async def test_two_flushes_at_once_while_locked_lose_nothing(tmp_path: Path) -> None:
    path, clock = tmp_path / "ledger.sqlite3", ManualClock(wall=WALL, monotonic=1.0)
    async with SqliteLedger(path, timeout=0.05) as ledger:
        allowance = RecallAllowance(ledger, clock=clock)
        holder = sqlite3.connect(path, isolation_level=None)
        await _round_ending_locked(allowance, holder)
        failed: list[str] = []

        async def flush() -> None:
            try:
                await allowance.flush()
            except LedgerLockedError:
                failed.append("locked")

        async with anyio.create_task_group() as tg:
            tg.start_soon(flush)
            tg.start_soon(flush)
        assert failed == ["locked", "locked"]  # neither says written what was not
        holder.execute("COMMIT")
        holder.close()
        await allowance.flush()
        assert [a.outcome.value for a in await ledger.attempts("r")] == ["ok"]


async def test_a_late_attempt_ending_while_locked_keeps_its_trace_owed(tmp_path: Path) -> None:
    path, clock = tmp_path / "ledger.sqlite3", ManualClock(wall=WALL, monotonic=1.0)
    async with SqliteLedger(path, timeout=0.05) as ledger:
        allowance = RecallAllowance(ledger, clock=clock)
        entered, finish = anyio.Event(), anyio.Event()
        holder = sqlite3.connect(path, isolation_level=None)

        async def late(permit: Any) -> None:  # its work stands: no error reaches it
            async with permit.attempt():
                entered.set()
                await finish.wait()

        async with anyio.create_task_group() as tg:
            async with allowance.round("r", RoundKind.DELIBERATE, slots=2) as permit:
                tg.start_soon(late, permit)
                await entered.wait()
            holder.execute("BEGIN IMMEDIATE")  # the phase wrote in_flight; now it is locked
            finish.set()
        holder.execute("COMMIT")
        holder.close()
        assert [a.outcome.value for a in await ledger.attempts("r")] == ["in_flight"]
        await allowance.flush()
        assert [a.outcome.value for a in await ledger.attempts("r")] == ["ok"]


class _CountedRecords:
    """A ledger that counts its record writes."""

    def __init__(self, inner: SqliteLedger) -> None:
        self.inner, self.writes = inner, 0

    async def record(self, *args: Any, **kwargs: Any) -> None:
        self.writes += 1
        await self.inner.record(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_later_round_writes_what_is_owed_with_its_own_and_never_waits_for_it(
    tmp_path: Path,
) -> None:
    path, clock = tmp_path / "ledger.sqlite3", ManualClock(wall=WALL, monotonic=1.0)
    async with SqliteLedger(path, timeout=0.05) as inner:
        ledger = _CountedRecords(inner)
        allowance = RecallAllowance(ledger, clock=clock)
        holder = sqlite3.connect(path, isolation_level=None)
        await _round_ending_locked(allowance, holder)
        holder.execute("COMMIT")
        holder.close()
        before = ledger.writes
        async with allowance.round("other", RoundKind.DELIBERATE, slots=1) as later:
            assert ledger.writes == before  # taking the records over wrote nothing
            async with later.attempt():
                pass
        assert ledger.writes == before + 1  # one write: its trace and the owed one
        assert len(await inner.attempts("r")) == 1 and len(await inner.attempts("other")) == 1


class _Unstorable:
    """A ledger that can never store run "bad"'s records (a non-passing failure)."""

    def __init__(self, inner: SqliteLedger) -> None:
        self.inner = inner

    async def record(self, attempts: Any, refusals: Any, *args: Any, **kwargs: Any) -> None:
        if any(trace.run_id == "bad" for trace in attempts):
            raise LedgerCorruptError("a value this ledger cannot store")
        await self.inner.record(attempts, refusals, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_records_no_write_can_store_never_fail_later_rounds(tmp_path: Path) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    async with SqliteLedger(tmp_path / "ledger.sqlite3") as inner:
        allowance = RecallAllowance(_Unstorable(inner), clock=clock)

        async def one_round(run_id: str) -> None:
            async with allowance.round(run_id, RoundKind.DELIBERATE, slots=1) as permit:
                async with permit.attempt():
                    pass

        with pytest.raises(LedgerCorruptError):
            await one_round("bad")
        for run_id in ("b", "c"):  # they do not carry "bad"'s records along
            await one_round(run_id)
            assert len(await inner.attempts(run_id)) == 1
        await allowance.flush()  # nothing is owed


@pytest.mark.parametrize("fingerprint", ["\ud800", "a\x00b", "x" * 600])
async def test_an_attempt_refuses_a_fingerprint_no_ledger_can_store(
    tmp_path: Path, fingerprint: str
) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    async with SqliteLedger(tmp_path / "ledger.sqlite3") as ledger:
        allowance = RecallAllowance(ledger, clock=clock)
        async with allowance.round("r", RoundKind.DELIBERATE, slots=1) as permit:
            with pytest.raises(InvalidArgumentError):
                permit.attempt(fingerprint=fingerprint)
            assert permit.remaining == 1


async def _offload(how: str, fn: Callable[[], None]) -> None:
    """``fn`` in a worker thread that copies the context, by ``how``."""
    import asyncio
    import contextvars

    import sniffio

    if how == "anyio":
        await anyio.to_thread.run_sync(fn)
    elif sniffio.current_async_library() != "asyncio":
        import trio

        await trio.to_thread.run_sync(fn)
    elif how == "native":
        await asyncio.to_thread(fn)
    else:
        await asyncio.get_running_loop().run_in_executor(
            None, contextvars.copy_context().run, fn)


@pytest.mark.parametrize("how", ["anyio", "native", "executor"])
async def test_what_a_thread_records_after_the_phase_is_owed_and_written(
    tmp_path: Path, how: str
) -> None:
    """A worker thread anyio cannot reach the loop from (``asyncio.to_thread``,
    ``run_in_executor``, trio's own) leaves its late records owed to the allowance: its flush
    (or next round) writes them; they never stay buffered for good."""
    import contextvars
    import threading

    from plugin import current_permit

    clock = ManualClock(wall=WALL, monotonic=5.0)
    async with SqliteLedger(tmp_path / "ledger.db") as ledger:
        allowance = RecallAllowance(ledger, clock=clock)
        started, go = threading.Event(), threading.Event()

        def late_attempt() -> None:
            permit = current_permit()
            assert permit is not None
            with permit.attempt_sync():
                started.set()
                go.wait(5)

        async with anyio.create_task_group() as group:
            async with allowance.round("r", RoundKind.DELIBERATE, slots=1):
                group.start_soon(_offload, how, late_attempt)
                await anyio.to_thread.run_sync(started.wait)
                context = contextvars.copy_context()
            go.set()
        refused: list[str] = []

        def refused_attempt() -> None:
            try:
                with context.run(current_permit).attempt_sync():  # type: ignore[union-attr]
                    pass
            except RecallBudgetExceeded as exc:
                refused.append(exc.refusal.reason.value)

        await _offload(how, refused_attempt)
        await allowance.flush()
        outcomes = [trace.outcome.value for trace in await ledger.attempts("r")]
        usage = await ledger.usage("r")
    assert (outcomes, refused, usage.refused) == (["ok"], ["closed"], 1)


async def test_records_owed_to_a_ledger_locked_for_good_stay_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Legacy mode opens rounds whatever the ledger does: with its writes failing for good,
    what the allowance owes is held up to a bound, the oldest records going first, logged."""
    from plugin.control import allowance as allowance_module

    monkeypatch.setattr(allowance_module, "MAX_OWED_RECORDS", 2)
    clock = ManualClock(wall=WALL, monotonic=1.0)
    async with SqliteLedger(tmp_path / "ledger.sqlite3") as ledger:
        allowance = RecallAllowance.legacy(ledger, clock=clock)
        write = ledger.record

        async def locked(*args: Any, **kwargs: Any) -> None:
            raise LedgerLockedError("locked")

        ledger.record = locked  # type: ignore[method-assign]
        for _ in range(5):
            async with allowance.round("r", RoundKind.DELIBERATE, slots=1) as permit:
                async with permit.attempt():
                    pass
        ledger.record = write  # type: ignore[method-assign]
        await allowance.flush()
        written = len(await ledger.attempts("r"))
    assert 1 <= written <= 3  # the bound, and the newest permit's own record
    assert "round.traces_dropped" in caplog.text
