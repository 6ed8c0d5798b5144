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
import math
import re
import zlib
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar

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

from . import _postgres
from .ledger import (
    AttemptOutcome,
    AttemptTrace,
    IdentityCache,
    RefusalRecord,
    Reservation,
    Usage,
    Validity,
    WallTime,
    check_identity,
    grant_validations,
    identity_arguments,
    read_time,
)
from .ledger_admin import LedgerAdmin
from .policy import AllowancePolicy, RoundKind
from .refusal import BudgetRefusal, RefusalReason

T = TypeVar("T")

TimeSource = Literal["server", "caller"]
APPLICATION = "recallbound"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # version 1: runs, rounds, attempts, refusals
    (
        """CREATE TABLE {s}.runs (
            run_id        text PRIMARY KEY,
            opened_wall   float8 NOT NULL,
            deadline_wall float8 NOT NULL,
            max_searches  bigint NOT NULL,
            max_rounds    bigint NOT NULL,
            rounds        bigint NOT NULL,
            reserved      bigint NOT NULL,
            last_grant    bigint NOT NULL)""",
        """CREATE TABLE {s}.rounds (
            run_id        text NOT NULL,
            round_index   bigint NOT NULL,
            kind          text NOT NULL,
            requested     bigint NOT NULL,
            first_slot    bigint NOT NULL,
            slots         bigint NOT NULL,
            executed      bigint NOT NULL,
            reserved_wall float8 NOT NULL,
            PRIMARY KEY (run_id, round_index))""",
        """CREATE TABLE {s}.attempts (
            attempt_id   text PRIMARY KEY,
            run_id       text NOT NULL,
            round_index  bigint NOT NULL,
            slot         bigint NOT NULL,
            kind         text NOT NULL,
            strategy     text,
            fingerprint  text,
            outcome      text NOT NULL,
            started_wall float8 NOT NULL,
            elapsed_s    float8,
            legacy       boolean NOT NULL)""",
        "CREATE INDEX attempts_by_run ON {s}.attempts (run_id, legacy)",
        """CREATE TABLE {s}.refusals (
            id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            run_id      text NOT NULL,
            round_index bigint,
            what        text NOT NULL,
            kind        text NOT NULL,
            reason      text NOT NULL,
            at_wall     float8 NOT NULL)""",
        "CREATE INDEX refusals_by_run ON {s}.refusals (run_id)",
    ),
    # version 2: retained evidence and its re-check bound, kept with the run
    (
        """CREATE TABLE {s}.retained (
            run_id      text NOT NULL,
            evidence_id text NOT NULL,
            PRIMARY KEY (run_id, evidence_id))""",
        """CREATE TABLE {s}.validations (
            run_id text PRIMARY KEY,
            used   bigint NOT NULL)""",
    ),
    # version 3: each run bound to the principal and scope of its first use
    (
        """CREATE TABLE {s}.run_identity (
            run_id    text PRIMARY KEY,
            principal text NOT NULL,
            scope     text NOT NULL)""",
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)
"""The schema version this code writes; older versions are migrated in place at open."""

_META = """CREATE TABLE {s}.recallbound_meta (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    application text NOT NULL,
    version     integer NOT NULL)"""

_NOW = {
    "server": "extract(epoch FROM clock_timestamp())::float8",
    "caller": "%(now)s::float8",
}

_RESERVE = """
WITH p AS MATERIALIZED (
    SELECT greatest({now}, %(floor)s::float8) AS now
), cur AS MATERIALIZED (
    SELECT rounds, reserved, max_rounds, max_searches FROM {s}.runs WHERE run_id = %(run_id)s
), exe AS MATERIALIZED (
    SELECT count(*) AS n FROM {s}.attempts WHERE run_id = %(run_id)s AND NOT legacy
), up AS (
    INSERT INTO {s}.runs AS r (run_id, opened_wall, deadline_wall, max_searches, max_rounds,
                               rounds, reserved, last_grant)
    SELECT %(run_id)s, p.now, p.now + %(deadline_s)s::float8, %(max_searches)s, %(max_rounds)s,
           1, least(%(requested)s, %(max_searches)s), least(%(requested)s, %(max_searches)s)
    FROM p
    ON CONFLICT (run_id) DO UPDATE SET
        rounds = r.rounds + 1,
        last_grant = least(%(requested)s, r.max_searches - r.reserved),
        reserved = r.reserved + least(%(requested)s, r.max_searches - r.reserved)
    WHERE r.rounds < r.max_rounds AND r.reserved < r.max_searches
      AND (SELECT now FROM p) < r.deadline_wall
    RETURNING r.rounds, r.reserved, r.last_grant, r.deadline_wall, r.opened_wall
), rnd AS (
    INSERT INTO {s}.rounds (run_id, round_index, kind, requested, first_slot, slots, executed,
                            reserved_wall)
    SELECT %(run_id)s, up.rounds, %(kind)s, %(requested)s, up.reserved - up.last_grant + 1,
           up.last_grant, exe.n, p.now
    FROM up, exe, p
), ref AS (
    INSERT INTO {s}.refusals (run_id, round_index, what, kind, reason, at_wall)
    SELECT %(run_id)s, NULL, 'round', %(kind)s,
           CASE WHEN cur.rounds >= cur.max_rounds THEN 'rounds'
                WHEN cur.reserved >= cur.max_searches THEN 'slots'
                ELSE 'deadline' END,
           p.now
    FROM cur, p WHERE NOT EXISTS (SELECT FROM up)
    RETURNING reason
)
SELECT p.now, exe.n, up.rounds, up.reserved, up.last_grant, up.deadline_wall, up.opened_wall,
       ref.reason, cur.reserved
FROM p CROSS JOIN exe LEFT JOIN up ON true LEFT JOIN ref ON true LEFT JOIN cur ON true
"""

_LOCK_RUN = "SELECT pg_advisory_xact_lock(%(space)s::int4, hashtext(%(run_id)s))"

_USAGE = """
SELECT u.rounds, u.reserved, u.deadline_wall,
       (SELECT count(*) FROM {s}.attempts a WHERE a.run_id = %(r)s AND NOT a.legacy),
       (SELECT count(*) FROM {s}.refusals f WHERE f.run_id = %(r)s),
       (SELECT count(*) FROM {s}.attempts a WHERE a.run_id = %(r)s AND a.legacy)
FROM (SELECT) AS one LEFT JOIN {s}.runs u ON u.run_id = %(r)s
"""


_URL_PASSWORD = re.compile(r"(://[^:/@?#]*:)[^@/?#]*@")
_PARAM_PASSWORD = re.compile(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)")


def redact_dsn(dsn: str) -> str:
    """``dsn`` for display: a password (URL userinfo, ``password=`` parameter) as ``***``."""
    return _PARAM_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", dsn))


def _password(dsn: str) -> str | None:
    try:
        value = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        return None
    return value if isinstance(value, str) and value else None


def _one_line(text: str, secret: str | None) -> str:
    """An error text on one line (libpq's span several), never holding the password."""
    line = " ".join(text.split())
    return line.replace(secret, "***") if secret else line


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


class _StaleConnection(Exception):
    """A pooled connection was found lost before anything ran on it: safe to retry."""


def _interval_ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


class PostgresLedger:
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
        if time_source not in _NOW:
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
        self._settings = {
            "synchronous_commit": "on",
            "statement_timeout": _interval_ms(statement_timeout),
            "lock_timeout": _interval_ms(lock_timeout),
            # A worker that hangs inside a transaction must not hold a run's lock forever.
            "idle_in_transaction_session_timeout": _interval_ms(statement_timeout * 2),
        }
        quoted = f'"{schema}"'
        self._sql = {
            "reserve": _RESERVE.format(s=quoted, now=_NOW[time_source]),
            "usage": _USAGE.format(s=quoted),
        }
        self._q = quoted
        # Advisory locks on runs live in their own space per schema (two-key locks never meet
        # the one-key lock of schema creation).
        self._space = zlib.crc32(schema.encode()) - 2**31
        self._driver: _postgres.Driver | None = None
        self._identities = IdentityCache()

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

    def admin(self) -> LedgerAdmin:
        """The operator's view of this ledger (``recallbound ledger …``): a
        :class:`~plugin.control.postgres_admin.PostgresAdmin`."""
        from .postgres_admin import PostgresAdmin  # it builds on this module

        return PostgresAdmin(self)

    async def __aenter__(self) -> PostgresLedger:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Open the pool, then create or migrate the schema (idempotent across workers)."""
        if self._driver is not None:
            return
        driver = _postgres.make_driver(
            self._dsn, min_size=self._min_size, max_size=self._max_size,
            settings=self._settings, connect_timeout=self._connect_timeout,
            pool_timeout=self._pool_timeout, name=f"recallbound-{self._schema}",
        )
        try:
            with anyio.CancelScope(shield=True):
                await driver.open()
                self._driver = driver
                await self._write(self._setup, "opening the ledger")
        except BaseException as exc:
            self._driver = None
            with anyio.CancelScope(shield=True):
                await driver.close()
            if isinstance(exc, psycopg.Error):
                raise _translate(exc, f"opening ledger schema {self._schema!r}",
                                 self._secret) from exc
            raise

    async def _setup(self, s: _postgres.Session) -> None:
        await s.fetchall("SELECT pg_advisory_xact_lock(hashtext(%s)::bigint)",
                         (f"recallbound schema {self._schema}",))
        ((relations, has_meta),) = await s.fetchall(
            "SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %(n)s), "
            "to_regclass(%(meta)s) IS NOT NULL",
            {"n": self._schema, "meta": f"{self._q}.recallbound_meta"},
        )
        if has_meta:
            ((application, version),) = await s.fetchall(
                f"SELECT application, version FROM {self._q}.recallbound_meta")
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
            await s.fetchall(f"CREATE SCHEMA IF NOT EXISTS {self._q}")
            await s.fetchall(_META.format(s=self._q))
            await s.fetchall(
                f"INSERT INTO {self._q}.recallbound_meta (application, version) VALUES (%s, 0)",
                (APPLICATION,))
        for step in _MIGRATIONS[version:]:
            for statement in step:
                await s.fetchall(statement.format(s=self._q))
        if version < SCHEMA_VERSION:
            await s.fetchall(f"UPDATE {self._q}.recallbound_meta SET version = %s",
                             (SCHEMA_VERSION,))

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
        self, fn: Callable[[_postgres.Session], Awaitable[T]], where: str, *, write: bool
    ) -> T:
        """Run ``fn`` on a pooled connection: in one shielded transaction if ``write``.

        A connection lost while idle in the pool (the server restarted) fails on the first
        statement, before anything can have been written: that is retried on another
        connection, at most once per pooled connection. Any later loss is not retried (a
        commit may or may not have happened) and becomes :class:`LedgerUnavailableError`.
        """
        driver = self._connected()
        try:
            for _ in range(self._max_size + 1):
                try:
                    async with driver.session() as session:
                        with anyio.CancelScope(shield=True):
                            if write:
                                return await self._transaction(session, fn)
                            return await _first(session, fn)
                except _StaleConnection:
                    continue
            raise LedgerUnavailableError(f"{where}: every pooled connection was lost")
        except psycopg.Error as exc:
            raise _translate(exc, where, self._secret) from exc

    @staticmethod
    async def _transaction(
        session: _postgres.Session, fn: Callable[[_postgres.Session], Awaitable[T]]
    ) -> T:
        await _first(session, lambda s: s.fetchall("BEGIN"))
        try:
            result = await fn(session)
            await session.fetchall("COMMIT")
        except BaseException:
            # A lost connection has rolled back already (or committed: we cannot know, and
            # report the failure either way: no permit for an unconfirmed commit).
            if not session.broken:
                with contextlib.suppress(psycopg.Error):
                    await session.fetchall("ROLLBACK")
            raise
        return result

    async def _write(self, fn: Callable[[_postgres.Session], Awaitable[T]], where: str) -> T:
        return await self._session(fn, where, write=True)

    async def _read(self, sql: str, params: dict[str, Any], where: str) -> list[tuple[Any, ...]]:
        return await self._session(lambda s: s.fetchall(sql, params), where, write=False)

    # -- the Ledger protocol -----------------------------------------------------------------

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
        params: dict[str, Any] = {
            "run_id": run_id, "kind": kind.value, "requested": requested,
            "deadline_s": policy.deadline_s, "max_searches": policy.max_searches,
            "max_rounds": policy.max_rounds, "space": self._space,
        }

        async def judge(s: _postgres.Session) -> tuple[Any, ...]:
            await s.fetchall(_LOCK_RUN, params)
            # Read after the lock: a round that waited for another worker past the deadline
            # is refused, not born expired.
            params["floor"] = read_time(floor)
            if self._time_source == "caller":
                params["now"] = read_time(now)
            ((*row,),) = await s.fetchall(self._sql["reserve"], params)
            return tuple(row)

        (judged, executed, rounds, reserved, grant, deadline, opened, reason,
         reserved_before) = await self._write(judge, f"reserving a round of run {run_id!r}")
        if rounds is None:
            return BudgetRefusal(
                reason=RefusalReason(reason), run_id=run_id, reserved=reserved_before,
                executed=executed,
            )
        return Reservation(
            run_id=run_id, round_index=rounds, kind=kind, requested=requested,
            first_slot=reserved - grant + 1, slots=grant, reserved=reserved, executed=executed,
            deadline_wall=float(deadline), opened_wall=float(opened),
            reserved_wall=float(judged),
        )

    async def record(
        self, attempts: Sequence[AttemptTrace], refusals: Sequence[RefusalRecord]
    ) -> None:
        if not attempts and not refusals:
            return
        q = self._q

        async def write(s: _postgres.Session) -> None:
            if attempts:
                await s.executemany(
                    f"INSERT INTO {q}.attempts VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                    "%s) ON CONFLICT (attempt_id) DO UPDATE SET "
                    "outcome = excluded.outcome, elapsed_s = excluded.elapsed_s",
                    [
                        (t.attempt_id, t.run_id, t.round_index, t.slot, t.kind, t.strategy,
                         t.fingerprint, t.outcome.value, t.started_wall, t.elapsed_s, t.legacy)
                        for t in attempts
                    ],
                )
            if refusals:
                await s.executemany(
                    f"INSERT INTO {q}.refusals (run_id, round_index, what, kind, reason, "
                    "at_wall) VALUES (%s, %s, %s, %s, %s, %s)",
                    [(r.run_id, r.round_index, r.what, r.kind, r.reason.value, r.at_wall)
                     for r in refusals],
                )

        await self._write(write, "recording traces")

    async def _known(self, s: _postgres.Session, run_id: str, ids: list[str]) -> set[str]:
        rows = await s.fetchall(
            f"SELECT evidence_id FROM {self._q}.retained "
            "WHERE run_id = %s AND evidence_id = ANY(%s)", (run_id, ids))
        return {row[0] for row in rows}

    async def retain(self, run_id: str, evidence_ids: Sequence[str], *, limit: int) -> None:
        ids = list(dict.fromkeys(evidence_ids))
        if not ids or limit < 1:
            return

        async def write(s: _postgres.Session) -> None:
            await s.fetchall(_LOCK_RUN, {"space": self._space, "run_id": run_id})
            ((held,),) = await s.fetchall(
                f"SELECT count(*) FROM {self._q}.retained WHERE run_id = %s", (run_id,))
            known = await self._known(s, run_id, ids)
            fresh = [i for i in ids if i not in known][: max(0, limit - held)]
            if fresh:
                await s.executemany(f"INSERT INTO {self._q}.retained VALUES (%s, %s)",
                                    [(run_id, i) for i in fresh])

        await self._write(write, f"retaining evidence of run {run_id!r}")

    async def bind_identity(self, run_id: str, *, principal: str, scope: str) -> None:
        identity_arguments(run_id, principal, scope)
        bound = self._identities.get(run_id)
        if bound is None:

            async def write(s: _postgres.Session) -> tuple[str, str]:
                # Two statements: the SELECT takes a new snapshot, so it sees the row of a
                # concurrent first writer that the INSERT waited for and skipped.
                await s.fetchall(
                    f"INSERT INTO {self._q}.run_identity VALUES (%s, %s, %s) "
                    "ON CONFLICT (run_id) DO NOTHING", (run_id, principal, scope))
                ((who, where),) = await s.fetchall(
                    f"SELECT principal, scope FROM {self._q}.run_identity WHERE run_id = %s",
                    (run_id,))
                return str(who), str(where)

            bound = self._identities.put(
                run_id, await self._write(write, f"binding the identity of run {run_id!r}"))
        check_identity(run_id, bound, principal, scope)

    async def take_validations(
        self, run_id: str, evidence_ids: Sequence[str], *, limit: int
    ) -> dict[str, Validity]:
        ids = list(dict.fromkeys(evidence_ids))
        if not ids:
            return {}

        async def write(s: _postgres.Session) -> dict[str, Validity]:
            await s.fetchall(_LOCK_RUN, {"space": self._space, "run_id": run_id})
            known = await self._known(s, run_id, ids)
            rows = await s.fetchall(
                f"SELECT used FROM {self._q}.validations WHERE run_id = %s", (run_id,))
            answers, used = grant_validations(ids, known, rows[0][0] if rows else 0, limit)
            await s.fetchall(
                f"INSERT INTO {self._q}.validations VALUES (%s, %s) "
                "ON CONFLICT (run_id) DO UPDATE SET used = excluded.used", (run_id, used))
            return answers

        return await self._write(write, f"taking validations of run {run_id!r}")

    async def usage(self, run_id: str) -> Usage:
        ((rounds, reserved, deadline, executed, refused, legacy),) = await self._read(
            self._sql["usage"], {"r": run_id}, f"reading the usage of run {run_id!r}")
        if rounds is None:
            return Usage(run_id=run_id, legacy_attempts=legacy, refused=refused)
        return Usage(
            run_id=run_id, rounds=rounds, reserved=reserved, executed=executed, refused=refused,
            deadline_wall=float(deadline), legacy_attempts=legacy,
        )

    async def reservations(self, run_id: str) -> list[Reservation]:
        rows = await self._read(
            f"SELECT r.round_index, r.kind, r.requested, r.first_slot, r.slots, "
            f"r.first_slot + r.slots - 1, r.executed, r.reserved_wall, u.deadline_wall, "
            f"u.opened_wall FROM {self._q}.rounds r JOIN {self._q}.runs u USING (run_id) "
            f"WHERE r.run_id = %(r)s ORDER BY r.round_index",
            {"r": run_id}, f"reading the rounds of run {run_id!r}",
        )
        return [
            Reservation(
                run_id=run_id, round_index=index, kind=RoundKind(kind), requested=requested,
                first_slot=first, slots=slots, reserved=last, executed=executed,
                deadline_wall=float(deadline), opened_wall=float(opened),
                reserved_wall=float(at),
            )
            for index, kind, requested, first, slots, last, executed, at, deadline, opened in rows
        ]

    async def attempts(self, run_id: str) -> list[AttemptTrace]:
        rows = await self._read(
            f"SELECT attempt_id, round_index, slot, kind, strategy, fingerprint, outcome, "
            f"started_wall, elapsed_s, legacy FROM {self._q}.attempts WHERE run_id = %(r)s "
            f"ORDER BY legacy, round_index, slot, started_wall",
            {"r": run_id}, f"reading the attempts of run {run_id!r}",
        )
        return [
            AttemptTrace(
                attempt_id=attempt_id, run_id=run_id, round_index=round_index, slot=slot,
                kind=kind, strategy=strategy, fingerprint=fingerprint,
                outcome=AttemptOutcome(outcome), started_wall=float(started),
                elapsed_s=None if elapsed is None else float(elapsed), legacy=bool(legacy),
            )
            for (attempt_id, round_index, slot, kind, strategy, fingerprint, outcome, started,
                 elapsed, legacy) in rows
        ]

    async def refusals(self, run_id: str) -> list[RefusalRecord]:
        rows = await self._read(
            f"SELECT round_index, what, kind, reason, at_wall FROM {self._q}.refusals "
            f"WHERE run_id = %(r)s ORDER BY id",
            {"r": run_id}, f"reading the refusals of run {run_id!r}",
        )
        return [
            RefusalRecord(
                run_id=run_id, round_index=round_index, what=what, kind=kind,
                reason=RefusalReason(reason), at_wall=float(at),
            )
            for round_index, what, kind, reason, at in rows
        ]


async def _first(
    session: _postgres.Session, fn: Callable[[_postgres.Session], Awaitable[T]]
) -> T:
    """``fn(session)`` as the first statement on a checked-out connection.

    If that connection turns out to be lost (closed by a server restart while it sat in the
    pool), nothing ran: :class:`_StaleConnection` tells the caller to retry on another one.
    """
    try:
        return await fn(session)
    except psycopg.OperationalError as exc:
        if session.broken and not isinstance(exc, psycopg_pool.PoolTimeout):
            raise _StaleConnection(str(exc)) from exc
        raise
