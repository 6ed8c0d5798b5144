"""The contract of :class:`~plugin.control.ledger_admin.LedgerAdmin`, on asyncio and trio.

Every test takes ``pair`` (an opened ledger and its admin) and runs against each kind in
:data:`ADMIN_KINDS`: SQLite (a file) and PostgreSQL (a schema of its own on the test server,
dropped afterwards; judged by the caller's explicit times; directly and through PgBouncer in
transaction mode) and the in-memory test double, each admin from ``admin_for`` (every ledger's
``admin()``). The tests that damage a ledger with SQL take ``sql_pair``: the SQL ledgers only.
Times are explicit wall values (``WALL``), as in the ledger contract.
tests/test_postgres_admin.py has the PostgreSQL-only admin tests (the server's clock, locks).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest

from plugin.control import (
    AllowancePolicy,
    AttemptOutcome,
    AttemptTrace,
    Ledger,
    PostgresLedger,
    RefusalReason,
    Reservation,
    RoundKind,
    SqliteLedger,
    Usage,
    Validity,
)
from plugin.control.ledger import CallRecord
from plugin.control.ledger_admin import (
    PRUNED_TABLES,
    LedgerAdmin,
    PruneReport,
    RunStatus,
    RunSummary,
)
from plugin.control.refusal import BudgetRefusal
from plugin.errors import LedgerCorruptError
from runtime_hooks.ledgers import admin_for

from ._fakes import MemoryLedger, MemoryStore
from ._pg import DSN, connect, fresh_schema, pooled_dsn

pytestmark = pytest.mark.anyio

WALL = 1_700_000_000.0
POLICY = AllowancePolicy()  # 4 searches, 2 rounds, 10 s
AUTO, DELIB = RoundKind.AUTOMATIC, RoundKind.DELIBERATE

SQL_KINDS = ["sqlite", "postgres", "postgres-pgbouncer"]
"""The SQL ledgers: the tests that damage a ledger behind its back (``sql_pair``) run on these."""
ADMIN_KINDS = [*SQL_KINDS, "memory"]
"""Every ledger whose admin the contract runs against."""


@attrs.frozen
class Pair:
    ledger: Ledger
    admin: LedgerAdmin
    raw: Callable[[str], None]
    """Run one SQL statement on the ledger's tables behind its back (to damage it); only for
    the SQL ledgers (``sql_pair``)."""


def _raw_sqlite(path: Path) -> Callable[[str], None]:
    def run(statement: str) -> None:
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute(statement)
        conn.close()

    return run


def _raw_postgres(schema: str) -> Callable[[str], None]:
    def run(statement: str) -> None:
        with connect() as conn:
            conn.execute(f"SET search_path TO {schema}")
            conn.execute(statement.encode())

    return run


@asynccontextmanager
async def _open(kind: str, tmp_path: Path) -> AsyncIterator[Pair]:
    if kind == "sqlite":
        path = tmp_path / "ledger.sqlite3"
        async with SqliteLedger(path) as ledger:
            yield Pair(ledger, admin_for(ledger), _raw_sqlite(path))
        return
    if kind.startswith("postgres"):
        # Through PgBouncer in transaction mode too: no session state may be relied on.
        dsn = pooled_dsn() if kind == "postgres-pgbouncer" else DSN
        with fresh_schema("admin") as schema:
            # The contract's explicit times are the caller's: judge by them.
            async with PostgresLedger(dsn, schema=schema, time_source="caller") as ledger:
                yield Pair(ledger, admin_for(ledger), _raw_postgres(schema))
        return
    if kind == "memory":
        async with MemoryLedger.over(MemoryStore()) as ledger:
            yield Pair(ledger, admin_for(ledger), _no_sql)
        return
    raise AssertionError(f"unknown ledger kind {kind!r}")


def _no_sql(statement: str) -> None:
    raise AssertionError("the in-memory ledger has no SQL: damage tests take `sql_pair`")


@pytest.fixture(params=ADMIN_KINDS)
async def pair(anyio_backend: object, request: pytest.FixtureRequest,
               tmp_path: Path) -> AsyncIterator[Pair]:
    async with _open(str(request.param), tmp_path) as opened:
        yield opened


@pytest.fixture(params=SQL_KINDS)
async def sql_pair(anyio_backend: object, request: pytest.FixtureRequest,
                   tmp_path: Path) -> AsyncIterator[Pair]:
    async with _open(str(request.param), tmp_path) as opened:
        yield opened


def _trace(run_id: str, slot: int, *, at: float, round_index: int = 1,
           legacy: bool = False) -> AttemptTrace:
    return AttemptTrace(
        attempt_id=f"{run_id}-{slot}-{legacy}", run_id=run_id, round_index=round_index,
        slot=slot, kind="deliberate", outcome=AttemptOutcome.OK, started_wall=at,
        elapsed_s=0.5, strategy="baseline", fingerprint="f" * 64, legacy=legacy,
    )


async def _run(ledger: Ledger, run_id: str, opened: float, *, attempts: int = 1,
               policy: AllowancePolicy = POLICY) -> None:
    """A run opened at ``opened`` with one automatic round and ``attempts`` attempts."""
    result = await ledger.reserve(run_id, AUTO, 2, policy, opened)
    assert isinstance(result, Reservation)
    await ledger.record([_trace(run_id, s, at=opened + s / 10) for s in range(1, attempts + 1)],
                        [])


# -- runs and run ------------------------------------------------------------------------------


async def test_runs_lists_the_most_recently_opened_first_with_totals(pair: Pair) -> None:
    await _run(pair.ledger, "a", WALL)
    await _run(pair.ledger, "b", WALL + 100, attempts=2)
    assert isinstance(await pair.ledger.reserve("b", DELIB, 5, POLICY, WALL + 101), Reservation)
    refused = await pair.ledger.reserve("b", DELIB, 1, POLICY, WALL + 102)  # 3rd round
    assert not isinstance(refused, Reservation)
    runs = await pair.admin.runs(limit=10)
    assert runs == [
        RunSummary(run_id="b", opened_wall=WALL + 100, deadline_wall=WALL + 110, rounds=2,
                   max_rounds=2, reserved=4, max_searches=4, executed=2, refused=1),
        RunSummary(run_id="a", opened_wall=WALL, deadline_wall=WALL + 10, rounds=1,
                   max_rounds=2, reserved=2, max_searches=4, executed=1, refused=0),
    ]
    assert [r.run_id for r in await pair.admin.runs(limit=1)] == ["b"]


async def test_legacy_attempts_are_not_counted_as_executed(pair: Pair) -> None:
    await _run(pair.ledger, "a", WALL)
    await pair.ledger.record([_trace("a", 1, at=WALL, round_index=0, legacy=True)], [])
    (summary,) = await pair.admin.runs(limit=5)
    assert summary.executed == 1


async def test_runs_rejects_a_limit_below_one(pair: Pair) -> None:
    with pytest.raises(ValueError, match="limit"):
        await pair.admin.runs(limit=0)


async def test_run_is_none_for_an_unknown_run(pair: Pair) -> None:
    await _run(pair.ledger, "a", WALL)
    assert await pair.admin.run("nope") is None
    summary = await pair.admin.run("a")
    assert summary is not None and (summary.run_id, summary.rounds) == ("a", 1)


async def test_status_follows_deadline_and_limits(pair: Pair) -> None:
    await _run(pair.ledger, "a", WALL)
    summary = await pair.admin.run("a")
    assert summary is not None
    assert summary.status(WALL + 1) is RunStatus.OPEN
    assert summary.status(WALL + 10) is RunStatus.FINISHED  # a round at the deadline is refused
    assert isinstance(await pair.ledger.reserve("a", DELIB, 2, POLICY, WALL + 2), Reservation)
    spent = await pair.admin.run("a")
    assert spent is not None and spent.status(WALL + 3) is RunStatus.EXHAUSTED


# -- prune -------------------------------------------------------------------------------------


async def _populate(ledger: Ledger) -> None:
    """old (deadline WALL+10), mid (WALL+1000+10), live (deadline WALL+5000+3600)."""
    await _run(ledger, "old", WALL, attempts=2)
    await ledger.retain("old", ["m1", "m2"], limit=4)
    assert (await ledger.take_validations("old", ["m1"], limit=2)) == {"m1": Validity.GRANTED}
    refused = await ledger.reserve("old", DELIB, 1, POLICY, WALL + 50)  # past the deadline
    assert not isinstance(refused, Reservation) and refused.reason is RefusalReason.DEADLINE
    await _run(ledger, "mid", WALL + 1000)
    await _run(ledger, "live", WALL + 5000, policy=attrs.evolve(POLICY, deadline_s=3600.0))
    await ledger.retain("live", ["m3"], limit=4)


async def test_prune_removes_every_trace_of_finished_runs_older_than_the_cutoff(
    pair: Pair,
) -> None:
    await _populate(pair.ledger)
    report = await pair.admin.prune(before_wall=WALL + 500, now_wall=WALL + 5001,
                                    dry_run=False)
    assert report == PruneReport(
        before_wall=WALL + 500, now_wall=WALL + 5001, dry_run=False, run_ids=("old",),
        rows={"runs": 1, "rounds": 1, "attempts": 2, "refusals": 1, "retained": 2,
              "validations": 1, "calls": 0},
    )
    assert tuple(report.rows) == PRUNED_TABLES
    # What stays is the run's tombstone: its limits, all spent, so it never reopens.
    assert await pair.ledger.usage("old") == Usage(
        run_id="old", rounds=POLICY.max_rounds, reserved=POLICY.max_searches,
        deadline_wall=WALL + 10)
    assert await pair.ledger.reservations("old") == []
    assert await pair.ledger.attempts("old") == []
    assert await pair.ledger.refusals("old") == []
    # Retained evidence went with the run: a re-check finds nothing retained.
    assert await pair.ledger.take_validations("old", ["m1"], limit=2) == {
        "m1": Validity.NOT_RETAINED}
    assert [r.run_id for r in await pair.admin.runs(limit=10)] == ["live", "mid"]
    assert (await pair.ledger.usage("mid")).executed == 1
    assert await pair.ledger.take_validations("live", ["m3"], limit=2) == {
        "m3": Validity.GRANTED}


async def test_prune_never_removes_a_run_whose_deadline_has_not_passed(pair: Pair) -> None:
    await _populate(pair.ledger)
    # A cutoff in the future asks for everything; "live" (deadline WALL+8600) must stay.
    report = await pair.admin.prune(before_wall=WALL + 10**6, now_wall=WALL + 5001,
                                    dry_run=False)
    assert report.run_ids == ("old", "mid")
    assert [r.run_id for r in await pair.admin.runs(limit=10)] == ["live"]
    # At the deadline exactly, the run is finished (a round then is refused): prunable, once
    # the ledger itself has recorded that time.
    await _run(pair.ledger, "later", WALL + 8600)
    report = await pair.admin.prune(before_wall=WALL + 8600.5, now_wall=WALL + 8600,
                                    dry_run=False)
    assert report.run_ids == ("live",)


async def test_prune_by_an_operator_clock_ahead_never_removes_a_live_run(pair: Pair) -> None:
    # The workers recorded times up to WALL + 0.1; the run's deadline is WALL + 600. An
    # operator whose clock is an hour ahead asks to prune everything finished by then.
    await _run(pair.ledger, "live", WALL, policy=attrs.evolve(POLICY, deadline_s=600.0))
    report = await pair.admin.prune(before_wall=WALL + 3600, now_wall=WALL + 3600,
                                    dry_run=False)
    assert report.run_ids == ()
    assert (await pair.ledger.usage("live")).rounds == 1
    # Once the ledger's own records pass the deadline (a later run opened), it is finished.
    await _run(pair.ledger, "next", WALL + 600)
    report = await pair.admin.prune(before_wall=WALL + 3600, now_wall=WALL + 3600,
                                    dry_run=False)
    assert report.run_ids == ("live",)


async def test_prune_ignores_a_non_finite_recorded_time(sql_pair: Pair) -> None:
    pair = sql_pair
    # A doctored far-future time must not make the ledger's own clock run ahead.
    await _run(pair.ledger, "live", WALL, policy=attrs.evolve(POLICY, deadline_s=600.0))
    pair.raw("INSERT INTO refusals (run_id, round_index, what, kind, reason, at_wall) "
             "VALUES ('live', NULL, 'round', 'automatic', 'deadline', '+Infinity')"
             if isinstance(pair.ledger, PostgresLedger) else
             "INSERT INTO refusals (run_id, round_index, what, kind, reason, at_wall) "
             "VALUES ('live', NULL, 'round', 'automatic', 'deadline', 1e999)")
    report = await pair.admin.prune(before_wall=WALL + 3600, now_wall=WALL + 3600,
                                    dry_run=True)
    assert report.run_ids == ()


async def test_prune_dry_run_reports_and_removes_nothing(pair: Pair) -> None:
    await _populate(pair.ledger)
    before = await pair.admin.runs(limit=10)
    dry = await pair.admin.prune(before_wall=WALL + 2000, now_wall=WALL + 5001, dry_run=True)
    assert dry.dry_run and dry.run_ids == ("old", "mid")
    assert dry.rows == {"runs": 2, "rounds": 2, "attempts": 3, "refusals": 1, "retained": 2,
                        "validations": 1, "calls": 0}
    assert await pair.admin.runs(limit=10) == before
    real = await pair.admin.prune(before_wall=WALL + 2000, now_wall=WALL + 5001, dry_run=False)
    assert (real.run_ids, dict(real.rows)) == (dry.run_ids, dict(dry.rows))


async def test_prune_with_nothing_to_remove(pair: Pair) -> None:
    report = await pair.admin.prune(before_wall=WALL, now_wall=WALL, dry_run=False)
    assert report.run_ids == () and set(report.rows.values()) == {0}


async def test_a_pruned_run_id_stays_refused(pair: Pair) -> None:
    # A prune leaves a spent tombstone: a pruned run id never opens a fresh allowance, on
    # any clock (one far behind included: the times that judged the run are pruned too).
    await _run(pair.ledger, "a", WALL)
    await _run(pair.ledger, "b", WALL + 20)
    report = await pair.admin.prune(before_wall=WALL + 20, now_wall=WALL + 20, dry_run=False)
    assert report.run_ids == ("a",)
    for at in (WALL - 10**6, WALL + 1, WALL + 30, WALL + 10**6):
        again = await pair.ledger.reserve("a", AUTO, 2, POLICY, at)
        assert isinstance(again, BudgetRefusal) and again.reason is RefusalReason.ROUNDS
        assert (again.reserved, again.executed) == (POLICY.max_searches, 0)
    assert await pair.admin.run("a") is None
    assert [r.run_id for r in await pair.admin.runs(limit=10)] == ["b"]
    # Pruned again later (its refusals go), it is still one tombstone, still refused. What
    # was sent to "a" since its prune goes with that later prune.
    sent_since = len(await pair.ledger.refusals("a"))
    await _run(pair.ledger, "c", WALL + 10**6 + 20)
    report = await pair.admin.prune(before_wall=WALL + 10**7, now_wall=WALL + 10**7,
                                    dry_run=False)
    assert report.run_ids == ("b",) and report.rows["refusals"] == sent_since
    assert await pair.ledger.refusals("a") == []
    again = await pair.ledger.reserve("a", DELIB, 1, POLICY, WALL + 10**6 + 30)
    assert isinstance(again, BudgetRefusal)
    assert (await pair.ledger.usage("a")).rounds == POLICY.max_rounds


# -- check -------------------------------------------------------------------------------------


async def test_check_passes_on_a_sound_ledger(pair: Pair) -> None:
    await _populate(pair.ledger)
    result = await pair.admin.check()
    assert result.problems == ()
    assert result.ok and result.schema_version == result.expected_version


async def test_check_verifies_each_recorded_call_outcome(pair: Pair) -> None:
    await _populate(pair.ledger)

    def call(run_id: str, call_id: str, status: str, slot: int | None) -> CallRecord:
        return CallRecord(run_id=run_id, call_id=call_id, digest="d", status=status, slot=slot,
                          reason=None if status == "ok" else "slots", evidence_ids=("m1",))

    # Sound: an ok call on an executed attempt's slot, a refusal where the run has one.
    await pair.ledger.record([], [], [call("old", "c1", "ok", 1),
                                      call("old", "c2", "refused", None)])
    assert (await pair.admin.check()).problems == ()
    # Each kind of mismatch: a slot no attempt holds, a search outcome without a slot, a
    # refusal on a run that was never refused.
    await pair.ledger.record([], [], [call("mid", "c3", "ok", 2),
                                      call("mid", "c4", "failed", None),
                                      call("mid", "c5", "refused", None)])
    result = await pair.admin.check()
    assert not result.ok
    assert set(result.problems) == {
        "run mid: call c3 is recorded on slot 2, which no executed attempt of the run holds",
        "run mid: call c4 is recorded as failed without a slot",
        "run mid: call c5 is recorded as refused, but the run has no refusal",
    }


async def test_check_reports_each_broken_invariant(sql_pair: Pair) -> None:
    pair = sql_pair
    await _populate(pair.ledger)
    pair.raw("UPDATE runs SET reserved = 9 WHERE run_id = 'old'")
    pair.raw("UPDATE runs SET rounds = 3 WHERE run_id = 'mid'")
    pair.raw("DELETE FROM runs WHERE run_id = 'live'")
    pair.raw("INSERT INTO validations VALUES ('ghost', 1)")
    result = await pair.admin.check()
    assert not result.ok and result.schema_version == result.expected_version
    assert set(result.problems) == {
        "run old: its rounds granted 2 slots but the run counts 9 reserved",
        "run old: 9 slots reserved, over its limit of 4",
        "run mid: 1 rounds recorded but the run counts 3",
        "run mid: 3 rounds, over its limit of 2",
        "run live: attempt live-1-False holds slot 1, which the run never reserved",
        "run live: 1 round rows but no run",
        "run live: 1 retained evidence rows but no run",
        "run ghost: a validation count (1) but no run",
    }


async def test_check_reports_a_slot_the_run_never_reserved(pair: Pair) -> None:
    await _run(pair.ledger, "a", WALL)
    await pair.ledger.record([_trace("a", 3, at=WALL + 1)], [])  # reserved: slots 1-2
    (problem,) = (await pair.admin.check()).problems
    assert problem == "run a: attempt a-3-False holds slot 3, which the run never reserved"


async def test_check_says_what_it_checked(sql_pair: Pair) -> None:
    result = await sql_pair.admin.check()
    assert result.ok and "the schema version" in result.checked
    storage = ("storage integrity (PRAGMA integrity_check)" if
               isinstance(sql_pair.ledger, SqliteLedger) else "the schema's tables")
    assert result.checked[0] == storage
    invariants = result.checked[-1]
    assert invariants.startswith("the ledger's invariants (")
    for what in ("no run executed more attempts than it reserved slots",
                 "no round executed more attempts than its slots", "no slot used twice in a run",
                 "every stored time is finite", "every attempt holds a slot its run reserved"):
        assert what in invariants
    assert not any("; " in item for item in result.checked)  # the CLI joins them with "; "


async def test_check_reports_more_attempts_than_reserved_slots(sql_pair: Pair) -> None:
    pair = sql_pair
    await _run(pair.ledger, "a", WALL, attempts=2)  # round 1: slots 1-2
    # A third executed attempt in round 1 (slot 2 again: the run reserved only 2).
    pair.raw("INSERT INTO attempts SELECT 'a-extra', run_id, round_index, 2, kind, strategy, "
             "fingerprint, outcome, started_wall, elapsed_s, legacy, dropped FROM attempts "
             "WHERE attempt_id = 'a-2-False'")
    assert set((await pair.admin.check()).problems) == {
        "run a: 3 attempts executed, over its 2 reserved slots",
        "run a: round 1 executed 3 attempts, over its 2 slots",
        "run a: slot 2 used by 2 attempts",
    }


async def test_check_reports_more_attempts_in_a_round_than_its_slots(sql_pair: Pair) -> None:
    pair = sql_pair
    await _run(pair.ledger, "a", WALL, attempts=2)  # round 1: slots 1-2
    assert isinstance(await pair.ledger.reserve("a", DELIB, 2, POLICY, WALL + 1), Reservation)
    # The run's totals add up (2 executed of 4 reserved), but round 1's grant shrank to 1.
    pair.raw("UPDATE rounds SET slots = 1 WHERE run_id = 'a' AND round_index = 1")
    pair.raw("UPDATE rounds SET slots = 3, first_slot = 2 WHERE run_id = 'a' "
             "AND round_index = 2")
    assert (await pair.admin.check()).problems == (
        "run a: round 1 executed 2 attempts, over its 1 slots",)


async def test_check_reports_a_slot_used_twice(sql_pair: Pair) -> None:
    pair = sql_pair
    await _run(pair.ledger, "a", WALL, attempts=1)
    pair.raw("UPDATE runs SET reserved = 4, rounds = 2 WHERE run_id = 'a'")
    pair.raw("INSERT INTO rounds SELECT run_id, 2, kind, 2, 3, 2, 1, reserved_wall FROM rounds "
             "WHERE run_id = 'a'")
    await pair.ledger.record([attrs.evolve(_trace("a", 1, at=WALL + 1), attempt_id="a-again",
                                           round_index=2)], [])
    assert (await pair.admin.check()).problems == ("run a: slot 1 used by 2 attempts",)


async def test_check_reports_non_finite_stored_times(sql_pair: Pair) -> None:
    pair = sql_pair
    await _run(pair.ledger, "a", WALL)
    await _run(pair.ledger, "b", WALL)
    infinity = "'Infinity'::float8" if isinstance(pair.ledger, PostgresLedger) else "1e999"
    pair.raw(f"UPDATE runs SET deadline_wall = {infinity} WHERE run_id = 'a'")
    pair.raw(f"UPDATE attempts SET elapsed_s = -{infinity} WHERE run_id = 'b'")
    pair.raw(f"UPDATE rounds SET reserved_wall = {infinity} WHERE run_id = 'b'")
    problems = set((await pair.admin.check()).problems)
    assert problems == {
        "run a: runs.deadline_wall is inf, not a finite time",
        "run b: attempts.elapsed_s is -inf, not a finite time",
        "run b: rounds.reserved_wall is inf, not a finite time",
    }


async def test_check_reports_the_schema_version(sql_pair: Pair) -> None:
    pair = sql_pair
    await _run(pair.ledger, "a", WALL)
    current = (await pair.admin.check()).schema_version
    assert current == type(pair.ledger).schema_version  # type: ignore[attr-defined]
    if isinstance(pair.ledger, SqliteLedger):
        pair.raw("PRAGMA user_version = 1")
    else:
        pair.raw("UPDATE recallbound_meta SET version = 1")
    result = await pair.admin.check()
    assert (result.schema_version, result.expected_version, result.ok) == (1, current, False)


async def test_check_reports_a_call_whose_recorded_outcome_is_damaged(sql_pair: Pair) -> None:
    from plugin.control.ledger import CallRecord

    pair = sql_pair
    await _run(pair.ledger, "a", WALL)
    await pair.ledger.record([], [], [CallRecord(run_id="a", call_id="c1", digest="d",
                                                 status="ok", slot=1, evidence_ids=("m1",))])
    assert (await pair.admin.check()).ok
    pair.raw("UPDATE calls SET evidence = '[\"m1\"' WHERE call_id = 'c1'")  # a torn JSON text
    result = await pair.admin.check()
    assert not result.ok
    assert any("'c1'" in problem and "damaged" in problem for problem in result.problems)


@pytest.mark.parametrize("damage", [
    {1: None}, {2: None}, {3: None}, {0: None}, {1: "soon"}, {4: 2.5}, {8: True}, {7: "3"},
])
def test_a_damaged_run_row_is_a_typed_corruption_not_a_crash(damage: dict[int, object]) -> None:
    # A damaged page can read back as NULLs or wrong types where the schema forbids them:
    # listing the runs says the ledger is damaged (one typed error), never a TypeError.
    row: list[object] = ["run-1", 1_800_000_000.0, 1_800_000_010.0, 1, 2, 1, 4, 1, 0]
    assert RunSummary.from_row(row).run_id == "run-1"
    assert RunSummary.from_row([*row[:2], float("inf"), *row[3:]]).deadline_wall == float("inf")
    for column, value in damage.items():
        row[column] = value
    with pytest.raises(LedgerCorruptError, match="damaged"):
        RunSummary.from_row(row)
