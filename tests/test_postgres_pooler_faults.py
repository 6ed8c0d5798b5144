"""What a fleet meets through PgBouncer in transaction mode, and what every call still answers.

Each scenario drives one ledger (or a few: a fleet's workers) through the tests' PgBouncer
(tests/_pg.py: a server pool of two) into a fault: a task cancelled while its transaction
waits behind another connection's lock, ``lock_timeout`` and ``statement_timeout`` firing,
the server ending the pooler's connections in the middle of a two-trip transaction or between
operations, more transactions than the pooler has servers, batches of hundreds, and hostile
text in every value sent as one client-quoted query. After each: every answer is right and
typed (a :class:`~plugin.errors.LedgerError`, never a driver's error, never a hang), no
server connection of the pooler stays lent to the ledger's idle clients, and no run is ever
granted more than its allowance.

A task waits for what the server shows (a lock wait in ``pg_locks``, clients queued in
PgBouncer's ``SHOW POOLS``), never for a fixed time.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import attrs
import psycopg
import pytest

from plugin import AllowancePolicy
from plugin.control.ledger import (
    AttemptOutcome,
    AttemptTrace,
    CallRecord,
    Reservation,
    RoundKind,
)
from plugin.control.postgres_ledger import PostgresLedger
from plugin.control.refusal import BudgetRefusal, RefusalReason
from plugin.errors import (
    InvalidArgumentError,
    LedgerError,
    LedgerLockedError,
    LedgerUnavailableError,
)

from . import _pg
from .test_postgres_pooler import _servers_lent

pytestmark = pytest.mark.anyio

POLICY = AllowancePolicy()  # two rounds, four searches
T = 1_700_000_000.0
SOURCES = ["server", "caller"]


@pytest.fixture
def schema() -> Iterator[str]:
    with _pg.fresh_schema("pgbfault") as name:
        yield name


def _app(schema: str) -> str:
    return f"recallbound-{schema}"


def _ledger(schema: str, time_source: Any = "caller", **kw: Any) -> PostgresLedger:
    return PostgresLedger(_pg.pooled_dsn(), schema=schema, time_source=time_source, **kw)


def _lock_waits(schema: str) -> int:
    """Server sessions of the ledger (through PgBouncer) waiting for a lock."""
    with _pg.connect() as conn:
        (count,), = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE NOT l.granted AND a.application_name = %s", (_app(schema),)).fetchall()
    return int(count)


def _clients_waiting() -> int:
    """Clients PgBouncer has queued for a server of the test database."""
    admin = urllib.parse.urlsplit(_pg.pooled_dsn())._replace(path="/pgbouncer").geturl()
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute("SHOW POOLS", prepare=False)
        names = [column.name for column in cur.description or ()]
        pools = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    return sum(int(p["cl_waiting"]) for p in pools if p["database"] == "test")


async def _until(seen: Callable[[], bool]) -> None:
    """Wait, bounded, until ``seen()`` (a look at the server) says yes."""
    with anyio.fail_after(30):
        while not seen():
            await anyio.sleep(0.02)


def _terminate(schema: str, state: str | None = None) -> int:
    """End the server connections of the ledger (PgBouncer's, behind its clients), waiting
    until each has ended: those in ``state`` only, if given."""
    query = ("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
             " WHERE application_name = %s AND pid <> pg_backend_pid()")
    params: tuple[Any, ...] = (_app(schema),)
    if state is not None:
        query += " AND state = %s"
        params += (state,)
    with _pg.connect() as conn:
        return len(conn.execute(query, params).fetchall())


class _Holder:
    """Another connection (straight to the server) holding a run's reservation lock."""

    def __init__(self, ledger: PostgresLedger, run_id: str) -> None:
        self._conn = _pg.connect()
        self._conn.execute("SELECT pg_advisory_lock(%s::int4, hashtext(%s))",
                           (ledger._space, run_id))

    def release(self) -> None:
        if not self._conn.closed:
            self._conn.execute("SELECT pg_advisory_unlock_all()")
            self._conn.close()


def _trace(run_id: str, attempt_id: str, **kw: Any) -> AttemptTrace:
    return AttemptTrace(attempt_id=attempt_id, run_id=run_id, round_index=1, slot=1,
                        kind="search", outcome=AttemptOutcome.OK, started_wall=T,
                        elapsed_s=0.5, **kw)


async def _idle_and_whole(ledger: PostgresLedger, schema: str, run_id: str = "after") -> None:
    """The next calls on ``ledger`` are answered, and then it holds no server of PgBouncer."""
    with anyio.fail_after(30):
        granted = await ledger.reserve(run_id, RoundKind.AUTOMATIC, 2, POLICY, T)
        assert isinstance(granted, Reservation), granted
        await ledger.record([_trace(run_id, f"{run_id}-a")], [])
        assert [a.attempt_id for a in await ledger.attempts(run_id)] == [f"{run_id}-a"]
        assert (await ledger.usage(run_id)).rounds == 1
    assert _servers_lent(_app(schema)) == 0


# -- cancelled while the transaction is in flight ----------------------------------------------


@pytest.mark.parametrize("time_source", SOURCES)
async def test_pgbouncer_a_reservation_cancelled_behind_a_held_lock_commits_once(
    schema: str, time_source: Any
) -> None:
    """Cancelled while its transaction waits for the run's lock: the transaction still ends
    (shielded, then committed), a request queued behind it and cancelled is never sent, and
    the run never gets more rounds than the policy's."""
    async with _ledger(schema, time_source, max_size=4, lock_timeout=20.0) as ledger:
        assert isinstance(await ledger.reserve("run", RoundKind.AUTOMATIC, 2, POLICY, T),
                          Reservation)
        holder = _Holder(ledger, "run")
        seen: list[object] = []
        in_flight, queued = anyio.CancelScope(), anyio.CancelScope()

        async def reserve(scope: anyio.CancelScope, run_id: str) -> None:
            with scope:
                seen.append(await ledger.reserve(run_id, RoundKind.DELIBERATE, 1, POLICY, T + 1))

        try:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(reserve, in_flight, "run")
                    await _until(lambda: _lock_waits(schema) == 1)
                    tg.start_soon(reserve, queued, "queued")  # waits for the batch in flight
                    await _until(lambda: len(ledger._group._pending) == 1)
                    in_flight.cancel()
                    queued.cancel()
                    holder.release()
        finally:
            holder.release()
        # The cancelled task may or may not see its round (it is committed either way); the
        # queued one never ran.
        assert all(isinstance(o, Reservation) and (o.run_id, o.round_index) == ("run", 2)
                   for o in seen), seen
        usage = await ledger.usage("run")
        assert (usage.rounds, usage.reserved) == (2, 3)  # the cancelled round was committed
        assert (await ledger.usage("queued")).rounds == 0  # never sent
        refused = await ledger.reserve("run", RoundKind.DELIBERATE, 1, POLICY, T + 2)
        assert isinstance(refused, BudgetRefusal), refused
        assert refused.reason is RefusalReason.ROUNDS
        await _idle_and_whole(ledger, schema)


async def test_pgbouncer_a_trace_write_cancelled_behind_a_held_lock_is_written_once(
    schema: str,
) -> None:
    """A trace write that retains evidence takes the run's lock: cancelled while it waits, it
    is still written, whole, and the next writes on the ledger are too."""
    async with _ledger(schema, max_size=4, lock_timeout=20.0) as ledger:
        assert isinstance(await ledger.reserve("run", RoundKind.AUTOMATIC, 2, POLICY, T),
                          Reservation)
        call = CallRecord(run_id="run", call_id="c1", digest="d" * 64, status="ok", slot=1,
                          evidence_ids=("m1", "m2"))
        holder = _Holder(ledger, "run")
        scope = anyio.CancelScope()
        done: list[bool] = []

        async def write() -> None:
            with scope:
                await ledger.record([_trace("run", "a1")], [], [call], retain_limit=5)
                done.append(True)

        try:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(write)
                    await _until(lambda: _lock_waits(schema) == 1)
                    scope.cancel()
                    holder.release()
        finally:
            holder.release()
        assert [a.attempt_id for a in await ledger.attempts("run")] == ["a1"]
        await _idle_and_whole(ledger, schema)


# -- the server's timeouts through the pooler --------------------------------------------------


TIMEOUTS = [
    pytest.param({"lock_timeout": 0.3, "statement_timeout": 20.0}, LedgerLockedError,
                 "lock_timeout", id="lock_timeout"),
    pytest.param({"lock_timeout": 20.0, "statement_timeout": 0.3}, LedgerUnavailableError,
                 "statement_timeout", id="statement_timeout"),
]


@pytest.mark.parametrize("time_source", SOURCES)
@pytest.mark.parametrize(("timeouts", "error", "named"), TIMEOUTS)
async def test_pgbouncer_a_server_timeout_is_typed_and_the_ledger_goes_on(
    schema: str, time_source: Any, timeouts: dict[str, float], error: type[Exception],
    named: str,
) -> None:
    async with _ledger(schema, time_source, **timeouts) as ledger:
        assert isinstance(await ledger.reserve("run", RoundKind.AUTOMATIC, 2, POLICY, T),
                          Reservation)
        holder = _Holder(ledger, "run")
        try:
            with anyio.fail_after(30):
                with pytest.raises(error, match=named):
                    await ledger.reserve("run", RoundKind.DELIBERATE, 1, POLICY, T + 1)
                with pytest.raises(error, match=named):
                    await ledger.retain("run", ["m1"], limit=3)
                assert _servers_lent(_app(schema)) == 0
        finally:
            holder.release()
        usage = await ledger.usage("run")
        assert (usage.rounds, usage.reserved) == (1, 2)  # nothing of the timed-out round
        granted = await ledger.reserve("run", RoundKind.DELIBERATE, 1, POLICY, T + 2)
        assert isinstance(granted, Reservation) and granted.round_index == 2, granted
        await _idle_and_whole(ledger, schema)


# -- the server ends the pooler's connections --------------------------------------------------


async def test_pgbouncer_a_server_ended_between_the_two_trips_fails_the_round_alone(
    schema: str,
) -> None:
    """By the caller's clock a reservation is two trips in one transaction; the clock is read
    between them. The server connection ended there: the round is refused to no one and
    granted to no one (typed, nothing committed), and the next calls are answered."""
    async with _ledger(schema, "caller", max_size=2) as ledger:
        assert isinstance(await ledger.reserve("run", RoundKind.AUTOMATIC, 2, POLICY, T),
                          Reservation)
        ended: list[int] = []

        def now() -> float:
            ended.append(_terminate(schema, "idle in transaction"))
            return T + 1

        with anyio.fail_after(30), pytest.raises(LedgerUnavailableError):
            await ledger.reserve("run", RoundKind.DELIBERATE, 1, POLICY, now)
        assert ended == [1]
        usage = await ledger.usage("run")
        assert (usage.rounds, usage.reserved) == (1, 2)
        granted = await ledger.reserve("run", RoundKind.DELIBERATE, 1, POLICY, T + 2)
        assert isinstance(granted, Reservation) and granted.round_index == 2, granted
        await _idle_and_whole(ledger, schema)


@pytest.mark.parametrize("time_source", SOURCES)
async def test_pgbouncer_servers_ended_while_idle_are_never_seen(
    schema: str, time_source: Any
) -> None:
    """The server ends PgBouncer's idle server connections (an operator, a failover): the
    ledger's own connections are to PgBouncer, which opens new servers; nothing fails."""
    async with _ledger(schema, time_source, min_size=3, max_size=3) as ledger:
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(ledger.reserve, f"run-{i}", RoundKind.AUTOMATIC, 2, POLICY, T)
        assert _terminate(schema) >= 1
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(ledger.usage, f"run-{i}")
        await _idle_and_whole(ledger, schema)


# -- more transactions than the pooler has servers ---------------------------------------------


@pytest.mark.parametrize("time_source", SOURCES)
async def test_pgbouncer_workers_queued_for_its_servers_are_all_served_within_the_allowance(
    schema: str, time_source: Any
) -> None:
    """Five workers (each a ledger of its own) reserve for one run while another connection
    holds its lock: two of them take PgBouncer's two servers and wait on the lock, the others
    queue in PgBouncer. Released, every worker is answered, the run gets exactly its two
    rounds, and no server stays lent."""
    workers = [_ledger(schema, time_source, max_size=2, lock_timeout=20.0) for _ in range(5)]
    outcomes: list[object] = []
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        holder = _Holder(workers[0], "run")

        async def reserve(worker: PostgresLedger) -> None:
            outcomes.append(await worker.reserve("run", RoundKind.AUTOMATIC, 2, POLICY, T))

        try:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for worker in workers:
                        tg.start_soon(reserve, worker)
                    await _until(lambda: _lock_waits(schema) == _pg.PGBOUNCER_POOL
                                 and _clients_waiting() >= 1)
                    holder.release()
        finally:
            holder.release()
        granted = [o for o in outcomes if isinstance(o, Reservation)]
        refused = [o for o in outcomes if isinstance(o, BudgetRefusal)]
        assert len(outcomes) == 5 and (len(granted), len(refused)) == (2, 3), outcomes
        assert sorted(r.round_index for r in granted) == [1, 2]
        usage = await workers[0].usage("run")
        assert usage.rounds == 2 and usage.reserved <= POLICY.max_searches
        for worker in workers:
            await _idle_and_whole(worker, schema, f"after-{id(worker)}")


# -- batches of hundreds -----------------------------------------------------------------------


@pytest.mark.parametrize("time_source", SOURCES)
async def test_pgbouncer_hundreds_of_concurrent_reservations_stay_within_the_allowance(
    schema: str, time_source: Any
) -> None:
    runs = [f"run-{i}" for i in range(100)]
    outcomes: dict[str, list[object]] = {run: [] for run in runs}
    async with _ledger(schema, time_source, max_size=4) as ledger:

        async def reserve(run_id: str, k: int) -> None:
            outcomes[run_id].append(
                await ledger.reserve(run_id, RoundKind.AUTOMATIC, 2, POLICY, T + k))

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for k in range(3):
                    for run in runs:
                        tg.start_soon(reserve, run, k)
        for run in runs:
            kinds = sorted(type(o).__name__ for o in outcomes[run])
            assert kinds == ["BudgetRefusal", "Reservation", "Reservation"], (run, outcomes[run])
        usage = await ledger.usage("run-7")
        assert (usage.rounds, usage.reserved) == (2, 4)
        await _idle_and_whole(ledger, schema)


async def test_pgbouncer_hundreds_of_traces_written_at_once_are_all_written(
    schema: str,
) -> None:
    async with _ledger(schema, max_size=4) as ledger:
        assert isinstance(await ledger.reserve("run", RoundKind.AUTOMATIC, 2, POLICY, T),
                          Reservation)
        with anyio.fail_after(120):
            await ledger.record([_trace("run", f"one-{i}") for i in range(500)], [])
            async with anyio.create_task_group() as tg:
                for i in range(300):
                    tg.start_soon(ledger.record, [_trace("run", f"many-{i}")], [])
        written = {a.attempt_id for a in await ledger.attempts("run")}
        assert written == {f"one-{i}" for i in range(500)} | {f"many-{i}" for i in range(300)}
        await _idle_and_whole(ledger, schema)


# -- hostile text in a client-quoted query -----------------------------------------------------

HOSTILE = [
    "it's", "back\\slash", "tail\\", "\\'", "100%", "%s", "%(run_id)s", "$$", "$tag$x$tag$",
    "a;b", "'; DROP SCHEMA public CASCADE; --", "E'\\x41'", "\"quoted\"", "{}", "line\nbreak",
    "tab\t", "x\u2028y", "é 汉字 🙂", "x" * 500,
]
"""Run ids, evidence ids and trace text that a client-side quoting slip would turn into SQL."""

WHERE = [pytest.param(_pg.DSN, id="direct"), pytest.param("pgbouncer", id="pgbouncer")]


@pytest.mark.parametrize("time_source", SOURCES)
@pytest.mark.parametrize("dsn", WHERE)
async def test_hostile_text_is_stored_as_itself(schema: str, dsn: str, time_source: Any) -> None:
    dsn = _pg.pooled_dsn() if dsn == "pgbouncer" else dsn
    async with PostgresLedger(dsn, schema=schema, time_source=time_source, max_size=4) as ledger:
        outcomes: dict[str, object] = {}

        async def reserve(run_id: str) -> None:
            outcomes[run_id] = await ledger.reserve(run_id, RoundKind.AUTOMATIC, 2, POLICY, T)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:  # one batch: many values in one query
                for text in HOSTILE:
                    tg.start_soon(reserve, text)
            for text in HOSTILE:
                assert isinstance(outcomes[text], Reservation), (text, outcomes[text])
                assert [r.run_id for r in await ledger.reservations(text)] == [text]
            traces = [_trace(text, f"a-{i}-{text}", strategy=text, fingerprint=text)
                      for i, text in enumerate(HOSTILE)]
            calls = [CallRecord(run_id=text, call_id=text, digest="d" * 64, status="ok", slot=1,
                                evidence_ids=(text, "m1")) for text in HOSTILE]
            await ledger.record(traces, [], calls, retain_limit=5)
            for i, text in enumerate(HOSTILE):
                (trace,) = await ledger.attempts(text)
                assert (trace.attempt_id, trace.strategy, trace.fingerprint) == (
                    f"a-{i}-{text}", text, text)
        with _pg.connect() as conn:  # nothing ran but the ledger's own statements
            tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s",
                                  (schema,)).fetchall()
            assert tables[0][0] >= 5
            assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'public'"
                                ).fetchall() == [(1,)]
        if dsn != _pg.DSN:
            assert _servers_lent(_app(schema)) == 0


@pytest.mark.parametrize("dsn", WHERE)
async def test_a_trace_postgresql_cannot_take_fails_that_write_alone_and_typed(
    schema: str, dsn: str
) -> None:
    """A NUL, which PostgreSQL's text cannot hold, is refused before it is sent; a slot past a
    64-bit integer reaches the server and fails that write with a ledger error. Either way the
    writes that shared its batch are written."""
    dsn = _pg.pooled_dsn() if dsn == "pgbouncer" else dsn
    async with PostgresLedger(dsn, schema=schema, max_size=4) as ledger:
        failed: dict[str, BaseException] = {}

        async def write(trace: AttemptTrace) -> None:
            try:
                await ledger.record([trace], [])
            except (LedgerError, InvalidArgumentError) as exc:
                failed[trace.attempt_id] = exc

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(write, _trace("run", "fine-1"))
                tg.start_soon(write, _trace("run", "nul", strategy="a\x00b"))
                tg.start_soon(write, attrs.evolve(_trace("run", "huge"), slot=2**63))
                tg.start_soon(write, _trace("run", "fine-2"))
        assert sorted(failed) == ["huge", "nul"], failed
        assert isinstance(failed["nul"], InvalidArgumentError) and "NUL" in str(failed["nul"])
        assert isinstance(failed["huge"], LedgerError), failed["huge"]
        assert sorted(a.attempt_id for a in await ledger.attempts("run")) == ["fine-1", "fine-2"]
        if dsn != _pg.DSN:
            assert _servers_lent(_app(schema)) == 0
