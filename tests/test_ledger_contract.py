"""The contract every :class:`~plugin.control.ledger.Ledger` must keep, on asyncio and trio.

One suite for the interface (one contract suite per interface): every test that
takes the ``ledger`` (an opened ledger) or ``open_ledger`` (a factory of unopened ledgers over
one store) fixture runs against each kind in :data:`LEDGER_KINDS`: SQLite (a file),
PostgreSQL (a schema of its own on the test server, dropped afterwards; judged by the caller's
explicit times; directly, and through PgBouncer in transaction mode, which proves that no
session state is relied on; and judged by the server's clock, the production path, through
``ServerClockLedger``) and the in-memory test double. The tests near the end that name
``SqliteLedger`` check failures only a file-backed ledger has (missing folder, foreign or
damaged file, a lock held by another connection); tests/test_postgres_ledger.py has the
PostgreSQL-only ones.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from plugin.control import (
    AllowancePolicy,
    AttemptOutcome,
    AttemptTrace,
    Ledger,
    ManualClock,
    PostgresLedger,
    RecallAllowance,
    RecallBudgetExceeded,
    RefusalReason,
    RefusalRecord,
    Reservation,
    RoundKind,
    SqliteLedger,
    Usage,
    Validity,
    current_permit,
)
from plugin.control.ledger import CallRecord, RunOpening
from plugin.control.refusal import BudgetRefusal
from plugin.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LedgerClosedError,
    LedgerCorruptError,
    LedgerError,
    LedgerLockedError,
    LedgerPathError,
    LedgerUnavailableError,
    RecallboundError,
    RunIdentityError,
)

from ._fakes import MemoryLedger, MemoryStore
from ._pg import DSN, SERVER_CLOCK_SHIFT, ServerClockLedger, fresh_schema, pooled_dsn

pytestmark = pytest.mark.anyio

WALL = 1_700_000_000.0
POLICY = AllowancePolicy()  # 4 searches, 2 rounds, 10 s, 2 automatic slots
AUTO, DELIB = RoundKind.AUTOMATIC, RoundKind.DELIBERATE

LEDGER_KINDS = ["sqlite", "postgres", "postgres-pgbouncer", "postgres-server-clock", "memory"]
"""Every ledger implementation the contract runs against."""


def _make_ledger(kind: str, store: Any, **options: Any) -> Any:
    """An unopened ledger of ``kind`` over the test's store (the same store on every call)."""
    if kind == "sqlite":
        return SqliteLedger(store / "ledger.sqlite3", **options)
    if kind == "postgres":
        # The contract's explicit times are the caller's: judge by them, not the server clock.
        return PostgresLedger(DSN, schema=store, time_source="caller", **options)
    if kind == "postgres-server-clock":
        # The production path: judged by the server's clock, driven through the floor.
        return ServerClockLedger(PostgresLedger(DSN, schema=store, **options))
    if kind == "postgres-pgbouncer":
        # Through a pooler in transaction mode: no session state may be relied on.
        return PostgresLedger(pooled_dsn(), schema=store, time_source="caller", **options)
    if kind == "memory":
        return MemoryLedger.over(store)
    raise AssertionError(f"unknown ledger kind {kind!r}")


@pytest.fixture(params=LEDGER_KINDS)
def ledger_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(ledger_kind: str, tmp_path: Path) -> Iterator[Any]:
    """What the test's ledgers share: a folder, a PostgreSQL schema, or a MemoryStore."""
    if ledger_kind.startswith("postgres"):
        with fresh_schema("contract") as schema:
            yield schema
    elif ledger_kind == "memory":
        yield MemoryStore()
    else:
        yield tmp_path


@pytest.fixture
def open_ledger(ledger_kind: str, store: Any) -> Callable[..., Any]:
    """Make unopened ledgers over one store: ``async with open_ledger() as ledger``."""
    return lambda **options: _make_ledger(ledger_kind, store, **options)


@pytest.fixture
async def ledger(
    anyio_backend: object, open_ledger: Callable[..., Any]
) -> AsyncIterator[Ledger]:
    async with open_ledger() as opened:
        yield opened


def _granted(result: Reservation | BudgetRefusal) -> Reservation:
    assert isinstance(result, Reservation), result
    return result


def _refused(result: Reservation | BudgetRefusal, reason: RefusalReason) -> BudgetRefusal:
    assert isinstance(result, BudgetRefusal), result
    assert result.reason is reason
    return result


def _trace(
    attempt_id: str,
    run_id: str,
    slot: int,
    *,
    round_index: int = 1,
    outcome: AttemptOutcome = AttemptOutcome.OK,
    legacy: bool = False,
    elapsed_s: float | None = 0.25,
) -> AttemptTrace:
    return AttemptTrace(
        attempt_id=attempt_id,
        run_id=run_id,
        round_index=round_index,
        slot=slot,
        kind="deliberate",
        outcome=outcome,
        started_wall=WALL + slot,
        elapsed_s=elapsed_s,
        strategy="baseline",
        fingerprint="f" * 64,
        legacy=legacy,
    )


# -- rounds and deadline ---------------------------------------------------------------------


async def test_first_round_opens_the_run_and_fixes_its_deadline(ledger: Ledger) -> None:
    result = _granted(await ledger.reserve("run", AUTO, 2, POLICY, WALL))
    assert result == Reservation(
        run_id="run", round_index=1, kind=AUTO, requested=2, first_slot=1, slots=2,
        reserved=2, executed=0, deadline_wall=WALL + 10.0, opened_wall=WALL, reserved_wall=WALL,
    )
    assert await ledger.usage("run") == Usage(
        run_id="run", rounds=1, reserved=2, executed=0, refused=0, deadline_wall=WALL + 10.0
    )


async def test_second_round_keeps_the_original_deadline(ledger: Ledger) -> None:
    _granted(await ledger.reserve("run", AUTO, 2, POLICY, WALL))
    second = _granted(await ledger.reserve("run", DELIB, 2, POLICY, WALL + 7.5))
    assert (second.round_index, second.first_slot, second.slots) == (2, 3, 2)
    assert second.deadline_wall == WALL + 10.0
    assert second.opened_wall == WALL
    assert second.reserved_wall == WALL + 7.5
    usage = await ledger.usage("run")
    assert (usage.rounds, usage.reserved, usage.deadline_wall) == (2, 4, WALL + 10.0)


async def test_reservation_times_are_floats(ledger: Ledger) -> None:
    # Reservation's wall times are declared float; a later round must not hand back ints.
    first = _granted(await ledger.reserve("run", AUTO, 1, POLICY, WALL))
    second = _granted(await ledger.reserve("run", AUTO, 1, POLICY, WALL + 1.0))
    for reservation in (first, second, *(await ledger.reservations("run"))):
        for name in ("deadline_wall", "opened_wall", "reserved_wall"):
            assert type(getattr(reservation, name)) is float, (name, reservation)
    assert type((await ledger.usage("run")).deadline_wall) is float


async def test_rounds_beyond_max_rounds_are_refused(ledger: Ledger) -> None:
    policy = AllowancePolicy(max_searches=10, max_rounds=2)
    _granted(await ledger.reserve("run", AUTO, 2, policy, WALL))
    _granted(await ledger.reserve("run", AUTO, 2, policy, WALL + 1))
    refused = await ledger.reserve("run", DELIB, 1, policy, WALL + 2)
    refusal = _refused(refused, RefusalReason.ROUNDS)
    assert (refusal.run_id, refusal.reserved, refusal.executed) == ("run", 4, 0)
    usage = await ledger.usage("run")
    assert (usage.rounds, usage.reserved, usage.refused) == (2, 4, 1)


async def test_slots_run_out_with_a_partial_grant(ledger: Ledger) -> None:
    policy = AllowancePolicy(max_searches=4, max_rounds=5)
    first = _granted(await ledger.reserve("run", DELIB, 3, policy, WALL))
    assert (first.first_slot, first.slots, first.reserved) == (1, 3, 3)
    partial = _granted(await ledger.reserve("run", DELIB, 3, policy, WALL + 1))
    assert (partial.requested, partial.first_slot, partial.slots, partial.reserved) == (3, 4, 1, 4)
    refusal = _refused(await ledger.reserve("run", DELIB, 1, policy, WALL + 2), RefusalReason.SLOTS)
    assert refusal.reserved == 4
    usage = await ledger.usage("run")
    assert (usage.rounds, usage.reserved, usage.refused) == (2, 4, 1)


async def test_first_round_asking_more_than_the_run_may_gets_all_of_it(ledger: Ledger) -> None:
    first = _granted(await ledger.reserve("run", DELIB, 9, POLICY, WALL))
    assert (first.requested, first.first_slot, first.slots, first.reserved) == (9, 1, 4, 4)
    _refused(await ledger.reserve("run", DELIB, 1, POLICY, WALL), RefusalReason.SLOTS)


async def test_slots_are_numbered_continuously_across_rounds(ledger: Ledger) -> None:
    policy = AllowancePolicy(max_searches=30, max_rounds=12)
    sizes = [1, 3, 2, 5, 1, 4, 2, 3, 1, 6, 9]
    granted = [
        _granted(await ledger.reserve("run", DELIB, n, policy, WALL + i / 2))
        for i, n in enumerate(sizes)
    ]
    assert [r.round_index for r in granted] == list(range(1, 12))
    numbers = [s for r in granted for s in range(r.first_slot, r.first_slot + r.slots)]
    assert numbers == list(range(1, 31))
    assert granted[-1].slots == 30 - sum(sizes[:-1])  # the last round got what was left
    assert [r.reserved for r in granted] == [r.first_slot + r.slots - 1 for r in granted]


async def test_deadline_passed_refuses_the_round(ledger: Ledger) -> None:
    policy = AllowancePolicy(max_searches=10, max_rounds=5)
    _granted(await ledger.reserve("run", AUTO, 2, policy, WALL))
    _granted(await ledger.reserve("run", AUTO, 2, policy, WALL + 9.5))
    # At the deadline itself the run is over (a permit has 0 s left then, too).
    _refused(await ledger.reserve("run", AUTO, 2, policy, WALL + 10.0), RefusalReason.DEADLINE)
    _refused(await ledger.reserve("run", AUTO, 2, policy, WALL + 500), RefusalReason.DEADLINE)
    usage = await ledger.usage("run")
    assert (usage.rounds, usage.reserved, usage.refused) == (2, 4, 2)
    assert usage.deadline_wall == WALL + 10.0


async def test_a_clock_behind_the_runs_record_never_reopens_its_deadline(ledger: Ledger) -> None:
    # Another process (or this one after a restart) whose wall clock is behind the times the
    # ledger already judged the run at: it is judged at the latest of them, never earlier.
    policy = AllowancePolicy(max_searches=10, max_rounds=5)
    _granted(await ledger.reserve("run", AUTO, 1, policy, WALL))
    _refused(await ledger.reserve("run", AUTO, 1, policy, WALL + 15), RefusalReason.DEADLINE)
    _refused(await ledger.reserve("run", AUTO, 1, policy, WALL + 5), RefusalReason.DEADLINE)
    _granted(await ledger.reserve("other", AUTO, 1, policy, WALL))
    _granted(await ledger.reserve("other", AUTO, 1, policy, WALL + 6))
    behind = _granted(await ledger.reserve("other", AUTO, 1, policy, WALL + 2))
    assert behind.reserved_wall >= WALL + 6  # 4 s left at most, never 8
    assert behind.deadline_wall == WALL + 10


async def test_a_recorded_attempt_that_ran_past_the_deadline_ends_the_run_for_a_clock_behind(
    ledger: Ledger, ledger_kind: str
) -> None:
    # The ledger saw the deadline pass through the attempt's own record (it started at
    # WALL + 1 and ran 12 s); a worker restarted with its clock behind is judged after it.
    # Judged by the server's clock, the callers' clocks (an attempt's times among them) move
    # nothing: the server's own judgments alone are the run's clock.
    by_server = ledger_kind == "postgres-server-clock"
    shift = SERVER_CLOCK_SHIFT if by_server else 0.0
    policy = AllowancePolicy(max_searches=10, max_rounds=5)

    def ran(attempt_id: str, run_id: str, elapsed_s: float) -> AttemptTrace:
        trace = _trace(attempt_id, run_id, 1, outcome=AttemptOutcome.DEADLINE,
                       elapsed_s=elapsed_s)
        return attrs.evolve(trace, started_wall=trace.started_wall + shift)

    _granted(await ledger.reserve("run", AUTO, 2, policy, WALL))
    await ledger.record([ran("late", "run", 12.0)], [])
    later = await ledger.reserve("run", DELIB, 1, policy, WALL - 1000)
    if by_server:
        assert _granted(later).reserved_wall == WALL
    else:
        _refused(later, RefusalReason.DEADLINE)
    # One that ended in time moves the run's clock to its end, no further.
    _granted(await ledger.reserve("other", AUTO, 2, policy, WALL))
    await ledger.record([ran("early", "other", 4.0)], [])
    behind = _granted(await ledger.reserve("other", DELIB, 1, policy, WALL - 1000))
    assert behind.reserved_wall == (WALL if by_server else WALL + 5)
    assert behind.deadline_wall == WALL + 10


@pytest.mark.parametrize(("started", "elapsed"), [
    (1e308, 1e308), (float("inf"), 0.25), (WALL, float("nan")), (WALL, -1.0),
])
async def test_an_attempt_whose_times_are_not_finite_is_refused_and_the_run_goes_on(
    ledger: Ledger, started: float, elapsed: float
) -> None:
    _granted(await ledger.reserve("run", AUTO, 1, POLICY, WALL))
    trace = attrs.evolve(_trace("a1", "run", 1), started_wall=started, elapsed_s=elapsed)
    with pytest.raises(InvalidArgumentError):
        await ledger.record([trace], [])
    assert await ledger.attempts("run") == []
    _granted(await ledger.reserve("run", DELIB, 1, POLICY, WALL + 1))


_UNSTORABLE = ["x\ud800", "x\x00y"]
"""Text no ledger can store as given: a lone surrogate (not UTF-8), a NUL (PostgreSQL)."""


@pytest.mark.parametrize("bad", _UNSTORABLE)
@pytest.mark.parametrize("field", ["attempt_id", "kind", "strategy", "fingerprint"])
async def test_an_attempt_with_text_no_ledger_can_store_is_refused_and_nothing_is_written(
    ledger: Ledger, field: str, bad: str
) -> None:
    _granted(await ledger.reserve("run", AUTO, 2, POLICY, WALL))
    good = _trace("a1", "run", 1)
    with pytest.raises(InvalidArgumentError, match=field):
        await ledger.record([good, attrs.evolve(_trace("a2", "run", 2), **{field: bad})], [])
    assert await ledger.attempts("run") == []
    await ledger.record([good], [])
    assert [t.attempt_id for t in await ledger.attempts("run")] == ["a1"]


@pytest.mark.parametrize("bad", _UNSTORABLE)
@pytest.mark.parametrize("field", ["call_id", "digest", "reason", "evidence_ids"])
async def test_a_call_record_with_text_no_ledger_can_store_is_refused(
    ledger: Ledger, field: str, bad: str
) -> None:
    value: object = (bad,) if field == "evidence_ids" else bad
    call = CallRecord(run_id="run", call_id="c1", digest="d" * 64, status="ok", slot=1,
                      evidence_ids=("m1",))
    with pytest.raises(InvalidArgumentError, match=field.removesuffix("s")):
        await ledger.record([], [], [attrs.evolve(call, **{field: value})], retain_limit=8)
    assert await ledger.recorded_calls("run", ["c1", bad]) == []
    if field in ("call_id", "digest"):
        identity = (bad, "d" * 64) if field == "call_id" else ("c1", bad)
        with pytest.raises(InvalidArgumentError, match=field):
            await ledger.claim_calls("run", [("c0", "d" * 64), identity])
        assert await ledger.recorded_calls("run", ["c0", "c1", bad]) == []
        with pytest.raises(InvalidArgumentError, match=field):
            await ledger.release_calls("run", [identity])
    with pytest.raises(InvalidArgumentError, match="evidence"):
        await ledger.retain("run", ["m1", bad], limit=8)


@pytest.mark.parametrize("bad", _UNSTORABLE)
async def test_a_refusal_with_text_no_ledger_can_store_is_refused(
    ledger: Ledger, bad: str
) -> None:
    refusal = RefusalRecord(run_id="run", round_index=None, what="round", kind=bad,
                            reason=RefusalReason.SLOTS, at_wall=WALL)
    with pytest.raises(InvalidArgumentError, match="kind"):
        await ledger.record([], [refusal])
    assert await ledger.refusals("run") == []


async def test_refusals_are_recorded_as_rounds(ledger: Ledger) -> None:
    _granted(await ledger.reserve("run", AUTO, 4, POLICY, WALL))
    _refused(await ledger.reserve("run", DELIB, 1, POLICY, WALL + 1), RefusalReason.SLOTS)
    assert await ledger.refusals("run") == [
        RefusalRecord(
            run_id="run", round_index=None, what="round", kind="deliberate",
            reason=RefusalReason.SLOTS, at_wall=WALL + 1,
        )
    ]


async def test_runs_are_independent(ledger: Ledger) -> None:
    _granted(await ledger.reserve("a", AUTO, 4, POLICY, WALL))
    _refused(await ledger.reserve("a", AUTO, 1, POLICY, WALL), RefusalReason.SLOTS)
    b = _granted(await ledger.reserve("b", AUTO, 2, POLICY, WALL + 100))
    assert (b.round_index, b.first_slot, b.deadline_wall) == (1, 1, WALL + 110)
    assert (await ledger.usage("b")).refused == 0


async def test_usage_of_an_unknown_run_is_zero(ledger: Ledger) -> None:
    _granted(await ledger.reserve("other", AUTO, 2, POLICY, WALL))
    usage = await ledger.usage("never-seen")
    assert usage == Usage(run_id="never-seen")
    assert (usage.rounds, usage.reserved, usage.executed, usage.refused) == (0, 0, 0, 0)
    assert usage.deadline_wall is None
    assert await ledger.reservations("never-seen") == []
    assert await ledger.attempts("never-seen") == []
    assert await ledger.refusals("never-seen") == []


async def test_limits_are_fixed_by_the_first_rounds_policy(ledger: Ledger) -> None:
    small = AllowancePolicy(max_searches=3, max_rounds=2, deadline_s=10.0)
    big = AllowancePolicy(max_searches=100, max_rounds=10, deadline_s=1000.0, automatic_slots=50)
    _granted(await ledger.reserve("run", DELIB, 2, small, WALL))
    second = _granted(await ledger.reserve("run", DELIB, 50, big, WALL + 1))
    assert (second.slots, second.reserved, second.deadline_wall) == (1, 3, WALL + 10.0)
    _refused(await ledger.reserve("run", DELIB, 1, big, WALL + 2), RefusalReason.ROUNDS)
    # past the original deadline, a longer deadline_s in a later policy does not reopen it
    policy = AllowancePolicy(max_searches=3, max_rounds=3)
    _granted(await ledger.reserve("late", AUTO, 1, policy, WALL))
    _refused(await ledger.reserve("late", AUTO, 1, big, WALL + 11), RefusalReason.DEADLINE)
    # a smaller later policy does not shrink the run either
    _granted(await ledger.reserve("wide", DELIB, 1, big, WALL))
    third = _granted(await ledger.reserve("wide", DELIB, 5, small, WALL + 1))
    assert (third.round_index, third.slots, third.reserved) == (2, 5, 6)
    assert (await ledger.usage("wide")).deadline_wall == WALL + 1000.0


# -- attempts, refusals, history -------------------------------------------------------------


async def test_record_counts_executed_attempts(ledger: Ledger) -> None:
    _granted(await ledger.reserve("run", DELIB, 3, POLICY, WALL))
    await ledger.record(
        [_trace("a1", "run", 1), _trace("a2", "run", 2, outcome=AttemptOutcome.ERROR)], []
    )
    usage = await ledger.usage("run")
    assert (usage.reserved, usage.executed, usage.legacy_attempts) == (3, 2, 0)
    assert [t.attempt_id for t in await ledger.attempts("run")] == ["a1", "a2"]
    # the reserve result and a refusal carry the run's executed count at that moment
    second = _granted(await ledger.reserve("run", DELIB, 5, POLICY, WALL + 1))
    assert (second.slots, second.executed) == (1, 2)
    refusal = _refused(await ledger.reserve("run", DELIB, 1, POLICY, WALL + 2),
                       RefusalReason.ROUNDS)
    assert (refusal.reserved, refusal.executed) == (4, 2)


async def test_a_later_trace_of_the_same_attempt_replaces_it(ledger: Ledger) -> None:
    _granted(await ledger.reserve("run", DELIB, 2, POLICY, WALL))
    first = _trace("a1", "run", 1, outcome=AttemptOutcome.IN_FLIGHT, elapsed_s=None)
    await ledger.record([first], [])
    assert (await ledger.usage("run")).executed == 1
    final = attrs.evolve(first, outcome=AttemptOutcome.DEADLINE, elapsed_s=1.5)
    await ledger.record([final], [])
    await ledger.record([final], [])
    assert (await ledger.usage("run")).executed == 1
    assert await ledger.attempts("run") == [final]
    # within one batch, too
    await ledger.record([_trace("a2", "run", 2, outcome=AttemptOutcome.IN_FLIGHT),
                         _trace("a2", "run", 2, outcome=AttemptOutcome.OK)], [])
    assert (await ledger.usage("run")).executed == 2
    assert [t.outcome for t in await ledger.attempts("run")] == [
        AttemptOutcome.DEADLINE, AttemptOutcome.OK
    ]
    # an in_flight trace written late never replaces the final one
    await ledger.record([first], [])
    assert await ledger.attempts("run") == [final, attrs.evolve(
        _trace("a2", "run", 2, outcome=AttemptOutcome.OK))]


async def test_legacy_attempts_are_not_executed(ledger: Ledger) -> None:
    _granted(await ledger.reserve("run", DELIB, 1, POLICY, WALL))
    await ledger.record(
        [
            _trace("x1", "run", 1),
            _trace("l1", "run", 1, round_index=0, legacy=True),
            _trace("l2", "run", 2, round_index=0, legacy=True),
        ],
        [],
    )
    usage = await ledger.usage("run")
    assert (usage.executed, usage.legacy_attempts, usage.reserved) == (1, 2, 1)
    # a legacy-only run is never opened: no rounds, no deadline, but its attempts are traced
    await ledger.record([_trace("l3", "legacy-run", 1, round_index=0, legacy=True)], [])
    assert await ledger.usage("legacy-run") == Usage(run_id="legacy-run", legacy_attempts=1)
    (traced,) = await ledger.attempts("legacy-run")
    assert traced.legacy is True


async def test_recorded_attempt_refusals_count_as_refused(ledger: Ledger) -> None:
    _granted(await ledger.reserve("run", DELIB, 1, POLICY, WALL))
    refusal = RefusalRecord(
        run_id="run", round_index=1, what="attempt", kind="deliberate",
        reason=RefusalReason.SLOTS, at_wall=WALL + 0.5,
    )
    await ledger.record([], [refusal, attrs.evolve(refusal, reason=RefusalReason.CLOSED)])
    await ledger.record([], [])  # nothing to write is fine
    assert (await ledger.usage("run")).refused == 2
    assert await ledger.refusals("run") == [
        refusal, attrs.evolve(refusal, reason=RefusalReason.CLOSED)
    ]


async def test_a_refusal_written_again_is_counted_once(ledger: Ledger) -> None:
    # A write whose commit was not acknowledged (a connection lost at COMMIT) is owed and
    # written again; a refusal it held must not count twice.
    _granted(await ledger.reserve("run", DELIB, 1, POLICY, WALL))
    refusal = RefusalRecord(
        run_id="run", round_index=1, what="attempt", kind="deliberate",
        reason=RefusalReason.SLOTS, at_wall=WALL + 0.5, key="k1",
    )
    await ledger.record([], [refusal])
    await ledger.record([], [refusal, attrs.evolve(refusal, key="k2")])
    assert (await ledger.usage("run")).refused == 2
    assert await ledger.refusals("run") == [refusal, attrs.evolve(refusal, key="k2")]


async def test_reservations_are_the_runs_history(ledger: Ledger) -> None:
    policy = AllowancePolicy(max_searches=6, max_rounds=3)
    granted = [
        _granted(await ledger.reserve("run", AUTO, 2, policy, WALL)),
        _granted(await ledger.reserve("run", DELIB, 3, policy, WALL + 2)),
        _granted(await ledger.reserve("run", DELIB, 4, policy, WALL + 4)),
    ]
    _refused(await ledger.reserve("run", DELIB, 1, policy, WALL + 5), RefusalReason.ROUNDS)
    _granted(await ledger.reserve("other", AUTO, 2, policy, WALL))
    history = await ledger.reservations("run")
    assert history == granted  # executed was 0 at each of these rounds
    assert [(r.kind, r.requested, r.first_slot, r.slots) for r in history] == [
        (AUTO, 2, 1, 2), (DELIB, 3, 3, 3), (DELIB, 4, 6, 1)
    ]


async def test_reservations_report_executed_as_it_was_at_each_round(ledger: Ledger) -> None:
    # Reservation.executed is "the run's executed attempts recorded when this round was
    # reserved"; the history must say what reserve() said, not a made-up 0.
    _granted(await ledger.reserve("run", DELIB, 2, POLICY, WALL))
    await ledger.record([_trace("a1", "run", 1), _trace("a2", "run", 2)], [])
    second = _granted(await ledger.reserve("run", DELIB, 2, POLICY, WALL + 1))
    assert second.executed == 2
    assert (await ledger.reservations("run"))[1] == second


async def test_concurrent_tasks_on_one_ledger_never_over_admit(ledger: Ledger) -> None:
    policy = AllowancePolicy(max_searches=4, max_rounds=16)
    results: list[Reservation | BudgetRefusal] = []

    async def reserve_one(i: int) -> None:
        results.append(await ledger.reserve("run", DELIB, 1, policy, WALL))
        await ledger.record([_trace(f"t{i}", "other", i, round_index=0, legacy=True)], [])
        await ledger.usage("run")

    async with anyio.create_task_group() as tg:
        for i in range(16):
            tg.start_soon(reserve_one, i)
    granted = [r for r in results if isinstance(r, Reservation)]
    refused = [r for r in results if isinstance(r, BudgetRefusal)]
    assert sorted(r.first_slot for r in granted) == [1, 2, 3, 4]
    assert len(refused) == 12
    assert {r.reason for r in refused} == {RefusalReason.SLOTS}
    usage = await ledger.usage("run")
    assert (usage.rounds, usage.reserved, usage.refused) == (4, 4, 12)
    assert (await ledger.usage("other")).legacy_attempts == 16


async def test_everything_survives_reopening(open_ledger: Callable[..., Any]) -> None:
    async with open_ledger() as ledger:
        _granted(await ledger.reserve("run", AUTO, 2, POLICY, WALL))
        await ledger.record([_trace("a1", "run", 1)], [])
        _granted(await ledger.reserve("late", AUTO, 2, POLICY, WALL))
        _refused(await ledger.reserve("late", DELIB, 9, POLICY, WALL + 11),
                 RefusalReason.DEADLINE)
        before = (await ledger.usage("run"), await ledger.reservations("run"),
                  await ledger.attempts("run"), await ledger.refusals("late"))
    async with open_ledger() as ledger:
        after = (await ledger.usage("run"), await ledger.reservations("run"),
                 await ledger.attempts("run"), await ledger.refusals("late"))
        assert after == before
        second = _granted(await ledger.reserve("run", DELIB, 9, POLICY, WALL + 5))
        assert (second.round_index, second.first_slot, second.slots) == (2, 3, 2)


async def test_using_a_ledger_outside_async_with_raises(open_ledger: Callable[..., Any]) -> None:
    unopened = open_ledger()
    with pytest.raises(LedgerClosedError):
        await unopened.reserve("run", AUTO, 2, POLICY, WALL)
    with pytest.raises(LedgerClosedError):
        await unopened.usage("run")
    async with unopened as ledger:
        _granted(await ledger.reserve("run", AUTO, 2, POLICY, WALL))
    calls: tuple[Callable[[], Awaitable[object]], ...] = (
        lambda: ledger.reserve("run", AUTO, 2, POLICY, WALL),
        lambda: ledger.record([_trace("a1", "run", 1)], []),
        lambda: ledger.usage("run"),
        lambda: ledger.reservations("run"),
        lambda: ledger.attempts("run"),
        lambda: ledger.refusals("run"),
    )
    for call in calls:
        with pytest.raises(LedgerClosedError):
            await call()


# -- the allowance over a ledger: fail closed, checkpoint first ------------------------------


@attrs.define
class _FailingLedger:
    """A ledger whose reserve fails: before committing, or after (a lost acknowledgement)."""

    inner: Ledger
    commit_first: bool = False

    async def reserve(self, *args: Any, **options: Any) -> Reservation | BudgetRefusal:
        if self.commit_first:
            await self.inner.reserve(*args, **options)
        raise LedgerError("the ledger could not confirm the commit")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("commit_first", [False, True])
async def test_no_permit_when_the_reservation_fails(ledger: Ledger, commit_first: bool) -> None:
    allowance = RecallAllowance(
        _FailingLedger(ledger, commit_first=commit_first), clock=ManualClock(wall=WALL)
    )
    ran = False
    with pytest.raises(LedgerError):
        async with allowance.round("run", AUTO):
            ran = True
    assert not ran
    assert current_permit() is None
    usage = await ledger.usage("run")
    assert (usage.rounds, usage.reserved) == ((1, 2) if commit_first else (0, 0))


async def test_checkpoint_runs_after_commit_and_before_the_permit(
    ledger: Ledger, open_ledger: Callable[..., Any]
) -> None:
    seen: list[tuple[str, int, Usage, object]] = []

    async def checkpoint(run_id: str, round_index: int) -> None:
        # committed: another connection to the same store already sees the round
        async with open_ledger() as other:
            assert await other.usage(run_id) == await ledger.usage(run_id)
        seen.append((run_id, round_index, await ledger.usage(run_id), current_permit()))

    allowance = RecallAllowance(ledger, clock=ManualClock(wall=WALL), checkpoint=checkpoint)
    async with allowance.round("run", AUTO) as permit:
        assert current_permit() is permit
    async with allowance.round("run", DELIB, slots=1):
        pass
    assert [(run, index, u.rounds, u.reserved, p) for run, index, u, p in seen] == [
        ("run", 1, 1, 2, None), ("run", 2, 2, 3, None)
    ]


async def test_a_failing_checkpoint_issues_no_permit_and_keeps_the_slots(ledger: Ledger) -> None:
    class CheckpointFailed(Exception):
        pass

    async def checkpoint(run_id: str, round_index: int) -> None:
        raise CheckpointFailed(run_id)

    allowance = RecallAllowance(ledger, clock=ManualClock(wall=WALL), checkpoint=checkpoint)
    ran = False
    with pytest.raises(CheckpointFailed):
        async with allowance.round("run", DELIB, slots=3):
            ran = True
    assert not ran
    assert current_permit() is None
    usage = await ledger.usage("run")
    assert (usage.rounds, usage.reserved, usage.executed) == (1, 3, 0)
    # no refund: a later round gets only what is left
    allowance.checkpoint = None
    async with allowance.round("run", DELIB, slots=3) as permit:
        assert (permit.round_index, permit.first_slot, permit.slots) == (2, 4, 1)


async def test_the_permit_matches_its_committed_reservation(ledger: Ledger) -> None:
    clock = ManualClock(wall=WALL)
    allowance = RecallAllowance(ledger, clock=clock)
    async with allowance.round("run", AUTO) as permit:
        (committed,) = await ledger.reservations("run")
        assert (permit.round_index, permit.first_slot, permit.slots) == (1, 1, 2)
        assert (committed.first_slot, committed.slots) == (1, 2)
        assert permit.deadline_wall == committed.deadline_wall == WALL + 10.0
    clock.advance(4.0)
    async with allowance.round("run", DELIB, slots=5) as permit:
        assert (permit.round_index, permit.first_slot, permit.slots) == (2, 3, 2)
        assert permit.seconds_left() == 6.0
    with pytest.raises(RecallBudgetExceeded) as caught:
        async with allowance.round("run", DELIB, slots=1):
            pytest.fail("a third round must be refused")
    assert caught.value.reason is RefusalReason.ROUNDS
    assert current_permit() is None


# -- failures of a file-backed ledger (SqliteLedger) -----------------------------------------


def test_ledger_errors_share_one_root() -> None:
    for error in (LedgerPathError, LedgerCorruptError, LedgerLockedError, LedgerClosedError,
                  LedgerUnavailableError):
        assert issubclass(error, LedgerError)
        assert issubclass(error, RecallboundError)
    assert issubclass(LedgerError, RecallboundError)


async def test_a_ledger_in_a_missing_folder_fails_at_open(
    anyio_backend: object, tmp_path: Path
) -> None:
    ledger = SqliteLedger(tmp_path / "no" / "such" / "folder" / "ledger.sqlite3")
    with pytest.raises(LedgerPathError) as caught:
        await ledger.open()
    assert isinstance(caught.value, LedgerError)
    assert not (tmp_path / "no").exists()
    with pytest.raises(LedgerClosedError):
        await ledger.usage("run")


async def test_a_folder_is_not_a_ledger_file(anyio_backend: object, tmp_path: Path) -> None:
    with pytest.raises(LedgerPathError, match="is a folder"):
        async with SqliteLedger(tmp_path):
            pass
    assert list(tmp_path.iterdir()) == []


async def test_random_bytes_are_a_corrupt_ledger(anyio_backend: object, tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    path.write_bytes(random.Random(20240601).randbytes(16384))
    with pytest.raises(LedgerCorruptError):
        async with SqliteLedger(path):
            pytest.fail("a random file must not open")


async def _damaged(path: Path, needle: bytes, byte: int) -> None:
    """A ledger holding one round and one attempt, then one byte of ``needle`` changed."""
    async with SqliteLedger(path) as ledger:
        allowance = RecallAllowance(ledger, clock=ManualClock())
        async with allowance.round("run-one", RoundKind.AUTOMATIC) as permit:
            async with permit.attempt():
                pass
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0
    data[at + 1] = byte
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("needle", "byte", "read"), [
    (b"callscalls", 0xFF, False),  # a table's name in the schema, no longer UTF-8
    (b"automatic", ord("w"), True),  # a round's kind no ledger writes
])
async def test_a_damaged_ledger_is_a_typed_error(
    anyio_backend: object, tmp_path: Path, needle: bytes, byte: int, read: bool
) -> None:
    path = tmp_path / "ledger.sqlite3"
    await _damaged(path, needle, byte)

    async def use() -> None:
        async with SqliteLedger(path) as ledger:
            if read:
                await ledger.reservations("run-one")

    with pytest.raises(LedgerCorruptError):
        await use()


@pytest.mark.parametrize(("statement", "listed"), [
    ("UPDATE runs SET run_id = CAST(x'ff41' AS TEXT)", False),  # text that is not UTF-8
    ("UPDATE rounds SET slots = 9223372036854775807", True),  # a sum that overflows
])
async def test_a_damaged_value_is_a_typed_error_and_check_reports_it(
    anyio_backend: object, tmp_path: Path, statement: str, listed: bool
) -> None:
    path = await _ledger_file_then(tmp_path, statement)
    async with SqliteLedger(path) as ledger:
        assert not (await ledger.admin().check()).ok  # reported, not raised
        if listed:
            assert [run.run_id for run in await ledger.admin().runs(limit=10)] == ["run"]
        else:
            with pytest.raises(LedgerCorruptError):
                await ledger.admin().runs(limit=10)


async def test_a_foreign_sqlite_database_is_not_a_ledger(
    anyio_backend: object, tmp_path: Path
) -> None:
    path = tmp_path / "theirs.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("INSERT INTO notes (body) VALUES ('keep me')")
    conn.close()
    with pytest.raises(LedgerCorruptError):
        async with SqliteLedger(path):
            pytest.fail("a foreign database must not open")
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT body FROM notes").fetchall() == [("keep me",)]
        assert conn.execute("PRAGMA user_version").fetchone() == (0,)
    finally:
        conn.close()


async def test_a_database_holding_only_a_view_is_not_a_ledger_and_is_left_untouched(
    anyio_backend: object, tmp_path: Path
) -> None:
    """No table, but a view: not an empty file to create a ledger in. Likewise the store."""
    from plugin.memory import MemoryStore
    from plugin.memory.store import MemoryStoreCorruptError

    for name, opened, error in (("ledger", SqliteLedger, LedgerCorruptError),
                                ("store", MemoryStore, MemoryStoreCorruptError)):
        path = tmp_path / f"{name}.sqlite3"
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("CREATE VIEW v AS SELECT 1 AS one")
        before = path.read_bytes()
        with pytest.raises(error):
            async with opened(path):
                pytest.fail("a foreign database must not open")
        assert path.read_bytes() == before, name


@pytest.mark.parametrize("content", [b"x", b"\n", b"SQLite format 3", b"SQLite format 3\x01" * 8])
async def test_a_short_or_foreign_file_is_not_taken_for_an_empty_one(
    anyio_backend: object, tmp_path: Path, content: bytes
) -> None:
    """SQLite takes a file shorter than its header for an empty database, and would write a
    new one over it: a file that holds anything but a SQLite header is refused, untouched."""
    from plugin.memory import MemoryStore
    from plugin.memory.store import MemoryStoreCorruptError

    for name, opened, error in (("ledger", SqliteLedger, LedgerCorruptError),
                                ("store", MemoryStore, MemoryStoreCorruptError)):
        path = tmp_path / f"{name}.sqlite3"
        path.write_bytes(content)
        with pytest.raises(error, match=r"not a (readable )?SQLite database"):
            async with opened(path):
                pytest.fail("a file that is not a database must not open")
        assert path.read_bytes() == content, name


async def test_a_foreign_database_is_left_untouched(anyio_backend: object, tmp_path: Path) -> None:
    # Refusing a file that is not ours must not change it (here: its journal mode).
    path = tmp_path / "theirs.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(LedgerCorruptError):
        async with SqliteLedger(path):
            pass
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    finally:
        conn.close()
    assert path.read_bytes() == before


async def _ledger_file_then(tmp_path: Path, *statements: str) -> Path:
    """A ledger file holding one round of run "run", then changed by raw ``statements``."""
    path = tmp_path / "ledger.sqlite3"
    async with SqliteLedger(path) as ledger:
        _granted(await ledger.reserve("run", AUTO, 2, POLICY, WALL))
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return path


async def test_a_ledger_of_another_schema_version_is_refused(
    anyio_backend: object, tmp_path: Path
) -> None:
    path = await _ledger_file_then(tmp_path, "PRAGMA user_version = 99")
    with pytest.raises(LedgerCorruptError):
        async with SqliteLedger(path):
            pass


async def test_damaged_pages_are_a_corrupt_ledger(anyio_backend: object, tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    async with SqliteLedger(path) as ledger:
        for i in range(40):
            _granted(await ledger.reserve(f"run-{i:03d}" * 8, AUTO, 2, POLICY, WALL))
    data = bytearray(path.read_bytes())
    assert len(data) > 8192
    rng = random.Random(7)
    data[100:] = rng.randbytes(len(data) - 100)  # keep the header (ours), wreck every page
    path.write_bytes(bytes(data))
    damaged = SqliteLedger(path)
    with pytest.raises(LedgerCorruptError):
        await damaged.open()


async def test_a_lock_held_beyond_the_timeout_fails_and_loses_nothing(
    anyio_backend: object, tmp_path: Path
) -> None:
    path = tmp_path / "ledger.sqlite3"
    async with SqliteLedger(path, timeout=0.1) as ledger:
        _granted(await ledger.reserve("run", AUTO, 2, POLICY, WALL))
        await ledger.record([_trace("a1", "run", 1)], [])
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN EXCLUSIVE")
            with pytest.raises(LedgerLockedError):
                await ledger.reserve("run", DELIB, 1, POLICY, WALL + 1)
            with pytest.raises(LedgerLockedError):
                await ledger.record([_trace("a2", "run", 2)], [])
            with pytest.raises(LedgerLockedError):
                async with SqliteLedger(path, timeout=0.1):
                    pass
            # and the allowance fails closed on it
            allowance = RecallAllowance(ledger, clock=ManualClock(wall=WALL + 1))
            with pytest.raises(LedgerLockedError):
                async with allowance.round("run", DELIB, slots=1):
                    pytest.fail("no permit while the ledger cannot commit")
            assert current_permit() is None
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert await ledger.usage("run") == Usage(
            run_id="run", rounds=1, reserved=2, executed=1, refused=0, deadline_wall=WALL + 10
        )
        second = _granted(await ledger.reserve("run", DELIB, 1, POLICY, WALL + 1))
        assert (second.round_index, second.first_slot, second.slots, second.reserved) == (
            2, 3, 1, 3
        )
        await ledger.record([_trace("a2", "run", 3, round_index=2)], [])
        assert (await ledger.usage("run")).executed == 2


# -- retained evidence and its re-check bound, kept with the run --------------------------------


async def test_retained_evidence_is_kept_with_the_run_up_to_its_limit(ledger: Ledger) -> None:
    await ledger.retain("run", ["m1", "m2", "m1"], limit=3)
    await ledger.retain("run", ["m3", "m4"], limit=3)  # m4 is past the limit
    answers = await ledger.take_validations("run", ["m1", "m3", "m4", "x"], limit=10)
    assert answers == {
        "m1": Validity.GRANTED, "m3": Validity.GRANTED,
        "m4": Validity.NOT_RETAINED, "x": Validity.NOT_RETAINED,
    }
    assert await ledger.take_validations("other", ["m1"], limit=10) == {
        "m1": Validity.NOT_RETAINED
    }


async def test_validations_are_bounded_per_run(ledger: Ledger) -> None:
    await ledger.retain("run", ["m1", "m2", "m3"], limit=8)
    first = await ledger.take_validations("run", ["m1", "m2"], limit=3)
    assert first == {"m1": Validity.GRANTED, "m2": Validity.GRANTED}
    second = await ledger.take_validations("run", ["m3", "m1", "m3"], limit=3)
    assert second == {"m3": Validity.GRANTED, "m1": Validity.BOUNDED}


async def test_the_validation_bound_survives_reopening(open_ledger: Callable[..., Any]) -> None:
    async with open_ledger() as ledger:
        await ledger.retain("run", ["m1", "m2"], limit=8)
        await ledger.take_validations("run", ["m1"], limit=1)
    async with open_ledger() as ledger:
        assert await ledger.take_validations("run", ["m1", "m2"], limit=1) == {
            "m1": Validity.BOUNDED, "m2": Validity.BOUNDED,
        }


# -- run identity: a run is bound to the principal and scope of its first use --------------------


async def test_a_run_is_bound_to_its_first_principal_and_scope(ledger: Ledger) -> None:
    await ledger.bind_identity("run", principal="alice", scope="proj")
    await ledger.bind_identity("run", principal="alice", scope="proj")  # the same: fine
    with pytest.raises(RunIdentityError, match="'run'"):
        await ledger.bind_identity("run", principal="mallory", scope="proj")
    with pytest.raises(RunIdentityError):
        await ledger.bind_identity("run", principal="alice", scope="other")
    # the mismatch stored nothing: the first binding still holds, and only it
    await ledger.bind_identity("run", principal="alice", scope="proj")
    with pytest.raises(RunIdentityError):
        await ledger.bind_identity("run", principal="mallory", scope="proj")
    await ledger.bind_identity("another", principal="mallory", scope="other")


async def test_the_run_identity_is_a_value_error_of_the_package() -> None:
    assert issubclass(RunIdentityError, RecallboundError)
    assert issubclass(RunIdentityError, ValueError)


async def test_the_run_identity_survives_reopening(open_ledger: Callable[..., Any]) -> None:
    async with open_ledger() as ledger:
        await ledger.bind_identity("run", principal="alice", scope="proj")
    async with open_ledger() as ledger:
        with pytest.raises(RunIdentityError):
            await ledger.bind_identity("run", principal="mallory", scope="proj")
        await ledger.bind_identity("run", principal="alice", scope="proj")


async def test_another_connection_sees_the_binding_at_once(
    open_ledger: Callable[..., Any]
) -> None:
    async with open_ledger() as first, open_ledger() as second:
        await second.bind_identity("run", principal="bob", scope="proj")
        with pytest.raises(RunIdentityError):
            await first.bind_identity("run", principal="alice", scope="proj")
        with pytest.raises(RunIdentityError):
            await second.bind_identity("run", principal="alice", scope="proj")


async def test_concurrent_first_uses_agree_on_one_binding(
    open_ledger: Callable[..., Any]
) -> None:
    principals = [f"p{i}" for i in range(8)]
    winners: list[str] = []
    losers: list[str] = []
    async with open_ledger() as a, open_ledger() as b:

        async def bind(ledger: Ledger, principal: str) -> None:
            try:
                await ledger.bind_identity("run", principal=principal, scope="proj")
            except RunIdentityError:
                losers.append(principal)
            else:
                winners.append(principal)

        async with anyio.create_task_group() as tg:
            for i, principal in enumerate(principals):
                tg.start_soon(bind, (a, b)[i % 2], principal)
    assert len(winners) == 1 and sorted(winners + losers) == principals
    async with open_ledger() as ledger:
        await ledger.bind_identity("run", principal=winners[0], scope="proj")


@pytest.mark.parametrize("field", ["run_id", "principal", "scope"])
async def test_a_binding_of_the_wrong_type_is_refused(ledger: Ledger, field: str) -> None:
    given: dict[str, Any] = {"run_id": "run", "principal": "alice", "scope": "proj"}
    given[field] = 7
    with pytest.raises(InvalidArgumentTypeError, match=field):
        await ledger.bind_identity(given.pop("run_id"), **given)
    await ledger.bind_identity("run", principal="bob", scope="proj")  # nothing was bound


async def test_a_version_2_ledger_file_is_migrated_and_binds(
    anyio_backend: object, tmp_path: Path
) -> None:
    path = await _ledger_file_then(tmp_path, "DROP TABLE run_identity",
                                   "PRAGMA user_version = 2")
    async with SqliteLedger(path) as ledger:
        assert (await ledger.usage("run")).reserved == 2
        await ledger.bind_identity("run", principal="alice", scope="proj")
        with pytest.raises(RunIdentityError):
            await ledger.bind_identity("run", principal="bob", scope="proj")
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (SqliteLedger.schema_version,)
    finally:
        conn.close()


@pytest.mark.parametrize("evidence", ['{"a":', "null", "5"])
async def test_a_damaged_call_record_is_a_typed_error(
    anyio_backend: object, tmp_path: Path, evidence: str
) -> None:
    path = await _ledger_file_then(
        tmp_path,
        "INSERT INTO calls (run_id, call_id, digest, status, slot, reason, evidence, more, "
        f"reserved, executed) VALUES ('run', 'c1', 'd', 'ok', 1, NULL, '{evidence}', 0, 0, 0)")
    async with SqliteLedger(path) as ledger:
        with pytest.raises(LedgerCorruptError):
            await ledger.recorded_calls("run", ["c1"])


async def test_a_version_3_ledger_file_gains_the_dropped_count(
    anyio_backend: object, tmp_path: Path
) -> None:
    path = await _ledger_file_then(
        tmp_path,
        "INSERT INTO attempts (attempt_id, run_id, round_index, slot, kind, outcome, "
        "started_wall, legacy) VALUES ('a1', 'run', 1, 1, 'base', 'ok', 1.0, 0)",
        "ALTER TABLE attempts DROP COLUMN dropped", "PRAGMA user_version = 3")
    async with SqliteLedger(path) as ledger:
        (old,) = await ledger.attempts("run")
        assert (old.attempt_id, old.dropped) == ("a1", 0)
        await ledger.record([attrs.evolve(old, attempt_id="a2", slot=2, dropped=3)], [])
        assert [a.dropped for a in await ledger.attempts("run")] == [0, 3]
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (SqliteLedger.schema_version,)
    finally:
        conn.close()


async def test_a_version_5_ledger_file_gains_call_records_and_tombstones(
    anyio_backend: object, tmp_path: Path
) -> None:
    path = await _ledger_file_then(
        tmp_path, "DROP TABLE calls", "ALTER TABLE runs DROP COLUMN pruned",
        "PRAGMA user_version = 5")
    record = CallRecord(run_id="run", call_id="c1", digest="d", status="ok", slot=1,
                        evidence_ids=("m1",))
    async with SqliteLedger(path) as ledger:
        assert (await ledger.usage("run")).rounds == 1  # kept
        await ledger.record([], [], [record])
        assert await ledger.recorded_calls("run", ["c1"]) == [record]
        _granted(await ledger.reserve("later", AUTO, 2, POLICY, WALL + 100))
        report = await ledger.admin().prune(before_wall=WALL + 50, now_wall=WALL + 100,
                                            dry_run=False)
        assert report.run_ids == ("run",) and report.rows["calls"] == 1
        refused = await ledger.reserve("run", AUTO, 2, POLICY, WALL + 200)
        assert isinstance(refused, BudgetRefusal)  # its tombstone: never opened afresh
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (SqliteLedger.schema_version,)
    finally:
        conn.close()


async def test_a_version_6_ledger_file_gains_unique_refusal_keys(
    anyio_backend: object, tmp_path: Path
) -> None:
    path = await _ledger_file_then(
        tmp_path, "DROP INDEX refusals_by_key", "ALTER TABLE refusals DROP COLUMN refusal_key",
        "PRAGMA user_version = 6")
    refusal = RefusalRecord(run_id="run", round_index=1, what="attempt", kind="automatic",
                            reason=RefusalReason.SLOTS, at_wall=WALL + 1, key="k")
    async with SqliteLedger(path) as ledger:
        assert (await ledger.usage("run")).rounds == 1  # kept
        for _ in range(2):  # written again, as after a commit whose acknowledgement was lost
            await ledger.record([], [refusal])
        assert await ledger.refusals("run") == [refusal]
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (SqliteLedger.schema_version,)
    finally:
        conn.close()


async def test_a_version_7_tombstone_left_unspent_is_spent_so_a_slow_clock_cannot_reopen_it(
    anyio_backend: object, tmp_path: Path
) -> None:
    # An older release marked a pruned run's row without spending its rounds and slots: with
    # the times of its rounds pruned, a clock behind the run's deadline found room in it.
    path = await _ledger_file_then(tmp_path)
    async with SqliteLedger(path) as ledger:
        _granted(await ledger.reserve("later", AUTO, 2, POLICY, WALL + 100))
        report = await ledger.admin().prune(before_wall=WALL + 50, now_wall=WALL + 100,
                                            dry_run=False)
        assert report.run_ids == ("run",)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE runs SET rounds = 1, reserved = 2 WHERE run_id = 'run'")
    conn.execute("PRAGMA user_version = 7")
    conn.commit()
    conn.close()
    async with SqliteLedger(path) as ledger:
        behind = await ledger.reserve("run", AUTO, 2, POLICY, WALL + 1)
        assert isinstance(behind, BudgetRefusal) and behind.reason is RefusalReason.ROUNDS
        assert (await ledger.usage("run")).reserved == POLICY.max_searches
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (SqliteLedger.schema_version,)
    finally:
        conn.close()


_BINDER = """
import sys, anyio
from plugin.control import PostgresLedger, SqliteLedger
from plugin.errors import RunIdentityError

async def main(kind, where, principal):
    ledger = (SqliteLedger(where) if kind == "sqlite"
              else PostgresLedger(sys.argv[4], schema=where, time_source="caller"))
    async with ledger:
        sys.stdout.write("ready\\n"); sys.stdout.flush()
        sys.stdin.readline()
        try:
            await ledger.bind_identity("run", principal=principal, scope="proj")
        except RunIdentityError:
            print("refused")
        else:
            print("bound")

anyio.run(main, *sys.argv[1:4])
"""


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_processes_race_to_bind_one_run_and_one_wins(tmp_path: Path, kind: str) -> None:
    import subprocess
    import sys

    with contextlib.ExitStack() as stack:
        where = (str(tmp_path / "ledger.sqlite3") if kind == "sqlite"
                 else stack.enter_context(fresh_schema("identity")))
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _BINDER, kind, where, principal, DSN],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True,
            )
            for principal in ("alice", "bob")
        ]
        try:
            for proc in procs:
                assert proc.stdout is not None
                assert proc.stdout.readline() == "ready\n", proc.communicate(timeout=60)[1]
            outs = [proc.communicate("go\n", timeout=60) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        assert all(proc.returncode == 0 for proc in procs), outs
        assert sorted(out.strip() for out, _ in outs) == ["bound", "refused"]
        winner = ("alice", "bob")[[out.strip() for out, _ in outs].index("bound")]

        async def check() -> None:
            ledger: SqliteLedger | PostgresLedger = (
                SqliteLedger(where) if kind == "sqlite"
                else PostgresLedger(DSN, schema=where, time_source="caller"))
            async with ledger as opened:
                await opened.bind_identity("run", principal=winner, scope="proj")
                with pytest.raises(RunIdentityError):
                    await opened.bind_identity("run", principal="carol", scope="proj")

        anyio.run(check)


# -- runs opened per hour, per (principal, scope) ----------------------------------------------

HOUR = 3600.0


async def test_runs_opened_per_hour_are_capped_per_principal_and_scope(ledger: Ledger) -> None:
    for n in range(3):
        assert await ledger.open_run(f"r{n}", principal="alice", scope="proj", now=WALL + n,
                                     per_hour=3)
    assert not await ledger.open_run("r3", principal="alice", scope="proj", now=WALL + 3,
                                     per_hour=3)
    # a run already opened is not opened again; other cells have their own count
    assert await ledger.open_run("r1", principal="alice", scope="proj", now=WALL + 4, per_hour=3)
    assert await ledger.open_run("b3", principal="bob", scope="proj", now=WALL + 4, per_hour=3)
    assert await ledger.open_run("o3", principal="alice", scope="other", now=WALL + 4,
                                 per_hour=3)
    # the refused run was not counted: it still cannot open within the hour, and can after
    assert not await ledger.open_run("r3", principal="alice", scope="proj",
                                     now=WALL + HOUR - 1, per_hour=3)
    assert await ledger.open_run("r3", principal="alice", scope="proj", now=WALL + HOUR + 0.5,
                                 per_hour=3)
    assert not await ledger.open_run("r4", principal="alice", scope="proj",
                                     now=WALL + HOUR + 0.5, per_hour=3)


async def test_a_clock_that_steps_forward_and_back_keeps_the_hours_openings(
    ledger: Ledger,
) -> None:
    for n in range(2):
        assert await ledger.open_run(f"r{n}", principal="alice", scope="proj", now=WALL + n,
                                     per_hour=2)
    # two hours on, the hour's openings are behind: a run opens
    assert await ledger.open_run("ahead", principal="alice", scope="proj",
                                 now=WALL + 2 * HOUR, per_hour=2)
    # the clock steps back: the openings of its hour still count, and so does the later one
    assert not await ledger.open_run("r2", principal="alice", scope="proj", now=WALL + 10,
                                     per_hour=2)
    # a day on, all of them are behind
    assert await ledger.open_run("r2", principal="alice", scope="proj", now=WALL + 26 * HOUR,
                                 per_hour=2)


async def test_a_worker_whose_clock_is_hours_ahead_cannot_reset_the_fleets_hourly_count(
    anyio_backend: object,
) -> None:
    """Judged by the server's clock, as rounds are: a worker whose own clock is two hours
    ahead neither forgets the pair's openings of the last hour nor opens past the cap."""
    with fresh_schema("skew") as schema:
        async with PostgresLedger(DSN, schema=schema) as ledger:
            now = time.time()
            for n in range(2):
                assert await ledger.open_run(f"r{n}", principal="alice", scope="proj", now=now,
                                             per_hour=2)
            ahead = now + 2 * HOUR
            assert not await ledger.open_run("r2", principal="alice", scope="proj", now=ahead,
                                             per_hour=2)
            assert not await ledger.open_run("r3", principal="alice", scope="proj", now=now,
                                             per_hour=2)
            # never judged before the floor: an hour the caller has watched pass has passed
            assert await ledger.open_run("r3", principal="alice", scope="proj", now=now,
                                         floor=ahead, per_hour=2)


async def test_runs_opened_per_hour_survive_reopening(open_ledger: Callable[..., Any]) -> None:
    async with open_ledger() as ledger:
        assert await ledger.open_run("r0", principal="alice", scope="proj", now=WALL, per_hour=1)
    async with open_ledger() as ledger:
        assert not await ledger.open_run("r1", principal="alice", scope="proj", now=WALL + 1,
                                         per_hour=1)
        assert await ledger.open_run("r0", principal="alice", scope="proj", now=WALL + 1,
                                     per_hour=1)


async def test_concurrent_run_openings_never_pass_the_cap(
    open_ledger: Callable[..., Any]
) -> None:
    opened: list[bool] = []
    async with open_ledger() as first, open_ledger() as second:

        async def one(ledger: Ledger, n: int) -> None:
            opened.append(bool(await ledger.open_run(f"r{n}", principal="alice", scope="proj",
                                                     now=WALL, per_hour=5)))

        async with anyio.create_task_group() as tg:
            for n in range(12):
                tg.start_soon(one, first if n % 2 else second, n)
    assert sorted(opened) == [False] * 7 + [True] * 5


@pytest.mark.parametrize("field", ["run_id", "principal", "scope"])
async def test_a_run_opening_of_the_wrong_type_is_refused(ledger: Ledger, field: str) -> None:
    given: dict[str, Any] = {"run_id": "run", "principal": "alice", "scope": "proj", field: 7}
    with pytest.raises(InvalidArgumentTypeError, match=field):
        await ledger.open_run(given.pop("run_id"), **given, now=WALL, per_hour=1)
    assert await ledger.open_run("run", principal="alice", scope="proj", now=WALL, per_hour=1)


async def test_a_version_4_ledger_file_gains_the_run_openings(
    anyio_backend: object, tmp_path: Path
) -> None:
    path = await _ledger_file_then(tmp_path, "DROP TABLE run_opens", "PRAGMA user_version = 4")
    async with SqliteLedger(path) as ledger:
        assert (await ledger.usage("run")).reserved == 2
        assert await ledger.open_run("r0", principal="alice", scope="proj", now=WALL, per_hour=1)
        assert not await ledger.open_run("r1", principal="alice", scope="proj", now=WALL,
                                         per_hour=1)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (SqliteLedger.schema_version,)
    finally:
        conn.close()


async def test_opening_a_run_binds_its_identity(ledger: Ledger) -> None:
    assert await ledger.open_run("run", principal="alice", scope="proj", now=WALL, per_hour=5)
    with pytest.raises(RunIdentityError):
        await ledger.bind_identity("run", principal="bob", scope="proj")
    with pytest.raises(RunIdentityError):
        await ledger.open_run("run", principal="bob", scope="proj", now=WALL, per_hour=5)
    await ledger.bind_identity("other", principal="bob", scope="proj")
    with pytest.raises(RunIdentityError):  # nothing counted for a refused opening
        await ledger.open_run("other", principal="alice", scope="proj", now=WALL, per_hour=5)
    for n in range(4):
        assert await ledger.open_run(f"r{n}", principal="alice", scope="proj", now=WALL,
                                     per_hour=5)
    assert not await ledger.open_run("r9", principal="alice", scope="proj", now=WALL,
                                     per_hour=5)


async def test_a_run_opening_says_whether_it_was_counted_now_before_or_refused(
    ledger: Ledger,
) -> None:
    from plugin.control.ledger import RunOpening

    kw: dict[str, Any] = {"principal": "alice", "scope": "proj", "per_hour": 1}
    assert await ledger.open_run("r0", now=WALL, **kw) is RunOpening.OPENED
    assert await ledger.open_run("r0", now=WALL + 1, **kw) is RunOpening.KNOWN
    refused = await ledger.open_run("r1", now=WALL + 1, **kw)
    assert refused is RunOpening.REFUSED and not refused


async def test_a_run_opened_more_than_an_hour_ago_is_known_and_never_counted_again(
    open_ledger: Callable[..., Any],
) -> None:
    """Openings older than the hour count no more, but the runs they opened still exist: a
    run already bound to the pair goes on whatever the pair opened since, and takes none of
    this hour's room. A run used without being opened (the core API binds nothing) is opened,
    and counted, by its first opening."""
    kw: dict[str, Any] = {"principal": "alice", "scope": "proj", "per_hour": 2}
    async with open_ledger() as ledger:
        assert await ledger.open_run("old", now=WALL, **kw) is RunOpening.OPENED
        _granted(await ledger.reserve("used", AUTO, 1, POLICY, WALL))  # used, never opened
    later = WALL + 2 * HOUR
    async with open_ledger() as ledger:  # another process: nothing of "old" in its memory
        assert await ledger.open_run("new1", now=later, **kw) is RunOpening.OPENED
        assert await ledger.open_run("old", now=later + 1, **kw) is RunOpening.KNOWN
        assert await ledger.open_run("used", now=later + 1, **kw) is RunOpening.OPENED
        assert await ledger.open_run("new2", now=later + 2, **kw) is RunOpening.REFUSED
        assert await ledger.open_run("used", now=later + 2, **kw) is RunOpening.KNOWN
        assert await ledger.open_run("old", now=later + 3, **kw) is RunOpening.KNOWN
        with pytest.raises(RunIdentityError):  # bound by its opening as ever
            await ledger.open_run("used", principal="bob", scope="proj", now=later + 3,
                                  per_hour=2)


@pytest.mark.parametrize("command", [["check"], ["runs"], ["show", "run-one"]])
async def test_every_ledger_command_on_a_damaged_schema_is_one_line(
    anyio_backend: object, tmp_path: Path, command: list[str]
) -> None:
    import io

    from runtime_hooks.__main__ import main

    path = tmp_path / "ledger.sqlite3"
    await _damaged(path, b"callscalls", 0xFF)
    out, err = io.StringIO(), io.StringIO()
    code = await anyio.to_thread.run_sync(  # the command runs its own event loop
        lambda: main(["ledger", "--ledger", str(path), *command], stdout=out, stderr=err))
    assert code == 1 and err.getvalue().startswith("recallbound: ")
    assert err.getvalue().count("\n") == 1 and "damaged" in err.getvalue()


async def _current(ledger: Ledger, candidate: str, at: float, principal: str = "alice",
                   prefix: str = "mcp-cell-") -> str:
    return await ledger.current_run(candidate, prefix=prefix, principal=principal,
                                    scope="proj", now=WALL + at, live_s=10.0, per_hour=60)


async def test_the_current_run_is_the_pairs_newest_live_one(ledger: Ledger) -> None:
    assert await _current(ledger, "mcp-cell-a", 0) == "mcp-cell-a"  # none yet: opened
    assert await _current(ledger, "mcp-cell-b", 5) == "mcp-cell-a"  # opened, not yet reserved
    assert await _current(ledger, "mcp-other-x", 5, prefix="mcp-other-") == "mcp-other-x"
    assert await _current(ledger, "mcp-cell-c", 5, principal="bob") == "mcp-cell-c"
    await ledger.reserve("mcp-cell-a", AUTO, 2, POLICY, WALL + 6)  # its deadline: 16 s
    assert await _current(ledger, "mcp-cell-d", 15.5) == "mcp-cell-a"
    assert await _current(ledger, "mcp-cell-d", 16.0) == "mcp-cell-d"  # a's deadline passed
    assert await _current(ledger, "mcp-cell-e", 25.5) == "mcp-cell-d"
    assert await _current(ledger, "mcp-cell-e", 26.5) == "mcp-cell-e"  # d never reserved
    assert await ledger.open_run("mcp-cell-e", principal="alice", scope="proj", now=WALL + 27,
                                 per_hour=60) is RunOpening.KNOWN  # opened once, counted once


async def test_servers_asking_at_once_get_one_current_run(
    open_ledger: Callable[..., Any]
) -> None:
    async with open_ledger() as one, open_ledger() as two:
        found: list[str] = []

        async def ask(ledger: Ledger, candidate: str) -> None:
            found.append(await _current(ledger, candidate, 0))

        async with anyio.create_task_group() as group:
            for n in range(6):
                group.start_soon(ask, (one, two)[n % 2], f"mcp-cell-{n}")
    assert len(set(found)) == 1 and len(found) == 6


async def test_a_refused_opening_binds_nothing(ledger: Ledger) -> None:
    """Refused by the hourly cap, a new run id is stored nowhere, not even bound: another
    caller may still take it, and a caller over its cap cannot grow the ledger."""
    assert await ledger.open_run("r0", principal="alice", scope="proj", now=WALL, per_hour=1)
    assert not await ledger.open_run("r1", principal="alice", scope="proj", now=WALL + 1,
                                     per_hour=1)
    await ledger.bind_identity("r1", principal="bob", scope="proj")  # free: no error
    with pytest.raises(RunIdentityError):
        await ledger.open_run("r1", principal="alice", scope="proj", now=WALL + HOUR + 1,
                              per_hour=1)
