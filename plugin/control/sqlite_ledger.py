"""The default durable ledger: one SQLite file in WAL mode, ``synchronous=FULL``.

Several processes may share one ledger file. The check-and-reserve of a round is a single
``INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING`` inside ``BEGIN IMMEDIATE``, so two
processes never both see the last slot as free. Every transaction is shielded from
cancellation: a task cancelled between ``BEGIN IMMEDIATE`` and ``COMMIT`` would otherwise leave
the write lock held. Under ``synchronous=NORMAL`` a power loss could roll back a committed
reservation and re-grant a slot whose search already ran, hence FULL.
"""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import anyio

from plugin.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LedgerClosedError,
    LedgerCorruptError,
    LedgerError,
    LedgerFullError,
    LedgerLockedError,
    LedgerPathError,
    LedgerUnavailableError,
)

from . import _sqlite, validate
from ._group import GroupCommit
from ._sqlite.reserve import reserve_one
from ._sqlite.translate import Family
from ._sqlite.translate import translate as translate_sqlite
from .dsn import is_connection_string, redact
from .dsn_text import uri_problem
from .ledger import Reservation, WallTime
from .policy import AllowancePolicy, RoundKind
from .refusal import BudgetRefusal
from .sql_ledger import SqlLedger
from .sql_schema import (
    REFUSAL_KEYS,
    SPEND_TOMBSTONES,
    TABLES,
    Dialect,
    ReserveRequest,
    Row,
    Session,
    create_table,
)

T = TypeVar("T")

APPLICATION_ID = 0x52424C44  # "RBLD"
SCHEMA_VERSION = 8
_MIGRATABLE = frozenset({1, 2, 3, 4, 5, 6, 7})
"""Older schema versions this ledger upgrades in place (their tables are a subset)."""

_TYPES = {"text": "TEXT", "real": "REAL", "int": "INTEGER", "bool": "INTEGER",
          "serial": "INTEGER PRIMARY KEY"}
_SCHEMA = [statement for table in TABLES
           for statement in create_table(table, _TYPES, if_not_exists=True, suffix=" STRICT")]
"""The whole schema, created up to date (an older version's tables are a subset)."""

_IDENTITY = """
SELECT (SELECT application_id FROM pragma_application_id()),
       (SELECT user_version FROM pragma_user_version()),
       (SELECT count(*) FROM sqlite_schema)  -- any table, view, index or trigger
"""

_FAMILY = Family("ledger", LedgerError, LedgerPathError, LedgerLockedError, LedgerFullError,
                 LedgerCorruptError)


_DAMAGED = (sqlite3.Error, UnicodeDecodeError)
"""What SQLite raises on a damaged file: its own errors, and text that is not UTF-8 (a damaged
schema's name, or its "malformed" message quoting one)."""


def _translate(exc: BaseException, path: str) -> LedgerError:
    translated = translate_sqlite(exc, _FAMILY, path)
    assert isinstance(translated, LedgerError)
    return translated


MAX_TIMEOUT_S = 86_400.0


def _busy_timeout(value: object) -> float:
    """A busy timeout in seconds: a finite number from 0 to a day."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentTypeError(
            f"SqliteLedger timeout must be a number of seconds, got {type(value).__name__}"
        )
    if not 0.0 <= value <= MAX_TIMEOUT_S:  # also False for NaN
        raise InvalidArgumentError(
            f"SqliteLedger timeout must be between 0 and {MAX_TIMEOUT_S:g} s, got {value!r}"
        )
    return float(value)


class SqliteLedger(SqlLedger):
    """The default :class:`~plugin.control.ledger.Ledger`: ``async with SqliteLedger(path)``.

    ``timeout`` is how long a statement waits for another process's write lock before the
    operation fails with :class:`~plugin.errors.LedgerLockedError`. Opening creates the schema
    and switches the file to WAL; several processes may open one file at once.

    Raises :class:`~plugin.errors.LedgerPathError` when the path is a connection string (at
    construction, never a file of that name), the folder does not exist or the file cannot be
    opened, :class:`~plugin.errors.LedgerCorruptError` for a file that is not a
    recallbound ledger (or is damaged), :class:`~plugin.errors.LedgerLockedError` when busy
    beyond ``timeout``. Every error is a :class:`~plugin.errors.LedgerError`.
    """

    _dialect = Dialect(name="sqlite")
    schema_version = SCHEMA_VERSION
    backend = "sqlite"
    storage_checks = ("storage integrity (PRAGMA integrity_check)", "the ledger's identity",
                      "WAL mode")

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float = 5.0, group_commit: bool = True
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidArgumentTypeError(
                f"SqliteLedger path must be a str or PathLike, got {type(path)!r}"
            )
        self._path = os.fspath(path)
        if self._path == "" or "\x00" in self._path:
            raise LedgerPathError(f"invalid ledger path {redact(self._path)!r}")
        if is_connection_string(self._path):
            # Never a file of that name (its name would hold the password); not echoed.
            raise LedgerPathError(
                "SqliteLedger takes a file path, and this one is a connection string: open "
                "it with open_ledger() or PostgresLedger (a file of such a name: give its "
                "absolute path)")
        problem = uri_problem(self._path)
        if problem is not None:
            raise LedgerPathError(f"ledger {redact(self._path)!r} {problem}")
        self._timeout = _busy_timeout(timeout)
        self._conn: _sqlite.Connection | None = None
        self._now: sqlite3.Connection | None = None
        """A second connection for short unsynced transactions run on the loop itself (a file
        on disk only; without it, or while the file is locked, the thread path serves)."""
        self._file: _sqlite.FileIdentity | None = None
        """The opened file (a file on disk only): writes check it is still at its path."""
        super().__init__()
        # One connection, many tasks: a transaction must never interleave with another task's
        # statements on the same connection ("cannot start a transaction within a transaction").
        self._lock = anyio.Lock()
        if not isinstance(group_commit, bool):
            raise InvalidArgumentTypeError(
                f"SqliteLedger group_commit must be a bool, got {type(group_commit).__name__}"
            )
        self._group: GroupCommit[ReserveRequest, Reservation | BudgetRefusal] | None = (
            GroupCommit(self._lock, self._reserve_batch, self._shared_failure)
            if group_commit else None
        )

    @property
    def path(self) -> str:
        return self._path

    @property
    def location(self) -> str:
        return self._path

    async def open(self) -> None:
        """Connect, switch to WAL and create the schema (idempotent across processes)."""
        if self._conn is not None:
            return
        problem = await _sqlite.path_problem(self._path)
        if problem is not None:
            raise LedgerPathError(f"ledger {redact(self._path)!r}: {problem}")
        if await _sqlite.not_a_database(self._path):
            raise LedgerCorruptError(f"ledger {redact(self._path)!r} is not a SQLite database")
        try:
            conn = await _sqlite.connect(self._path, timeout=self._timeout)
        except (sqlite3.Error, UnicodeDecodeError, OSError) as exc:
            raise _translate(exc, self._path) from exc
        try:
            with anyio.CancelScope(shield=True):
                await self._setup(conn)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await conn.close()
            if isinstance(exc, _DAMAGED):
                raise _translate(exc, self._path) from exc
            raise
        self._conn = conn
        if self._path != ":memory:" and not self._path.startswith("file:"):
            self._file = _sqlite.file_identity(self._path)
            with contextlib.suppress(sqlite3.Error), anyio.CancelScope(shield=True):
                self._now = await anyio.to_thread.run_sync(_sqlite.open_now, self._path)

    async def _check_identity(self, conn: _sqlite.Connection) -> bool:
        """Whether the file is already our ledger (False: empty, to be created).

        Raises :class:`LedgerCorruptError` for any other database, before anything is changed.
        """
        # One statement, one snapshot: separate reads could straddle another process's commit
        # of the schema and see half of it.
        app_id, version, tables = (await conn.fetchall(_IDENTITY))[0]
        if app_id == 0 and version == 0:
            if tables:
                raise LedgerCorruptError(
                    f"{redact(self._path)!r} is an SQLite database but not a recallbound ledger"
                )
            return False
        if app_id != APPLICATION_ID:
            raise LedgerCorruptError(f"{redact(self._path)!r} is not a recallbound ledger")
        if version in _MIGRATABLE:
            return False  # ours, an older schema: created up to date under the write lock
        if version != SCHEMA_VERSION:
            raise LedgerCorruptError(
                f"ledger {redact(self._path)!r} has schema version {version}; "
                f"this recallbound reads version {SCHEMA_VERSION}"
            )
        return True

    async def _setup(self, conn: _sqlite.Connection) -> None:
        # Refuse a foreign file before touching it (the journal-mode switch would change it).
        await self._check_identity(conn)
        mode = await _sqlite.switch_to_wal(conn, timeout=self._timeout)
        if mode.lower() not in ("wal", "memory"):
            raise LedgerError(
                f"ledger {redact(self._path)!r} could not switch to WAL (mode {mode!r})")
        await conn.fetchall("PRAGMA synchronous=FULL")
        async with _sqlite.immediate(conn, self._lock):
            # Checked again under the write lock: another process may have created it since.
            if not await self._check_identity(conn):
                # One statement at a time: executescript would commit the transaction first.
                for statement in _SCHEMA:
                    await conn.fetchall(statement)
                # Version 4: each attempt counts the evidence dropped for naming another
                # principal or scope (an older file's attempts table gains the column).
                columns = {row[1] for row in await conn.fetchall("PRAGMA table_info(attempts)")}
                if "dropped" not in columns:
                    await conn.fetchall(
                        "ALTER TABLE attempts ADD COLUMN dropped INTEGER NOT NULL DEFAULT 0")
                # Version 6: call records (their table is created above) and tombstones (a
                # pruned run keeps its row, marked).
                columns = {row[1] for row in await conn.fetchall("PRAGMA table_info(runs)")}
                if "pruned" not in columns:
                    await conn.fetchall(
                        "ALTER TABLE runs ADD COLUMN pruned INTEGER NOT NULL DEFAULT false")
                # Version 7: an attempt's refusal has a unique key (written twice, one row).
                columns = {row[1] for row in await conn.fetchall("PRAGMA table_info(refusals)")}
                if "refusal_key" not in columns:
                    await conn.fetchall("ALTER TABLE refusals ADD COLUMN refusal_key TEXT")
                await conn.fetchall(REFUSAL_KEYS.replace("{q}", ""))
                # Version 8: the tombstones an older release left unspent are spent.
                await conn.fetchall(SPEND_TOMBSTONES.replace("{q}", ""))
                await conn.fetchall(f"PRAGMA application_id = {APPLICATION_ID}")
                await conn.fetchall(f"PRAGMA user_version = {SCHEMA_VERSION}")

    async def aclose(self) -> None:
        """Close the connection; idempotent."""
        conn, self._conn = self._conn, None
        now, self._now = self._now, None
        if now is not None:
            now.close()
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()

    def _connection(self) -> _sqlite.Connection:
        if self._conn is None:
            raise LedgerClosedError("SqliteLedger is not open: use `async with SqliteLedger(...)`")
        return self._conn

    def _check_file(self) -> None:
        """Refuse a write once the opened file is no longer at its path (deleted or replaced
        while open): what it committed there no one would see, and a run's allowance could be
        granted twice."""
        if not _sqlite.still_there(self._file):
            raise LedgerUnavailableError(
                f"ledger {redact(self._path)!r} is no longer the file this ledger opened "
                "(deleted or replaced while open): open it again")

    async def _fetch(self, sql: str, params: Mapping[str, Any], where: str) -> list[Row]:
        conn = self._connection()
        async with self._lock:
            try:
                return await conn.fetchall(sql, params)
            except sqlite3.Error as exc:
                raise _translate(exc, self._path) from exc

    async def _transact(
        self, fn: Callable[[Session], Awaitable[T]], where: str, *, read_only: bool = False
    ) -> T:
        """One shielded ``BEGIN IMMEDIATE`` transaction (``BEGIN`` when ``read_only``), in
        one hop to the connection's thread."""
        conn = self._connection()
        if not read_only:
            self._check_file()
        try:
            return await _sqlite.transaction(
                conn, self._lock, fn, begin="BEGIN" if read_only else "BEGIN IMMEDIATE")
        except _DAMAGED as exc:
            raise _translate(exc, self._path) from exc

    async def _transact_unsynced(self, fn: Callable[[Session], Awaitable[T]], where: str) -> T:
        """One ``BEGIN IMMEDIATE`` transaction committed without a sync of its own: on the
        loop at once while no connection holds the write lock, else in its turn on the
        connection's thread."""
        conn = self._connection()
        self._check_file()
        try:
            if self._now is not None:
                with contextlib.suppress(_sqlite.Busy):
                    return _sqlite.transaction_now(self._now, fn)
            return await _sqlite.transaction(conn, self._lock, fn, synced=False)
        except _DAMAGED as exc:
            raise _translate(exc, self._path) from exc

    async def _inspect_storage(self, session: Session, problems: list[str]) -> tuple[int, bool]:
        app_id, version = (await session.fetchall(
            "SELECT (SELECT application_id FROM pragma_application_id()), "
            "(SELECT user_version FROM pragma_user_version())", {}))[0]
        if app_id != APPLICATION_ID:
            problems.append(f"application id {app_id:#x} is not a recallbound ledger's")
        for (verdict,) in await session.fetchall("PRAGMA integrity_check", {}):
            if verdict != "ok":
                problems.append(f"integrity: {verdict}")
        (mode,) = (await session.fetchall("PRAGMA journal_mode", {}))[0]
        if str(mode).lower() not in ("wal", "memory"):
            problems.append(f"journal mode is {mode!r}, not WAL")
        return int(version), True

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
        request = ReserveRequest(run_id, kind, requested, policy, now, floor)
        self._connection()  # closed: fail now, not inside someone else's batch
        self._check_file()
        if self._group is None:
            async with self._lock:
                (outcome,) = await self._reserve_batch([request])
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        return await self._group.submit(request)

    async def _reserve_batch(
        self, batch: Sequence[ReserveRequest]
    ) -> list[Reservation | BudgetRefusal | BaseException]:
        """One durable transaction for ``batch`` on the connection's thread (one hop)."""
        path = self._path

        Outcomes = list[Reservation | BudgetRefusal | BaseException]

        def reserve_each(conn: sqlite3.Connection) -> Outcomes:
            outcomes: Outcomes = []
            for request in batch:
                # Each request in its own savepoint: one that fails fails alone, whatever it
                # raises (a failing statement, or a caller's clock raising even a
                # BaseException: it reaches that caller, and only that caller).
                conn.execute("SAVEPOINT reserve")
                try:
                    outcomes.append(reserve_one(conn, request))
                except BaseException as exc:
                    conn.execute("ROLLBACK TO reserve")
                    outcomes.append(
                        _translate(exc, path) if isinstance(exc, sqlite3.Error) else exc
                    )
                conn.execute("RELEASE reserve")
            return outcomes

        conn = self._connection()
        outcomes: Outcomes = []
        try:
            with anyio.CancelScope(shield=True):
                outcomes = await conn.run(partial(_sqlite.within, body=reserve_each))
        except sqlite3.Error as exc:
            raise _translate(exc, path) from exc
        return outcomes
