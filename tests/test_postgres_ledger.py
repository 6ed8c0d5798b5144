"""What only PostgresLedger has: the server's clock, a pool that loses connections, timeouts,
schema creation and migration by many workers at once, its settings.

The shared contract is tests/test_ledger_contract.py. Every test here runs on asyncio and trio
against the test server (tests/_pg.py: its own schema, dropped afterwards; no skip). Tests of
the server clock compare with this host's clock, which the local server shares, by bracketing
(read before and after), never by sleeping.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Iterator
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

from plugin import PostgresLedger
from plugin.control import (
    AllowancePolicy,
    AttemptOutcome,
    AttemptTrace,
    ManualClock,
    RecallAllowance,
    RecallBudgetExceeded,
    RefusalReason,
    Reservation,
    RoundKind,
    current_permit,
)
from plugin.control._postgres_schema import MIGRATIONS, SCHEMA_VERSION
from plugin.control.ledger import CallRecord, RefusalRecord
from plugin.control.refusal import BudgetRefusal
from plugin.errors import (
    LedgerConfigError,
    LedgerCorruptError,
    LedgerError,
    LedgerLockedError,
    LedgerUnavailableError,
)

from . import _pg

pytestmark = pytest.mark.anyio

POLICY = AllowancePolicy()  # 4 searches, 2 rounds, 10 s
AUTO, DELIB = RoundKind.AUTOMATIC, RoundKind.DELIBERATE


@pytest.fixture
def schema() -> Iterator[str]:
    with _pg.fresh_schema("pg") as name:
        yield name


def _sql(statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with _pg.connect() as conn:
        cur = conn.execute(statement.encode(), params or None)
        return cur.fetchall() if cur.description else []


def _backends(schema: str) -> list[tuple[int, str, str | None]]:
    """(pid, state, wait_event) of the ledger's pooled connections."""
    return [
        (int(pid), str(state), wait)
        for pid, state, wait in _sql(
            "SELECT pid, state, wait_event FROM pg_stat_activity "
            "WHERE application_name = %s", f"recallbound-{schema}")
    ]


async def _until(condition: Any) -> None:
    """Poll for a state of the server (another connection's), not for a time."""
    with anyio.fail_after(20):
        while not await anyio.to_thread.run_sync(condition):
            await anyio.sleep(0.01)


def _granted(result: Reservation | BudgetRefusal) -> Reservation:
    assert isinstance(result, Reservation), result
    return result


async def test_the_dsn_may_name_the_schema(schema: str) -> None:
    named = f"{_pg.DSN}{'&' if '?' in _pg.DSN else '?'}schema={schema}"
    async with PostgresLedger(named) as ledger:
        async with RecallAllowance(ledger).round("r", RoundKind.AUTOMATIC):
            pass
    async with PostgresLedger(_pg.DSN, schema=schema) as same:  # the same ledger
        assert (await same.usage("r")).rounds == 1
    with pytest.raises(LedgerConfigError, match="give one"):
        PostgresLedger(named, schema="another")


# -- whose clock: the server's ----------------------------------------------------------------


@pytest.mark.parametrize("skew", [30.0, -30.0])
async def test_a_worker_30s_off_neither_gains_nor_loses_deadline(
    schema: str, skew: float
) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema) as ledger:
        honest = RecallAllowance(ledger, clock=ManualClock(wall=time.time()))
        skewed = RecallAllowance(ledger, clock=ManualClock(wall=time.time() + skew))

        # the skewed worker opens one run, the honest one another; then each resumes the
        # other's run: every time is the server's, whoever asks
        for opener, resumer, run_id in ((skewed, honest, "a"), (honest, skewed, "b")):
            before = time.time()
            async with opener.round(run_id, AUTO) as first:
                pass
            opened = time.time()
            (committed,) = await ledger.reservations(run_id)
            assert before <= committed.opened_wall <= opened
            assert committed.reserved_wall == committed.opened_wall
            assert committed.deadline_wall == committed.opened_wall + 10.0
            assert first.deadline_wall == committed.deadline_wall
            # what the permit got is the server's view: never more than deadline_s
            assert first.seconds_left() == 10.0

            async with resumer.round(run_id, DELIB, slots=2) as second:
                later = time.time()
                _, again = await ledger.reservations(run_id)
                assert opened <= again.reserved_wall <= later
                assert second.deadline_wall == committed.deadline_wall
                # no gain: at most what really remained; no loss: the same real remainder
                assert second.seconds_left() == committed.deadline_wall - again.reserved_wall
                assert 10.0 - (later - before) <= second.seconds_left() <= 10.0


async def test_by_the_callers_clock_a_worker_30s_ahead_loses_its_deadline(schema: str) -> None:
    # Why the fleet default is the server's clock: under time_source="caller", a worker whose
    # clock runs 30 s ahead finds a run another worker opened a moment ago already over.
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        honest = RecallAllowance(ledger, clock=ManualClock(wall=time.time()))
        ahead = RecallAllowance(ledger, clock=ManualClock(wall=time.time() + 30.0))
        async with honest.round("run", AUTO):
            pass
        with pytest.raises(RecallBudgetExceeded) as caught:
            async with ahead.round("run", DELIB, slots=1):
                pytest.fail("refused: the caller's clock says the deadline passed")
        assert caught.value.reason is RefusalReason.DEADLINE


async def test_the_server_clock_never_judges_below_the_floor(schema: str) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema) as ledger:
        assert ledger.time_source == "server"
        floor = time.time() + 1000.0
        first = _granted(await ledger.reserve("run", AUTO, 2, POLICY, 0.0, floor=floor))
        assert first.reserved_wall == first.opened_wall == floor
        assert first.deadline_wall == floor + 10.0
        # `now` is not the judge here: a caller's time past the deadline does not refuse
        second = _granted(await ledger.reserve("run", DELIB, 1, POLICY, floor + 99.0))
        assert first.opened_wall == second.opened_wall
        refused = await ledger.reserve("other", AUTO, 2, POLICY, 0.0, floor=lambda: floor)
        assert isinstance(refused, Reservation)
        late = await ledger.reserve("other", AUTO, 1, POLICY, 0.0, floor=floor + 10.0)
        assert isinstance(late, BudgetRefusal)
        assert late.reason is RefusalReason.DEADLINE
        (record,) = await ledger.refusals("other")
        assert record.at_wall == floor + 10.0


# -- the server unreachable, lost, or slow: fail closed ---------------------------------------


async def test_an_unreachable_server_fails_at_open(anyio_backend: object) -> None:
    ledger = PostgresLedger("postgresql://root@127.0.0.1:1/test", connect_timeout=2.0)
    with pytest.raises(LedgerUnavailableError) as caught:
        await ledger.open()
    assert isinstance(caught.value, LedgerError)
    with pytest.raises(LedgerError):  # still closed: nothing can be reserved
        await ledger.reserve("run", AUTO, 2, POLICY, 0.0)


async def test_connections_lost_while_idle_are_replaced(schema: str) -> None:
    # What a server restart looks like to an idle pool: every connection is gone.
    async with PostgresLedger(_pg.DSN, schema=schema, min_size=2, max_size=2,
                              time_source="caller") as ledger:
        _granted(await ledger.reserve("run", AUTO, 2, POLICY, 100.0))
        pids = [pid for pid, _, _ in _backends(schema)]
        assert len(pids) == 2
        _sql("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", pids)
        await _until(lambda: not set(pids) & {p for p, _, _ in _backends(schema)})
        second = _granted(await ledger.reserve("run", DELIB, 1, POLICY, 101.0))
        assert (second.round_index, second.first_slot) == (2, 3)
        assert (await ledger.usage("run")).rounds == 2


@pytest.mark.parametrize("password", [None, "Sentinel-Pw-lost"])
async def test_a_connection_lost_mid_reservation_issues_no_permit(
    schema: str, password: str | None
) -> None:
    """Also with a password in the connection string (the test server trusts any): the
    driver's error keeps its connection, whose options hold the password, so then no driver
    error stays anywhere in the typed error's chain."""
    dsn = _pg.DSN.replace("root@", f"root:{password}@") if password else _pg.DSN
    async with PostgresLedger(dsn, schema=schema, max_size=2) as ledger:
        allowance = RecallAllowance(ledger, clock=ManualClock(wall=time.time()))
        async with allowance.round("run", AUTO):
            pass
        failures: list[BaseException] = []

        async def reserve() -> None:
            try:
                async with allowance.round("run", DELIB, slots=1):
                    pytest.fail("no permit for a round whose commit was never confirmed")
            except LedgerError as exc:
                failures.append(exc)
            assert current_permit() is None

        with _pg.connect() as holder:
            # the run's lock, held elsewhere: our reservation waits inside its transaction
            holder.execute("SELECT pg_advisory_lock(%s::int4, hashtext('run'))",
                           (ledger._space,))
            async with anyio.create_task_group() as tg:
                tg.start_soon(reserve)
                await _until(lambda: any(w == "advisory" for _, _, w in _backends(schema)))
                (waiting,) = [pid for pid, _, w in _backends(schema) if w == "advisory"]
                holder.execute("SELECT pg_terminate_backend(%s)", (waiting,))
            holder.execute("SELECT pg_advisory_unlock_all()")
        (failure,) = failures
        assert isinstance(failure, LedgerUnavailableError)
        if password is not None:
            assert failure.__cause__ is None and failure.__context__ is None
            assert password not in "".join(traceback.format_exception(failure))
        usage = await ledger.usage("run")  # nothing of the lost round was committed
        assert (usage.rounds, usage.reserved, usage.refused) == (1, 2, 0)
        async with allowance.round("run", DELIB, slots=1) as permit:  # and the ledger goes on
            assert (permit.round_index, permit.first_slot) == (2, 3)


async def test_a_lock_held_beyond_lock_timeout_fails_closed(schema: str) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema, lock_timeout=0.2,
                              time_source="caller") as ledger:
        _granted(await ledger.reserve("run", AUTO, 2, POLICY, 100.0))
        with _pg.connect() as holder:
            holder.execute("SELECT pg_advisory_lock(%s::int4, hashtext('run'))",
                           (ledger._space,))
            with pytest.raises(LedgerLockedError):
                await ledger.reserve("run", DELIB, 1, POLICY, 101.0)
            allowance = RecallAllowance(ledger, clock=ManualClock(wall=101.0))
            with pytest.raises(LedgerLockedError):
                async with allowance.round("run", DELIB, slots=1):
                    pytest.fail("no permit while the ledger cannot commit")
            with pytest.raises(LedgerLockedError):
                await ledger.retain("run", ["m1"], limit=4)
            # another run is not held up
            _granted(await ledger.reserve("free", AUTO, 2, POLICY, 101.0))
        usage = await ledger.usage("run")
        assert (usage.rounds, usage.reserved) == (1, 2)
        assert not [b for b in _backends(schema) if b[1] == "idle in transaction"]


async def test_a_caller_waits_for_a_pooled_connection_at_most_pool_timeout(schema: str) -> None:
    """Every connection busy (waiting behind a held lock for up to ``lock_timeout``): the next
    caller is refused once ``pool_timeout`` has passed, on either loop, never queued behind
    the busy ones' whole lock waits."""
    async with PostgresLedger(_pg.DSN, schema=schema, max_size=1, lock_timeout=5.0,
                              pool_timeout=0.3, time_source="caller") as ledger:
        _granted(await ledger.reserve("run", AUTO, 2, POLICY, 100.0))
        outcomes: list[str] = []

        async def reserve() -> None:
            try:
                await ledger.reserve("run", DELIB, 1, POLICY, 101.0)
                outcomes.append("granted")
            except LedgerError as exc:
                outcomes.append(type(exc).__name__)

        with _pg.connect() as holder:
            holder.execute("SELECT pg_advisory_lock(%s::int4, hashtext('run'))",
                           (ledger._space,))
            async with anyio.create_task_group() as tg:
                tg.start_soon(reserve)  # takes the one connection and waits for the lock
                await _until(lambda: any(w == "advisory" for _, _, w in _backends(schema)))
                with pytest.raises(LedgerUnavailableError, match="pool_timeout"):
                    await ledger.usage("other")
                holder.execute("SELECT pg_advisory_unlock_all()")
        assert outcomes == ["granted"]


async def test_a_cancelled_reservation_leaves_no_transaction_open(schema: str) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema, max_size=1,
                              time_source="caller") as ledger:
        _granted(await ledger.reserve("run", AUTO, 2, POLICY, 100.0))
        with _pg.connect() as holder:
            holder.execute("SELECT pg_advisory_lock(%s::int4, hashtext('run'))",
                           (ledger._space,))
            async with anyio.create_task_group() as tg:
                tg.start_soon(ledger.reserve, "run", DELIB, 1, POLICY, 101.0)
                await _until(lambda: any(w == "advisory" for _, _, w in _backends(schema)))
                tg.cancel_scope.cancel()  # the transaction is shielded: it runs to its end
                holder.execute("SELECT pg_advisory_unlock_all()")
        assert [state for _, state, _ in _backends(schema)] == ["idle"]
        # the round was judged and committed whole (no refund), and the one connection is fine
        history = await ledger.reservations("run")
        assert [(r.round_index, r.first_slot, r.slots) for r in history] == [(1, 1, 2), (2, 3, 1)]


# -- schema: versioned, created once by many, migrated, foreign schemas refused ------------------


def _schema_tables(schema: str) -> list[str]:
    return [r[0] for r in _sql(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename", schema)]


async def test_eight_workers_opening_at_once_create_one_schema(schema: str) -> None:
    results: list[Reservation | BudgetRefusal] = []
    policy = AllowancePolicy(max_searches=4, max_rounds=8)

    async def worker() -> None:
        async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
            results.append(await ledger.reserve("run", DELIB, 1, policy, 100.0))

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(worker)
    assert sorted(r.first_slot for r in results if isinstance(r, Reservation)) == [1, 2, 3, 4]
    assert sum(isinstance(r, BudgetRefusal) for r in results) == 4
    assert _sql(f'SELECT application, version FROM "{schema}".recallbound_meta') == [
        ("recallbound", SCHEMA_VERSION)
    ]
    assert _schema_tables(schema) == [
        "attempts", "calls", "recallbound_meta", "refusals", "retained", "rounds",
        "run_identity", "run_opens", "runs", "validations",
    ]


async def test_a_version_6_schema_gains_call_records_tombstones_and_the_lone_statement(
    schema: str,
) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        _granted(await ledger.reserve("old", AUTO, 2, POLICY, 100.0))
    q = f'"{schema}"'
    for statement in (f"DROP TABLE {q}.calls", f"ALTER TABLE {q}.runs DROP COLUMN pruned",
                      f"DROP FUNCTION {q}.reserve_lone",
                      f"UPDATE {q}.recallbound_meta SET version = 6"):
        _sql(statement)
    record = CallRecord(run_id="old", call_id="c1", digest="d", status="ok", slot=1)
    async with PostgresLedger(_pg.DSN, schema=schema) as ledger:  # the server's clock
        assert (await ledger.usage("old")).rounds == 1
        fresh = _granted(await ledger.reserve("fresh", AUTO, 2, POLICY, 0.0))  # lone: 1 stmt
        assert fresh.round_index == 1
        await ledger.record([], [], [record])
        assert await ledger.recorded_calls("old", ["c1"]) == [record]
        report = await ledger.admin().prune(before_wall=1e6, now_wall=1e12, dry_run=False)
        assert report.run_ids == ("old",) and report.rows["calls"] == 1
        assert isinstance(await ledger.reserve("old", AUTO, 2, POLICY, 0.0), BudgetRefusal)
    assert _sql(f"SELECT version FROM {q}.recallbound_meta") == [(SCHEMA_VERSION,)]


async def test_a_version_9_schema_gains_unique_refusal_keys(schema: str) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        _granted(await ledger.reserve("old", DELIB, 1, POLICY, 100.0))
    q = f'"{schema}"'
    for statement in (f"DROP INDEX {q}.refusals_by_key",
                      f"ALTER TABLE {q}.refusals DROP COLUMN refusal_key",
                      f"UPDATE {q}.recallbound_meta SET version = 9"):
        _sql(statement)
    refusal = RefusalRecord(run_id="old", round_index=1, what="attempt", kind="deliberate",
                            reason=RefusalReason.SLOTS, at_wall=100.5, key="k")
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        for _ in range(2):  # written again, as after a commit whose acknowledgement was lost
            await ledger.record([], [refusal])
        assert await ledger.refusals("old") == [refusal]
    assert _sql(f"SELECT version FROM {q}.recallbound_meta") == [(SCHEMA_VERSION,)]


async def test_a_version_10_tombstone_left_unspent_is_spent_so_a_slow_clock_cannot_reopen_it(
    schema: str,
) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        _granted(await ledger.reserve("old", AUTO, 2, POLICY, 100.0))
        _granted(await ledger.reserve("later", AUTO, 2, POLICY, 200.0))
        report = await ledger.admin().prune(before_wall=150.0, now_wall=200.0, dry_run=False)
        assert report.run_ids == ("old",)
    q = f'"{schema}"'
    for statement in (f"UPDATE {q}.runs SET rounds = 1, reserved = 2 WHERE run_id = 'old'",
                      f"UPDATE {q}.recallbound_meta SET version = 10"):
        _sql(statement)  # an older release marked its tombstone without spending it
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        behind = await ledger.reserve("old", AUTO, 2, POLICY, 101.0)
        assert isinstance(behind, BudgetRefusal) and behind.reason is RefusalReason.ROUNDS
        assert (await ledger.usage("old")).reserved == POLICY.max_searches
    assert _sql(f"SELECT version FROM {q}.recallbound_meta") == [(SCHEMA_VERSION,)]


async def test_a_version_1_schema_is_migrated_in_place(schema: str) -> None:
    with _pg.connect() as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(
            f'CREATE TABLE "{schema}".recallbound_meta (singleton boolean PRIMARY KEY '
            "DEFAULT true CHECK (singleton), application text NOT NULL, version integer "
            "NOT NULL)".encode())
        conn.execute(f"INSERT INTO \"{schema}\".recallbound_meta (application, version) "
                     "VALUES ('recallbound', 1)".encode())
        for statement in MIGRATIONS[0]:
            conn.execute(statement.format(s=f'"{schema}"').encode())
        conn.execute(f"INSERT INTO \"{schema}\".runs VALUES ('old', 100, 110, 4, 2, 1, 2, 2)"
                     .encode())
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        second = _granted(await ledger.reserve("old", DELIB, 5, POLICY, 105.0))
        assert (second.round_index, second.first_slot, second.slots) == (2, 3, 2)
        assert second.deadline_wall == 110.0
        await ledger.retain("old", ["m1"], limit=4)
        assert (await ledger.take_validations("old", ["m1"], limit=1))["m1"].value == "granted"
        await ledger.bind_identity("old", principal="alice", scope="proj")
    assert _sql(f'SELECT principal, scope FROM "{schema}".run_identity') == [("alice", "proj")]
    assert _sql(f'SELECT version FROM "{schema}".recallbound_meta') == [(SCHEMA_VERSION,)]
    async with PostgresLedger(_pg.DSN, schema=schema) as ledger:  # and reopening is a no-op
        assert (await ledger.usage("old")).rounds == 2


async def test_a_version_6_schema_of_the_earlier_numbering_is_migrated(schema: str) -> None:
    """Ledgers written before the versions were renumbered hold the call records, the
    tombstones and ``reserve_lone`` as their version 6, and no ``run_opens`` table (today's
    version 6): they are migrated like any other, and gain the table."""
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        _granted(await ledger.reserve("old", DELIB, 1, POLICY, 100.0))
    q = f'"{schema}"'
    for statement in (f"DROP TABLE {q}.run_opens",
                      f"UPDATE {q}.recallbound_meta SET version = 6"):
        _sql(statement)
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        second = _granted(await ledger.reserve("old", DELIB, 1, POLICY, 101.0))
        assert second.round_index == 2
        _granted(await ledger.reserve("new", AUTO, 2, POLICY, 101.0))
        assert (await ledger.admin().check()).problems == ()
    assert "run_opens" in _schema_tables(schema)
    assert _sql(f"SELECT version FROM {q}.recallbound_meta") == [(SCHEMA_VERSION,)]


async def test_a_migration_step_is_not_cut_by_the_statement_timeout(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's time grows with the ledger (a column, a unique index): cut by the ledger's
    statement_timeout it would never complete on a large ledger."""
    async with PostgresLedger(_pg.DSN, schema=schema):
        pass
    _sql(f'UPDATE "{schema}".recallbound_meta SET version = {SCHEMA_VERSION - 1}')
    from plugin.control import _postgres_schema

    slow = (*MIGRATIONS[:-1], (*MIGRATIONS[-1], "SELECT pg_sleep(0.6)"))
    monkeypatch.setattr(_postgres_schema, "MIGRATIONS", slow)
    async with PostgresLedger(_pg.DSN, schema=schema, statement_timeout=0.2) as ledger:
        _granted(await ledger.reserve("run", AUTO, 2, POLICY, 0.0))
        shown = await ledger._transact(
            lambda s: s.fetchall("SELECT current_setting('statement_timeout')", {}), "test")
    assert shown == [("200ms",)]  # the ledger's own statements keep their bound
    assert _sql(f'SELECT version FROM "{schema}".recallbound_meta') == [(SCHEMA_VERSION,)]


async def test_a_foreign_schema_is_refused_and_left_untouched(schema: str) -> None:
    _sql(f'CREATE SCHEMA "{schema}"')
    _sql(f'CREATE TABLE "{schema}".notes (body text)')
    _sql(f"INSERT INTO \"{schema}\".notes VALUES ('keep me')")
    with pytest.raises(LedgerCorruptError):
        async with PostgresLedger(_pg.DSN, schema=schema):
            pytest.fail("a foreign schema must not open")
    assert _schema_tables(schema) == ["notes"]
    assert _sql(f'SELECT body FROM "{schema}".notes') == [("keep me",)]


async def test_a_newer_schema_version_is_refused(schema: str) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema):
        pass
    _sql(f'UPDATE "{schema}".recallbound_meta SET version = 99')
    with pytest.raises(LedgerCorruptError, match="version 99"):
        async with PostgresLedger(_pg.DSN, schema=schema):
            pass


# -- settings ---------------------------------------------------------------------------------


async def test_commits_are_synchronous_whatever_the_connection_default(schema: str) -> None:
    dsn = _pg.DSN + ("&" if "?" in _pg.DSN else "?") + "options=-c%20synchronous_commit%3Doff"
    with psycopg.connect(dsn, autocommit=True) as plain:
        assert plain.execute("SHOW synchronous_commit").fetchone() == ("off",)
    async with PostgresLedger(dsn, schema=schema, max_size=1, statement_timeout=3.0,
                              lock_timeout=0.5) as ledger:
        _granted(await ledger.reserve("run", AUTO, 2, POLICY, 0.0))
        shown = await ledger._transact(
            lambda s: s.fetchall(
                "SELECT current_setting('synchronous_commit'), "
                "current_setting('statement_timeout'), current_setting('lock_timeout')", {}),
            "test",
        )
    assert shown == [("on", "3s", "500ms")]


@pytest.mark.parametrize(
    "options",
    [
        {"schema": "Public; DROP TABLE x"}, {"schema": ""}, {"schema": "a" * 64},
        {"schema": 3}, {"time_source": "worker"}, {"min_size": 5, "max_size": 2},
        {"max_size": 0}, {"lock_timeout": 0}, {"statement_timeout": float("nan")},
        {"pool_timeout": -1.0},
    ],
)
def test_invalid_settings_are_refused_at_construction(options: dict[str, Any]) -> None:
    with pytest.raises(LedgerConfigError) as caught:
        PostgresLedger(_pg.DSN, **options)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(LedgerConfigError):
        PostgresLedger("")


# -- group commit: one trip to the server, one hop to a worker thread ---------------------------


@pytest.mark.parametrize("time_source", ["server", "caller"])
async def test_a_batch_crosses_to_a_worker_thread_once_per_trip(
    schema: str, anyio_backend_name: str, time_source: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema, time_source=time_source) as ledger:
        _granted(await ledger.reserve("warm", AUTO, 1, POLICY, 100.0))
        batches: list[int] = []
        inner = ledger._group.run

        async def spy(batch: Any) -> Any:
            batches.append(len(batch))
            return await inner(batch)

        ledger._group.run = spy
        hops: list[str] = []
        real = anyio.to_thread.run_sync

        async def counted(fn: Any, *args: Any, **options: Any) -> Any:
            hops.append(getattr(fn, "__name__", repr(fn)))
            return await real(fn, *args, **options)

        monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
        async with anyio.create_task_group() as tg:
            for i in range(60):
                tg.start_soon(ledger.reserve, f"run-{i % 20}", DELIB, 1, POLICY, 100.0)
        monkeypatch.setattr(anyio.to_thread, "run_sync", real)
        assert sum(batches) == 60 and max(batches) > 1
        if anyio_backend_name == "asyncio":
            assert hops == []  # psycopg's own async connections: no thread at all
        else:
            # Per batch, by the server's clock: one hop (checkout, the whole transaction in one
            # trip, return). By the callers' clocks, read between the locks and the rounds: a
            # checkout, two trips, a return.
            per_batch = 1 if time_source == "server" else 4
            assert len(hops) == len(batches) * per_batch, hops
        for i in range(20):  # three requests per run, in batches: exactly judged
            usage = await ledger.usage(f"run-{i}")
            assert (usage.rounds, usage.reserved, usage.refused) == (2, 2, 1)


@pytest.mark.parametrize("time_source", ["server", "caller"])
async def test_every_reservation_and_trace_write_commits_synchronously(
    schema: str, time_source: str
) -> None:
    # The connection's default is off; a trigger records the setting each write runs under.
    dsn = _pg.DSN + ("&" if "?" in _pg.DSN else "?") + "options=-c%20synchronous_commit%3Doff"
    async with PostgresLedger(dsn, schema=schema, time_source=time_source) as ledger:
        _sql(f'CREATE TABLE "{schema}".seen (tab text, setting text)')
        _sql(f"""CREATE FUNCTION "{schema}".note() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN
                     INSERT INTO "{schema}".seen
                     VALUES (TG_TABLE_NAME, current_setting('synchronous_commit'));
                     RETURN NEW;
                 END $$""")
        for table in ("runs", "attempts", "retained"):
            _sql(f'CREATE TRIGGER note AFTER INSERT OR UPDATE ON "{schema}".{table} '
                 f'FOR EACH ROW EXECUTE FUNCTION "{schema}".note()')
        reservation = _granted(await ledger.reserve("run", AUTO, 2, POLICY, 100.0))
        await ledger.record([AttemptTrace(
            attempt_id="a", run_id="run", round_index=1, slot=reservation.first_slot,
            kind="automatic", outcome=AttemptOutcome.OK, started_wall=100.0, elapsed_s=0.1)], [])
        await ledger.retain("run", ["m1"], limit=4)
    assert sorted(_sql(f'SELECT tab, setting FROM "{schema}".seen')) == [
        ("attempts", "on"), ("retained", "on"), ("runs", "on")]


async def test_a_connection_killed_as_it_is_lent_fails_one_call_closed_then_is_replaced(
    schema: str,
) -> None:
    # No wait for the server to finish terminating: the pool's check may lend the connection
    # before its farewell arrives. That one call fails closed (documented in docs/fleet.md);
    # the next one always gets a live connection.
    async with PostgresLedger(_pg.DSN, schema=schema, min_size=1, max_size=1,
                              time_source="caller") as ledger:
        _granted(await ledger.reserve("seed", AUTO, 1, POLICY, 100.0))
        for attempt in range(6):
            run = f"run-{attempt}"
            pids = [pid for pid, _, _ in _backends(schema)]
            _sql("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", pids)
            with contextlib.suppress(LedgerUnavailableError):  # no permit either way
                _granted(await ledger.reserve(run, AUTO, 1, POLICY, 100.0))
            second = _granted(await ledger.reserve(run, DELIB, 1, POLICY, 101.0))
            assert second.round_index in (1, 2)
            assert (await ledger.usage(run)).rounds == second.round_index


@pytest.mark.parametrize(("dsn", "expected"), [
    ("host=127.0.0.1 dbname=db connect_timeout=3", None),
    ("postgresql://u@127.0.0.1/db?connect_timeout=3", None),
    ("host=127.0.0.1 dbname=db", 7),
    # libpq waits forever for 0 or a negative number: the ledger's own bound instead
    ("host=127.0.0.1 dbname=db connect_timeout=0", 7),
    ("postgresql://u@127.0.0.1/db?connect_timeout=-5", 7),
])
async def test_a_dsns_own_connect_timeout_is_passed_on_unchanged(
    dsn: str, expected: int | None
) -> None:
    """The DSN's own ``connect_timeout`` stands (libpq reads it); ``connect_timeout=`` fills in
    only where the DSN names none."""
    from plugin.control._postgres import make_driver

    driver = make_driver(dsn, min_size=1, max_size=1, connect_timeout=7.0, pool_timeout=1.0,
                         statement_timeout=3.0, name="t")
    assert driver._probe[1].get("connect_timeout") == expected  # type: ignore[attr-defined]
