"""Group commit: concurrent round reservations share one durable transaction, exactly.

Reservations that arrive while a transaction is in flight are committed together in the next
one (one fsync), each checked and reserved on its own (SQLite: a savepoint each; PostgreSQL:
one statement per wave of distinct runs); a lone reservation never waits for a batch; one
that fails, fails alone. Every test runs on both loops against each kind of :data:`KINDS`:
a real SQLite file, and PostgreSQL judged by the callers' times and by the server's clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from plugin import AllowancePolicy, PostgresLedger, RoundKind, SqliteLedger
from plugin.control import (
    AttemptOutcome,
    AttemptTrace,
    BudgetRefusal,
    RefusalReason,
    Reservation,
    Validity,
)

from ._pg import DSN, fresh_schema

pytestmark = pytest.mark.anyio

WALL = 1_700_000_000.0
DELIB = RoundKind.DELIBERATE


KINDS = ["sqlite", "postgres-caller", "postgres-server"]
"""Every group-committing ledger (PostgreSQL by whose clock judges)."""

Ledger = SqliteLedger | PostgresLedger


@pytest.fixture(params=KINDS)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Ledger]]:
    """Unopened ledgers of one kind over one store."""
    kind = str(request.param)
    if kind == "sqlite":
        yield lambda: SqliteLedger(tmp_path / "l.db")
        return
    with fresh_schema("group") as schema:
        source = "caller" if kind == "postgres-caller" else "server"
        yield lambda: PostgresLedger(DSN, schema=schema, time_source=source)  # type: ignore[arg-type]


class _Spy:
    """Records the size of every batch the ledger commits (its reservations, or with
    ``writes``, its trace and retain writes)."""

    def __init__(self, ledger: Ledger, *, writes: bool = False) -> None:
        self.sizes: list[int] = []
        group = ledger._writes if writes else ledger._group
        assert group is not None
        inner = group.run

        async def spy(batch: Sequence[Any]) -> Any:
            self.sizes.append(len(batch))
            return await inner(batch)

        group.run = spy


async def _many(ledger: Ledger, requests: list[tuple[str, int, AllowancePolicy]]) -> list[
    Reservation | BudgetRefusal | BaseException
]:
    outcomes: list[Reservation | BudgetRefusal | BaseException] = [None] * len(requests)  # type: ignore[list-item]

    async def one(i: int, run_id: str, slots: int, policy: AllowancePolicy) -> None:
        try:
            outcomes[i] = await ledger.reserve(run_id, DELIB, slots, policy, WALL)
        except Exception as exc:
            outcomes[i] = exc

    async with anyio.create_task_group() as tg:
        for i, (run_id, slots, policy) in enumerate(requests):
            tg.start_soon(one, i, run_id, slots, policy)
    return outcomes


async def test_concurrent_reservations_share_transactions(make: Callable[[], Ledger]) -> None:
    async with make() as ledger:
        spy = _Spy(ledger)
        outcomes = await _many(ledger, [(f"run-{i}", 2, AllowancePolicy()) for i in range(200)])
        assert all(isinstance(o, Reservation) and o.slots == 2 for o in outcomes)
        assert sum(spy.sizes) == 200
        assert max(spy.sizes) > 1  # they queued behind the first and went in together
        assert len(spy.sizes) < 200
        for i in range(200):
            usage = await ledger.usage(f"run-{i}")
            assert (usage.rounds, usage.reserved) == (1, 2)


async def test_a_lone_reservation_is_its_own_batch(make: Callable[[], Ledger]) -> None:
    async with make() as ledger:
        spy = _Spy(ledger)
        for i in range(5):
            await ledger.reserve(f"run-{i}", DELIB, 1, AllowancePolicy(), WALL)
        assert spy.sizes == [1, 1, 1, 1, 1]


async def test_one_run_in_a_batch_is_checked_and_reserved_exactly(
    make: Callable[[], Ledger],
) -> None:
    policy = AllowancePolicy(max_searches=4, max_rounds=10)
    async with make() as ledger:
        spy = _Spy(ledger)
        outcomes = await _many(ledger, [("run", 1, policy)] * 10 + [("other", 3, policy)])
        granted = [o for o in outcomes[:10] if isinstance(o, Reservation)]
        refused = [o for o in outcomes[:10] if isinstance(o, BudgetRefusal)]
        assert sorted(r.first_slot for r in granted) == [1, 2, 3, 4]
        assert [r.reason for r in refused] == [RefusalReason.SLOTS] * 6
        other = outcomes[10]
        assert isinstance(other, Reservation) and other.slots == 3  # refusals fail no one else
        assert max(spy.sizes) > 1
        usage = await ledger.usage("run")
        assert (usage.rounds, usage.reserved, usage.refused) == (4, 4, 6)


class _ClockStopped(BaseException):
    """Not an Exception: what a caller's clock may raise (as KeyboardInterrupt is)."""


@pytest.mark.parametrize("error", [RuntimeError, _ClockStopped])
async def test_a_failing_clock_fails_its_request_alone(
    make: Callable[[], Ledger], error: type[BaseException]
) -> None:
    def broken_clock() -> float:
        raise error("this caller's clock is broken")

    async with make() as ledger:
        spy = _Spy(ledger)
        outcomes: dict[str, object] = {}

        async def one(run_id: str, floor: Any) -> None:
            try:
                outcomes[run_id] = await ledger.reserve(run_id, DELIB, 1, AllowancePolicy(),
                                                        WALL, floor=floor)
            except error as exc:
                outcomes[run_id] = exc

        async with anyio.create_task_group() as tg:
            for i in range(30):
                tg.start_soon(one, f"run-{i}", broken_clock if i % 3 == 0 else WALL - 1)
        assert max(spy.sizes) > 1
        for i in range(30):
            if i % 3 == 0:
                assert isinstance(outcomes[f"run-{i}"], error)
                assert (await ledger.usage(f"run-{i}")).rounds == 0
            else:
                assert isinstance(outcomes[f"run-{i}"], Reservation)
                assert (await ledger.usage(f"run-{i}")).reserved == 1


async def test_a_failing_statement_fails_its_request_alone(
    make: Callable[[], Ledger],
) -> None:
    async with make() as ledger:
        spy = _Spy(ledger)
        # 2**63 slots: beyond a 64-bit integer, the one request's statement fails.
        requests = [(f"run-{i}", 2**63 if i == 7 else 2, AllowancePolicy()) for i in range(20)]
        outcomes = await _many(ledger, requests)
        assert max(spy.sizes) > 1
        for i, outcome in enumerate(outcomes):
            usage = await ledger.usage(f"run-{i}")
            if i == 7:
                assert isinstance(outcome, Exception) and usage.rounds == 0
            else:
                assert isinstance(outcome, Reservation) and outcome.slots == 2
                assert (usage.rounds, usage.reserved) == (1, 2)


async def test_cancelled_waiters_never_lose_or_double_count_a_reservation(
    make: Callable[[], Ledger],
) -> None:
    rng = random.Random(7)
    runs = 150
    granted: dict[str, Reservation] = {}
    async with make() as ledger:

        async def one(run_id: str, scope: anyio.CancelScope) -> None:
            with scope:
                result = await ledger.reserve(run_id, DELIB, 2, AllowancePolicy(), WALL)
                assert isinstance(result, Reservation)
                granted[run_id] = result

        scopes = [anyio.CancelScope() for _ in range(runs)]
        async with anyio.create_task_group() as tg:
            for i in range(runs):
                tg.start_soon(one, f"run-{i}", scopes[i])
            for i in rng.sample(range(runs), runs // 2):
                for _ in range(rng.randrange(4)):
                    await anyio.sleep(0)
                scopes[i].cancel()
        for i in range(runs):
            run_id = f"run-{i}"
            usage = await ledger.usage(run_id)
            if run_id in granted:
                assert (usage.rounds, usage.reserved) == (1, 2)
                assert granted[run_id].first_slot == 1
            else:  # cancelled: never ran, or committed once and not seen (no refund, no double)
                assert (usage.rounds, usage.reserved) in {(0, 0), (1, 2)}
        assert len(granted) >= runs // 2


async def test_a_closed_ledger_refuses_before_joining_a_batch(
    make: Callable[[], Ledger],
) -> None:
    from plugin.errors import LedgerClosedError

    ledger = make()
    with pytest.raises(LedgerClosedError):
        await ledger.reserve("run", DELIB, 1, AllowancePolicy(), WALL)


def test_group_commit_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        SqliteLedger(tmp_path / "l.db", group_commit="no")  # type: ignore[arg-type]


def _attempt(run_id: str, slot: int) -> AttemptTrace:
    return AttemptTrace(
        attempt_id=f"{run_id}-{slot}", run_id=run_id, round_index=1, slot=slot,
        kind="deliberate", outcome=AttemptOutcome.OK, started_wall=WALL, elapsed_s=0.1,
    )


async def test_concurrent_trace_writes_share_transactions_and_fail_alone(
    make: Callable[[], Ledger],
) -> None:
    async with make() as ledger:
        sizes = _Spy(ledger, writes=True).sizes
        failures: dict[int, Exception] = {}

        async def one(i: int) -> None:
            # Run 7's trace holds slot 2**63: beyond a 64-bit integer, its write fails.
            try:
                await ledger.record([_attempt(f"run-{i}", 2**63 if i == 7 else 1)], [])
            except Exception as exc:
                failures[i] = exc

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(one, i)
        assert sum(sizes) == 40 and max(sizes) > 1 and len(sizes) < 40
        assert list(failures) == [7]
        for i in range(40):
            assert len(await ledger.attempts(f"run-{i}")) == (0 if i == 7 else 1)


async def test_concurrent_retains_of_one_run_from_two_ledgers_keep_its_limit(
    make: Callable[[], Ledger],
) -> None:
    # Two ledger objects on one store (two connections, two pools): their batches race.
    async with make() as first, make() as second:
        sizes = _Spy(first, writes=True).sizes

        async def one(ledger: Ledger, i: int) -> None:
            await ledger.retain(f"run-{i % 4}", [f"m{i}", f"m{i + 1}", "shared"], limit=5)

        async with anyio.create_task_group() as tg:
            for i in range(60):
                tg.start_soon(one, first if i % 2 else second, i)
        assert max(sizes) > 1
        for run in range(4):
            answers = await first.take_validations(
                f"run-{run}", [f"m{i}" for i in range(62)] + ["shared"], limit=100)
            kept = [i for i, validity in answers.items() if validity is not Validity.NOT_RETAINED]
            assert len(kept) == 5, (run, kept)
