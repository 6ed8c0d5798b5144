"""A fleet's ledger on PostgreSQL: one allowance shared by agent workers on many hosts.

The contract is :class:`~plugin.control.sqlite_ledger.SqliteLedger`'s (the contract suite runs
both). A reservation is one transaction: ``BEGIN``; a transaction-level advisory lock on the
run (``pg_advisory_xact_lock``: two workers reserving for one run queue here); then the time
is read and the round judged in ONE statement, a conditional ``INSERT … ON CONFLICT DO UPDATE
… WHERE … RETURNING`` that records the round, or the refusal, in the same statement;
``COMMIT`` with ``synchronous_commit = on``, so a permit is issued only for a round whose WAL
is flushed. The upsert's row lock alone forbids over-admission; the advisory lock makes the
judged time, a refusal's reason and counts current after any wait (each transaction that
writes is READ COMMITTED, whatever the server's default isolation).

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
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
    LedgerUnavailableError,
)

from . import _postgres, validate
from ._group import GroupCommit
from ._postgres_batch import BEGIN, READ_COMMITTED, Judge, Send
from ._postgres_options import interval_ms as _interval_ms
from ._postgres_schema import (
    LOCK_RUN,
    LOCK_RUNS,
    RESERVE,
    RESERVE_ONE,
    SCHEMA_VERSION,
    SERVER_CLOCK,
    inspect_schema,
    setup_schema,
)
from .dsn import check_schema, conninfo_dict, redact, split_schema
from .ledger import Reservation, WallTime
from .policy import AllowancePolicy, RoundKind
from .refusal import BudgetRefusal
from .sql_ledger import SqlLedger
from .sql_schema import (
    Dialect,
    ReserveRequest,
    Row,
    Rows,
    Session,
)

T = TypeVar("T")

TimeSource = Literal["server", "caller"]


def redact_dsn(dsn: str) -> str:
    """``dsn`` for display: a password in any form as ``***`` (the one redaction)."""
    return redact(dsn)


def _one_line(text: str, secret: str | None) -> str:
    """An error text on one line (libpq's span several), never holding the password."""
    return redact(" ".join(text.split()), secrets=(secret,))


def _translate(exc: BaseException, where: str, secret: str | None = None) -> LedgerError:
    translated = _translate_type(exc, where)
    return type(translated)(_one_line(str(translated), secret))


def _cause(exc: BaseException, secret: str | None) -> BaseException | None:
    """``exc`` as the typed error's cause, unless the connection string holds a password: a
    driver error keeps the connection it came from (``pgconn``, whose options hold the
    password), so then the typed error, raised outside the handler, keeps no driver error in
    its chain at all (its message already says what the driver said, redacted)."""
    return None if secret else exc


def _translate_type(exc: BaseException, where: str) -> LedgerError:
    if isinstance(exc, psycopg.Error) and _postgres.REFUSED_OPTION.search(str(exc)):
        return LedgerConfigError(f"{where}: the connection string holds an option libpq "
                                 f"refuses: {exc}")
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


class PostgresLedger(SqlLedger):
    """A :class:`~plugin.control.ledger.Ledger` on PostgreSQL: ``async with PostgresLedger(dsn)``.

    ``schema`` holds the ledger's tables (created, or migrated from an older version, at open;
    safe when many workers open at once): ``"recallbound"`` unless given here or as the DSN's
    ``?schema=`` parameter. ``time_source`` is whose clock judges rounds:
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
        schema: str | None = None,
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
            raise LedgerConfigError(
                f"PostgresLedger dsn must be a non-empty str, got {type(dsn).__name__}")
        dsn, named = split_schema(dsn)  # ``?schema=`` is recallbound's, never libpq's
        if named is not None and schema is not None and named != schema:
            raise LedgerConfigError(
                f"the DSN names schema {named!r} and schema= names {schema!r}: give one")
        schema = schema if schema is not None else named if named is not None else "recallbound"
        check_schema(schema)
        if time_source not in ("server", "caller"):
            raise LedgerConfigError(f"time_source must be 'server' or 'caller': {time_source!r}")
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
        # Parsed once: a LedgerConfigError, the password never shown, if libpq cannot read it.
        password = conninfo_dict(dsn).get("password")
        self._dsn = dsn
        self._secret = password if isinstance(password, str) and password else None
        self._schema = schema
        self._create = create
        self._time_source: TimeSource = time_source
        self._min_size, self._max_size = min_size, max_size
        self._connect_timeout = float(connect_timeout)
        self._pool_timeout, self._statement_timeout = float(pool_timeout), float(statement_timeout)
        lone_settings = {
            "statement": _interval_ms(statement_timeout), "lock": _interval_ms(lock_timeout),
            "idle": _interval_ms(statement_timeout * 2),
        }
        self._settings = (
            "SELECT set_config('synchronous_commit', 'on', true), "
            "set_config('extra_float_digits', '3', true), "
            f"set_config('statement_timeout', '{_interval_ms(statement_timeout)}', true), "
            f"set_config('lock_timeout', '{_interval_ms(lock_timeout)}', true), "
            "set_config('idle_in_transaction_session_timeout', "
            f"'{_interval_ms(statement_timeout * 2)}', true)"
        )
        """What every transaction sets for itself (``SET LOCAL``), nothing of the session: times
        read back as text with every digit whatever the role, database or DSN sets; a worker
        hung inside a transaction does not hold a run's lock forever."""
        quoted = f'"{schema}"'
        self._q = quoted
        server = time_source == "server"
        self._dialect = Dialect(
            name="postgresql", prefix=quoted + ".", pyformat=True, id_list="= ANY(:{name})",
            id_rows="unnest(:{name}::text[]) WITH ORDINALITY AS j(value, key)", greatest="greatest",
            lock_run=LOCK_RUN, for_update=" FOR UPDATE", binary_order=' COLLATE "C"',
            clock=SERVER_CLOCK if server else None,
        )
        # Advisory locks on runs live in their own space per schema (two-key locks never meet
        # the one-key lock of schema creation).
        self._space = zlib.crc32(schema.encode()) - 2**31
        self._judge = Judge(
            settings=self._settings, lone_settings=lone_settings, space=self._space,
            caller=time_source == "caller", reserve=self._dialect.sql(RESERVE),
            reserve_one=self._dialect.sql(RESERVE_ONE), lock_runs=self._dialect.sql(LOCK_RUNS))
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
            statement_timeout=self._statement_timeout, name=f"recallbound-{self._schema}",
        )
        failure: tuple[LedgerError, BaseException | None] | None = None
        try:
            with anyio.CancelScope(shield=True):
                await driver.open()
                self._driver = driver
                await self._transact(self._setup, "opening the ledger")
        except BaseException as exc:
            self._driver = None
            with anyio.CancelScope(shield=True):
                await driver.close()
            if not isinstance(exc, psycopg.Error):
                raise
            failure = (_translate(exc, f"opening ledger schema {self._schema!r}",
                                  self._secret), _cause(exc, self._secret))
        if failure is not None:  # raised here, so no driver error is its implicit context
            raise failure[0] from failure[1]

    async def _setup(self, s: Session) -> None:
        await setup_schema(s, self._schema, create=self._create)

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
                        return await fn(session)
                    except BaseException:
                        if not session.broken:
                            with contextlib.suppress(psycopg.Error):
                                await session.fetchall("ROLLBACK")
                        raise
        except psycopg.Error as exc:
            failure = (_translate(exc, where, self._secret), _cause(exc, self._secret))
        raise failure[0] from failure[1]  # outside the handler: see _cause

    def _begin(self, *, read_only: bool) -> list[tuple[str, None]]:
        begin = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY" if read_only else BEGIN
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
        return (await self._one_trip(where)([READ_COMMITTED, (self._settings, None),
                                             (sql, params)]))[2]

    async def _write_rows(self, statements: Rows, where: str) -> None:
        # The whole transaction in one round trip (on trio, one hop to a worker thread): the
        # statements of one query are one implicit transaction, committed whole or not at all.
        await self._one_trip(where)([
            READ_COMMITTED, (self._settings, None),
            *((sql, row) for sql, rows in statements for row in rows),
        ])

    def _lock_params(self, run_id: str) -> dict[str, Any]:
        return {"run_id": run_id, "space": self._space}

    async def _inspect_storage(self, session: Session, problems: list[str]) -> tuple[int, bool]:
        return await inspect_schema(session, self._schema, problems)

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
                return await self._judge.judge(batch, self._one_trip(where))
            return await self._session(lambda s: self._judge.judge(batch, s.pipeline), where)
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

    def _one_trip(self, where: str) -> Send:
        """Send a whole transaction: a connection checked out, the statements, back (on trio,
        one hop to a worker thread); errors typed."""
        driver = self._connected()

        async def send(statements: Sequence[tuple[str, Any]]) -> list[list[Row]]:
            try:
                return await driver.transaction(statements)
            except psycopg.Error as exc:
                failure = (_translate(exc, where, self._secret), _cause(exc, self._secret))
            raise failure[0] from failure[1]  # outside the handler: see _cause

        return send
