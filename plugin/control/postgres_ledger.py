"""A fleet's ledger on PostgreSQL: one allowance shared by agent workers on many hosts.

The contract is :class:`~plugin.control.sqlite_ledger.SqliteLedger`'s (the contract suite runs
both). A reservation is one transaction: ``BEGIN``; a transaction-level advisory lock on the
run (``pg_advisory_xact_lock``: two workers reserving for one run queue here); then the time
is read and the round judged in ONE statement, a conditional ``INSERT … ON CONFLICT DO UPDATE
… WHERE … RETURNING`` that records the round, or the refusal, in the same statement;
``COMMIT`` with ``synchronous_commit = on``, so a permit is issued only for a round whose WAL
is flushed. The upsert's row lock alone already forbids over-admission; the advisory lock
makes the judged time and a refusal's reason and counts current after any wait.

Whose clock: by default the database server's (``clock_timestamp()``): every worker of a fleet
judges its rounds by one clock, so a worker whose own clock is off neither gains nor loses
deadline. ``time_source="caller"`` judges by the ``now`` the caller passes (explicit times:
tests, replays). Either way never below ``floor``. The permit's own clock is the worker's
monotonic clock, started from ``deadline_wall - reserved_wall``, both server times.

Every transaction is shielded from cancellation once its connection is checked out (bounded
by ``statement_timeout`` and ``lock_timeout``). Failures are typed: the server unreachable,
restarted or too slow is :class:`~plugin.errors.LedgerUnavailableError`, a lock held past
``lock_timeout`` is :class:`~plugin.errors.LedgerLockedError`; either way no permit is issued.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, TypeVar

import anyio
import psycopg
import psycopg.conninfo
import psycopg.errors
import psycopg_pool

from plugin.errors import (
    LedgerClosedError,
    LedgerConfigError,
    LedgerCorruptError,
    LedgerError,
    LedgerLockedError,
    LedgerPathError,
    LedgerUnavailableError,
)

from . import _postgres, validate
from ._group import GroupCommit
from .dsn import password_of, redact
from .ledger import Reservation, WallTime, read_time
from .ledger_admin import PRUNED_TABLES
from .policy import AllowancePolicy, RoundKind
from .refusal import BudgetRefusal, RefusalReason
from .sql_ledger import (
    REFUSAL_REASON,
    TABLES,
    Dialect,
    ReserveRequest,
    Row,
    Rows,
    Session,
    SqlLedger,
    create_table,
    reservation,
)

T = TypeVar("T")

TimeSource = Literal["server", "caller"]
APPLICATION = "recallbound"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_RESERVE_WAVE = """
CREATE FUNCTION {s}.reserve_wave(p_server boolean, p_requests jsonb)
RETURNS TABLE (ord int4, judged float8, executed int8, rounds int8, reserved int8,
               granted int8, deadline float8, opened float8, reason text,
               reserved_before int8)
LANGUAGE plpgsql VOLATILE AS $body$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH req AS MATERIALIZED (
    -- times travel as text: JSON has no infinity (a floor of -inf is the usual one)
    SELECT t.ord, t.run_id, t.kind, t.requested, t.deadline_s::float8 AS deadline_s,
           t.max_searches, t.max_rounds, t.now::float8 AS now, t.floor::float8 AS floor
    FROM jsonb_to_recordset(p_requests) AS t(ord int4, run_id text, kind text, requested int8,
        deadline_s text, max_searches int8, max_rounds int8, now text, floor text)
), p AS MATERIALIZED (
    SELECT req.ord, req.run_id, req.kind, req.requested, req.deadline_s, req.max_searches,
           req.max_rounds,
           greatest(CASE WHEN p_server THEN extract(epoch FROM clock_timestamp())::float8
                         ELSE req.now END, req.floor) AS now
    FROM req
), cur AS MATERIALIZED (
    SELECT u.run_id, u.reserved, """ + REFUSAL_REASON + """ AS reason
    FROM {s}.runs u WHERE u.run_id IN (SELECT req.run_id FROM req)
), exe AS MATERIALIZED (
    SELECT a.run_id, count(*) AS n FROM {s}.attempts a
    WHERE a.run_id IN (SELECT req.run_id FROM req) AND a.legacy = false GROUP BY a.run_id
), up AS (
    INSERT INTO {s}.runs AS r (run_id, opened_wall, deadline_wall, max_searches, max_rounds,
                               rounds, reserved, last_grant)
    SELECT p.run_id, p.now, p.now + p.deadline_s, p.max_searches, p.max_rounds,
           1, least(p.requested, p.max_searches), least(p.requested, p.max_searches)
    FROM p ORDER BY p.run_id
    ON CONFLICT (run_id) DO UPDATE SET
        rounds = r.rounds + 1,
        last_grant = least((SELECT p.requested FROM p WHERE p.run_id = excluded.run_id),
                           r.max_searches - r.reserved),
        reserved = r.reserved + least((SELECT p.requested FROM p
                                       WHERE p.run_id = excluded.run_id),
                                      r.max_searches - r.reserved)
    WHERE r.rounds < r.max_rounds AND r.reserved < r.max_searches
      AND excluded.opened_wall < r.deadline_wall
    RETURNING r.run_id, r.rounds, r.reserved, r.last_grant, r.deadline_wall, r.opened_wall
), rnd AS (
    INSERT INTO {s}.rounds (run_id, round_index, kind, requested, first_slot, slots, executed,
                            reserved_wall)
    SELECT p.run_id, up.rounds, p.kind, p.requested, up.reserved - up.last_grant + 1,
           up.last_grant, coalesce(exe.n, 0), p.now
    FROM p JOIN up ON up.run_id = p.run_id LEFT JOIN exe ON exe.run_id = p.run_id
), ref AS (
    INSERT INTO {s}.refusals (run_id, round_index, what, kind, reason, at_wall)
    SELECT p.run_id, NULL, 'round', p.kind, cur.reason, p.now
    FROM p JOIN cur ON cur.run_id = p.run_id
    WHERE NOT EXISTS (SELECT FROM up WHERE up.run_id = p.run_id)
)
SELECT p.ord, p.now, coalesce(exe.n, 0)::int8, up.rounds, up.reserved, up.last_grant,
       up.deadline_wall, up.opened_wall, cur.reason, cur.reserved
FROM p LEFT JOIN exe ON exe.run_id = p.run_id LEFT JOIN up ON up.run_id = p.run_id
       LEFT JOIN cur ON cur.run_id = p.run_id
ORDER BY p.ord;
END
$body$
"""
"""One wave of a batch judged and recorded in one statement over arrays of requests: the
round, or the refusal, of each, in the order of ``ord``. Called after the batch's locks, so
every time it reads is current (each query of a volatile function takes a new snapshot)."""

_TYPES = {"text": "text", "real": "float8", "int": "bigint", "bool": "boolean",
          "serial": "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY"}

_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # versions 1 to 3, the ledger's tables by the version that added them: 1 runs, rounds,
    # attempts, refusals; 2 retained evidence and its re-check bound; 3 each run bound to the
    # principal and scope of its first use
    *(
        tuple(statement for table in TABLES if table.since == version
              for statement in create_table(table, _TYPES, prefix="{s}."))
        for version in (1, 2, 3)
    ),
    # version 4: the reserving statement, kept in the schema (its plan is cached per server
    # connection, where a client-side prepared statement would not survive a transaction pooler)
    (_RESERVE_WAVE,),
    # version 5: each attempt counts the evidence dropped for naming another principal or scope
    ("ALTER TABLE {s}.attempts ADD COLUMN IF NOT EXISTS dropped bigint NOT NULL DEFAULT 0",),
    # version 6: the runs each (principal, scope) opened in the last hour (a cap on new runs)
    tuple(statement for table in TABLES if table.since == 6
          for statement in create_table(table, _TYPES, prefix="{s}.")),
)
SCHEMA_VERSION = len(_MIGRATIONS)
"""The schema version this code writes; older versions are migrated in place at open."""

_META = """CREATE TABLE {s}.recallbound_meta (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    application text NOT NULL,
    version     integer NOT NULL)"""

_SERVER_CLOCK = "extract(epoch FROM clock_timestamp())::float8"
"""The server's clock, read when the statement evaluates it (after any lock wait before it)."""

_LOCK_RUN = "SELECT pg_advisory_xact_lock(:space::int4, hashtext(:run_id))"

_LOCK_RUNS = """
SELECT count(pg_advisory_xact_lock(:space::int4, hashtext(r)))
FROM (SELECT DISTINCT r COLLATE "C" AS r FROM unnest(:runs::text[]) AS r ORDER BY 1 OFFSET 0)
    AS ordered
"""
"""The per-run locks of a batch, taken in one order, by run id byte-wise (as a batch of writes
orders its runs), so that two workers' batches never wait for each other in a cycle."""

_RESERVE = """
SELECT * FROM {q}reserve_wave(:server::boolean, :requests::jsonb)
"""
"""One wave of a batch (at most one request per run), judged and recorded in ONE statement."""

_TABLES = ("recallbound_meta", *PRUNED_TABLES)
"""Every table of a ledger schema."""


def redact_dsn(dsn: str) -> str:
    """``dsn`` for display: a password in any form as ``***`` (the one redaction)."""
    return redact(dsn)


def _password(dsn: str) -> str | None:
    return password_of(dsn)


def _one_line(text: str, secret: str | None) -> str:
    """An error text on one line (libpq's span several), never holding the password."""
    return redact(" ".join(text.split()), secrets=(secret,))


def _translate(exc: BaseException, where: str, secret: str | None = None) -> LedgerError:
    translated = _translate_type(exc, where)
    return type(translated)(_one_line(str(translated), secret))


def _translate_type(exc: BaseException, where: str) -> LedgerError:
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        return LedgerLockedError(f"{where}: a lock stayed held beyond lock_timeout: {exc}")
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return LedgerUnavailableError(f"{where}: no connection within pool_timeout: {exc}")
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return LedgerUnavailableError(f"{where}: no answer within statement_timeout: {exc}")
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return LedgerUnavailableError(f"{where}: the database is unreachable or was lost: {exc}")
    if isinstance(exc, (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn,
                        psycopg.errors.InvalidSchemaName)):
        return LedgerCorruptError(f"{where}: the ledger's schema is missing or damaged: {exc}")
    return LedgerError(f"{where} failed: {exc}")


def _interval_ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


class PostgresLedger(SqlLedger):
    """A :class:`~plugin.control.ledger.Ledger` on PostgreSQL: ``async with PostgresLedger(dsn)``.

    ``schema`` holds the ledger's tables (created, or migrated from an older version, at open;
    safe when many workers open at once). ``time_source`` is whose clock judges rounds:
    ``"server"`` (default, one clock for the fleet) or ``"caller"`` (the ``now`` passed in).
    The pool keeps ``min_size`` to ``max_size`` connections; a checkout waits at most
    ``pool_timeout`` seconds, a connection attempt ``connect_timeout``, a statement
    ``statement_timeout`` and a lock ``lock_timeout``. With ``create=False`` a schema that
    does not exist yet is an error (:class:`~plugin.errors.LedgerPathError`) instead of a new,
    empty ledger: operators' tools open that way.

    Raises :class:`~plugin.errors.LedgerUnavailableError` when the server cannot be reached (at
    open or later) or is lost mid-operation, :class:`~plugin.errors.LedgerLockedError` for a
    lock held beyond ``lock_timeout``, :class:`~plugin.errors.LedgerCorruptError` for a schema
    that is not a recallbound ledger (or a newer version), and
    :class:`~plugin.errors.LedgerConfigError` for invalid settings. Each is a
    :class:`~plugin.errors.LedgerError`.
    """

    schema_version = SCHEMA_VERSION
    backend = "postgresql"
    storage_checks = ("the schema's tables", "the schema's identity (its meta table)")

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "recallbound",
        time_source: TimeSource = "server",
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 5.0,
        pool_timeout: float = 10.0,
        statement_timeout: float = 10.0,
        lock_timeout: float = 5.0,
        create: bool = True,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise LedgerConfigError(f"PostgresLedger dsn must be a non-empty str, got {dsn!r}")
        if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
            raise LedgerConfigError(
                f"schema {schema!r} must be a lowercase identifier ([a-z_][a-z0-9_]*, <= 63)"
            )
        if time_source not in ("server", "caller"):
            raise LedgerConfigError(
                f"time_source must be 'server' or 'caller', not {time_source!r}"
            )
        if not (isinstance(min_size, int) and isinstance(max_size, int)
                and 0 <= min_size <= max_size and max_size >= 1):
            raise LedgerConfigError(f"need 0 <= min_size <= max_size, 1 <= max_size; "
                                    f"got {min_size}, {max_size}")
        timeouts = {"connect_timeout": connect_timeout, "pool_timeout": pool_timeout,
                    "statement_timeout": statement_timeout, "lock_timeout": lock_timeout}
        for name, value in timeouts.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise LedgerConfigError(f"{name} must be a positive number of seconds, "
                                        f"not {value!r}")
        if not isinstance(create, bool):
            raise LedgerConfigError(f"create must be a bool, not {create!r}")
        self._dsn = dsn
        self._secret = _password(dsn)
        self._schema = schema
        self._create = create
        self._time_source: TimeSource = time_source
        self._min_size, self._max_size = min_size, max_size
        self._connect_timeout = float(connect_timeout)
        self._pool_timeout = float(pool_timeout)
        self._settings = (
            "SELECT set_config('synchronous_commit', 'on', true), "
            f"set_config('statement_timeout', '{_interval_ms(statement_timeout)}', true), "
            f"set_config('lock_timeout', '{_interval_ms(lock_timeout)}', true), "
            # A worker that hangs inside a transaction must not hold a run's lock forever.
            "set_config('idle_in_transaction_session_timeout', "
            f"'{_interval_ms(statement_timeout * 2)}', true)"
        )
        """What every transaction sets for itself (``SET LOCAL``): nothing of the session."""
        quoted = f'"{schema}"'
        self._q = quoted
        server = time_source == "server"
        self._dialect = Dialect(
            name="postgresql", prefix=quoted + ".", pyformat=True, id_list="= ANY(:{name})",
            id_rows="unnest(:{name}::text[]) WITH ORDINALITY AS j(value, key)", greatest="greatest",
            lock_run=_LOCK_RUN, for_update=" FOR UPDATE", binary_order=' COLLATE "C"',
            clock=_SERVER_CLOCK if server else None,
        )
        self._reserve_sql = self._dialect.sql(_RESERVE)
        self._lock_runs_sql = self._dialect.sql(_LOCK_RUNS)
        # Advisory locks on runs live in their own space per schema (two-key locks never meet
        # the one-key lock of schema creation).
        self._space = zlib.crc32(schema.encode()) - 2**31
        self._driver: _postgres.Driver | None = None
        super().__init__()
        self._group: GroupCommit[ReserveRequest, Reservation | BudgetRefusal] = GroupCommit(
            anyio.Lock(), self._reserve_batch, self._shared_failure)

    @property
    def schema(self) -> str:
        return self._schema

    @property
    def time_source(self) -> TimeSource:
        return self._time_source

    @property
    def location(self) -> str:
        """Where the ledger is, for display: the DSN without its password, and the schema."""
        return f"{redact_dsn(self._dsn)} (schema {self._schema})"

    async def open(self) -> None:
        """Open the pool, then create or migrate the schema (idempotent across workers)."""
        if self._driver is not None:
            return
        driver = _postgres.make_driver(
            self._dsn, min_size=self._min_size, max_size=self._max_size,
            connect_timeout=self._connect_timeout, pool_timeout=self._pool_timeout,
            name=f"recallbound-{self._schema}",
        )
        try:
            with anyio.CancelScope(shield=True):
                await driver.open()
                self._driver = driver
                await self._transact(self._setup, "opening the ledger")
        except BaseException as exc:
            self._driver = None
            with anyio.CancelScope(shield=True):
                await driver.close()
            if isinstance(exc, psycopg.Error):
                raise _translate(exc, f"opening ledger schema {self._schema!r}",
                                 self._secret) from exc
            raise

    async def _setup(self, s: Session) -> None:
        q = self._q
        await s.fetchall("SELECT pg_advisory_xact_lock(hashtext(%(key)s)::bigint)",
                         {"key": f"recallbound schema {self._schema}"})
        ((relations, has_meta),) = await s.fetchall(
            "SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %(n)s), "
            "to_regclass(%(meta)s) IS NOT NULL",
            {"n": self._schema, "meta": f"{q}.recallbound_meta"},
        )
        if has_meta:
            ((application, version),) = await s.fetchall(
                f"SELECT application, version FROM {q}.recallbound_meta", {})
            if application != APPLICATION:
                raise LedgerCorruptError(f"schema {self._schema!r} is not a recallbound ledger")
            if version > SCHEMA_VERSION:
                raise LedgerCorruptError(
                    f"ledger schema {self._schema!r} has version {version}; "
                    f"this recallbound reads version {SCHEMA_VERSION}"
                )
        elif relations:
            raise LedgerCorruptError(
                f"schema {self._schema!r} holds other tables and is not a recallbound ledger"
            )
        elif not self._create:
            raise LedgerPathError(
                f"no recallbound ledger in schema {self._schema!r} of this database")
        else:
            version = 0
            await s.fetchall(f"CREATE SCHEMA IF NOT EXISTS {q}", {})
            await s.fetchall(_META.format(s=q), {})
            await s.fetchall(
                f"INSERT INTO {q}.recallbound_meta (application, version) VALUES (%(a)s, 0)",
                {"a": APPLICATION})
        for step in _MIGRATIONS[version:]:
            for statement in step:
                await s.fetchall(statement.format(s=q), {})
        if version < SCHEMA_VERSION:
            await s.fetchall(f"UPDATE {q}.recallbound_meta SET version = %(v)s",
                             {"v": SCHEMA_VERSION})

    async def aclose(self) -> None:
        """Close the pool; idempotent."""
        driver, self._driver = self._driver, None
        if driver is not None:
            with anyio.CancelScope(shield=True):
                await driver.close()

    # -- running statements ------------------------------------------------------------------

    def _connected(self) -> _postgres.Driver:
        if self._driver is None:
            raise LedgerClosedError(
                "PostgresLedger is not open: use `async with PostgresLedger(...)`"
            )
        return self._driver

    async def _session(
        self, fn: Callable[[_postgres.Session], Awaitable[T]], where: str
    ) -> T:
        """Run ``fn`` on a pooled connection (checked by the pool before it is lent),
        shielded from cancellation once checked out; any failure rolls back what ``fn`` began.

        A connection lost mid-way is not retried (a commit may or may not have happened) and
        becomes :class:`LedgerUnavailableError`: no permit for an unconfirmed commit.
        """
        driver = self._connected()
        try:
            async with driver.session() as session:
                with anyio.CancelScope(shield=True):
                    try:
                        result = await fn(session)
                    except BaseException:
                        if not session.broken:
                            with contextlib.suppress(psycopg.Error):
                                await session.fetchall("ROLLBACK")
                        raise
        except psycopg.Error as exc:
            raise _translate(exc, where, self._secret) from exc
        return result

    def _begin(self, *, read_only: bool) -> list[tuple[str, None]]:
        begin = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY" if read_only else "BEGIN"
        return [(begin, None), (self._settings, None)]

    async def _transact(
        self, fn: Callable[[Session], Awaitable[T]], where: str, *, read_only: bool = False
    ) -> T:
        async def run(s: _postgres.Session) -> T:
            await s.pipeline(self._begin(read_only=read_only))
            result = await fn(s)
            await s.fetchall("COMMIT")
            return result

        return await self._session(run, where)

    async def _fetch(self, sql: str, params: Mapping[str, Any], where: str) -> list[Row]:
        # The settings and the read, one implicit transaction (a pipeline, up to its sync).
        return (await self._one_trip(where)([(self._settings, None), (sql, params)]))[1]

    async def _write_rows(self, statements: Rows, where: str) -> None:
        # The whole transaction in one round trip (on trio, one hop to a worker thread): the
        # statements of one pipeline, up to its sync, are one implicit transaction, committed
        # whole or not at all.
        await self._one_trip(where)([
            (self._settings, None), *((sql, row) for sql, rows in statements for row in rows),
        ])

    def _lock_params(self, run_id: str) -> dict[str, Any]:
        return {"run_id": run_id, "space": self._space}

    async def _inspect_storage(self, session: Session, problems: list[str]) -> tuple[int, bool]:
        q = self._q
        ((*present,),) = await session.fetchall(
            "SELECT " + ", ".join(f"to_regclass('{q}.{t}') IS NOT NULL" for t in _TABLES), {})
        missing = [table for table, there in zip(_TABLES, present, strict=True) if not there]
        if missing:
            problems.append(f"missing table(s): {', '.join(missing)}")
        version = -1
        if "recallbound_meta" not in missing:
            meta = await session.fetchall(f"SELECT application, version FROM {q}.recallbound_meta",
                                          {})
            if len(meta) != 1:
                problems.append(f"the schema's meta table holds {len(meta)} rows, not 1")
            else:
                ((application, version),) = meta
                if application != APPLICATION:
                    problems.append(f"application {application!r} is not a recallbound "
                                    "ledger's")
        return int(version), not missing

    # -- reserving: group commit, one statement per wave -------------------------------------

    async def reserve(
        self,
        run_id: str,
        kind: RoundKind,
        requested: int,
        policy: AllowancePolicy,
        now: WallTime,
        *,
        floor: WallTime = -math.inf,
    ) -> Reservation | BudgetRefusal:
        validate.run_id(run_id)
        self._connected()  # closed: fail now, not inside someone else's batch
        return await self._group.submit(
            ReserveRequest(run_id, kind, requested, policy, now, floor))

    async def _reserve_batch(
        self, batch: Sequence[ReserveRequest]
    ) -> list[Reservation | BudgetRefusal | BaseException]:
        """One transaction for ``batch``: one round trip judged by the server's clock, two by
        the callers' (their clocks are read after the batch's locks)."""
        where = (f"reserving a round of run {batch[0].run_id!r}" if len(batch) == 1
                 else f"reserving {len(batch)} rounds")
        try:
            if self._time_source == "server":
                return await self._judge(batch, self._one_trip(where))
            return await self._session(lambda s: self._judge(batch, s.pipeline), where)
        except (LedgerUnavailableError, LedgerLockedError):
            raise  # the server, not one request: every request of the batch fails with it
        except Exception:  # a statement, or a value the driver cannot take
            if len(batch) == 1:
                raise
        # One request's statement failed and the batch rolled back whole (nothing of it was
        # committed): each request again on its own, so that the failing one fails alone.
        outcomes: list[Reservation | BudgetRefusal | BaseException] = []
        for request in batch:
            try:
                outcomes.extend(await self._reserve_batch([request]))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    def _one_trip(self, where: str) -> _Send:
        """Send a whole transaction: a connection checked out, the statements, back (on trio,
        one hop to a worker thread); errors typed."""
        driver = self._connected()

        async def send(statements: Sequence[tuple[str, Any]]) -> list[list[Row]]:
            try:
                return await driver.transaction(statements)
            except psycopg.Error as exc:
                raise _translate(exc, where, self._secret) from exc

        return send

    async def _judge(
        self, batch: Sequence[ReserveRequest], send: _Send
    ) -> list[Reservation | BudgetRefusal | BaseException]:
        """The batch's transaction through ``send``: the run locks, the waves, ``COMMIT`` in one
        trip; by the callers' clocks, two (the clocks are read after the locks)."""
        outcomes: dict[int, Reservation | BudgetRefusal | BaseException] = {}
        caller = self._time_source == "caller"
        locks = (self._lock_runs_sql,
                 {"space": self._space, "runs": sorted({r.run_id for r in batch})})
        head: list[tuple[str, Any]] = [(self._settings, None), locks]
        tail: list[tuple[str, Any]] = []
        if caller:
            # Two trips: an explicit transaction across them; the clocks are read between.
            await send([("BEGIN", None), *head])
            head, tail = [], [("COMMIT", None)]
        times: dict[int, tuple[float | None, float]] = {}
        for i, request in enumerate(batch):
            try:
                times[i] = (read_time(request.now) if caller else None, read_time(request.floor))
            except BaseException as exc:  # that caller's clock, whatever it raises: alone
                outcomes[i] = exc
        waves = _waves(batch, list(times))
        statements = [
            *head, *((self._reserve_sql, _wave(batch, wave, times, not caller)) for wave in waves),
            *tail,
        ]
        results = await send(statements)
        for rows in results[len(head):len(head) + len(waves)]:
            for (i, judged, executed, rounds, reserved, grant, deadline, opened, reason,
                 reserved_before) in rows:
                request = batch[i]
                outcomes[i] = (
                    BudgetRefusal(reason=RefusalReason(reason), run_id=request.run_id,
                                  reserved=reserved_before, executed=executed)
                    if rounds is None else
                    reservation(request.run_id, request.kind, request.requested, rounds=rounds,
                                reserved=reserved, grant=grant, executed=executed,
                                deadline=deadline, opened=opened, judged=judged)
                )
        return [outcomes[i] for i in range(len(batch))]


_Send: TypeAlias = "Callable[[Sequence[tuple[str, Any]]], Awaitable[list[list[Row]]]]"
"""Sends statements to the server, one trip, and returns each one's rows."""


def _waves(batch: Sequence[ReserveRequest], ready: list[int]) -> list[list[int]]:
    """``ready`` (indexes into ``batch``) in waves of at most one request per run, each run's
    requests in their order: a wave's statement sees the waves before it."""
    waves: list[list[int]] = []
    seen: dict[str, int] = {}
    for i in ready:
        k = seen.get(batch[i].run_id, 0)
        seen[batch[i].run_id] = k + 1
        if k == len(waves):
            waves.append([])
        waves[k].append(i)
    return waves


def _wave(batch: Sequence[ReserveRequest], wave: list[int],
          times: Mapping[int, tuple[float | None, float]], server: bool) -> dict[str, Any]:
    """The parameters of one wave's statement: its requests as one JSON array (one value to
    send instead of ten arrays), times as exact text (``repr``; ``-inf`` and ``inf`` too)."""
    requests = []
    for i in wave:
        request, (now, floor) = batch[i], times[i]
        policy = request.policy
        requests.append({
            "ord": i, "run_id": request.run_id, "kind": request.kind.value,
            "requested": request.requested, "deadline_s": repr(float(policy.deadline_s)),
            "max_searches": policy.max_searches, "max_rounds": policy.max_rounds,
            "now": None if now is None else repr(float(now)), "floor": repr(float(floor)),
        })
    return {"server": server, "requests": json.dumps(requests)}
