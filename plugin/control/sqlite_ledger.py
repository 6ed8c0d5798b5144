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
import json
import math
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TypeVar

import anyio
import attrs

from plugin.errors import (
    InvalidArgumentTypeError,
    InvalidLedgerOptionError,
    LedgerClosedError,
    LedgerCorruptError,
    LedgerError,
    LedgerFullError,
    LedgerLockedError,
    LedgerPathError,
)

from . import _sqlite
from ._sqlite.group import GroupCommit
from ._sqlite.translate import Family
from ._sqlite.translate import translate as translate_sqlite
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
from .policy import AllowancePolicy, RoundKind
from .refusal import BudgetRefusal, RefusalReason

T = TypeVar("T")

APPLICATION_ID = 0x52424C44  # "RBLD"
SCHEMA_VERSION = 3
_MIGRATABLE = frozenset({1, 2})
"""Older schema versions this ledger upgrades in place (their tables are a subset)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id        TEXT PRIMARY KEY,
    opened_wall   REAL NOT NULL,
    deadline_wall REAL NOT NULL,
    max_searches  INTEGER NOT NULL,
    max_rounds    INTEGER NOT NULL,
    rounds        INTEGER NOT NULL,
    reserved      INTEGER NOT NULL,
    last_grant    INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS rounds (
    run_id        TEXT NOT NULL,
    round_index   INTEGER NOT NULL,
    kind          TEXT NOT NULL,
    requested     INTEGER NOT NULL,
    first_slot    INTEGER NOT NULL,
    slots         INTEGER NOT NULL,
    executed      INTEGER NOT NULL,
    reserved_wall REAL NOT NULL,
    PRIMARY KEY (run_id, round_index)
) STRICT;
CREATE TABLE IF NOT EXISTS attempts (
    attempt_id   TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL,
    round_index  INTEGER NOT NULL,
    slot         INTEGER NOT NULL,
    kind         TEXT NOT NULL,
    strategy     TEXT,
    fingerprint  TEXT,
    outcome      TEXT NOT NULL,
    started_wall REAL NOT NULL,
    elapsed_s    REAL,
    legacy       INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS attempts_by_run ON attempts (run_id, legacy);
CREATE TABLE IF NOT EXISTS refusals (
    id          INTEGER PRIMARY KEY,
    run_id      TEXT NOT NULL,
    round_index INTEGER,
    what        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    reason      TEXT NOT NULL,
    at_wall     REAL NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS refusals_by_run ON refusals (run_id);
CREATE TABLE IF NOT EXISTS retained (
    run_id      TEXT NOT NULL,
    evidence_id TEXT NOT NULL,
    PRIMARY KEY (run_id, evidence_id)
) STRICT;
CREATE TABLE IF NOT EXISTS validations (
    run_id      TEXT PRIMARY KEY,
    used        INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS run_identity (
    run_id      TEXT PRIMARY KEY,
    principal   TEXT NOT NULL,
    scope       TEXT NOT NULL
) STRICT;
"""

_IDENTITY = """
SELECT (SELECT application_id FROM pragma_application_id()),
       (SELECT user_version FROM pragma_user_version()),
       (SELECT count(*) FROM sqlite_schema WHERE type = 'table')
"""

_EXECUTED = "(SELECT count(*) FROM attempts a WHERE a.run_id = runs.run_id AND a.legacy = 0)"

_RESERVE = f"""
INSERT INTO runs (run_id, opened_wall, deadline_wall, max_searches, max_rounds,
                  rounds, reserved, last_grant)
VALUES (:run_id, :now, :now + :deadline_s, :max_searches, :max_rounds,
        1, min(:requested, :max_searches), min(:requested, :max_searches))
ON CONFLICT (run_id) DO UPDATE SET
    rounds = rounds + 1,
    last_grant = min(:requested, max_searches - reserved),
    reserved = reserved + min(:requested, max_searches - reserved)
WHERE rounds < max_rounds AND reserved < max_searches AND :now < deadline_wall
RETURNING rounds, reserved, last_grant, deadline_wall, opened_wall, {_EXECUTED}
"""

_RUN_STATE = f"""
SELECT rounds, reserved, deadline_wall, max_rounds, max_searches, {_EXECUTED}
FROM runs WHERE run_id = ?
"""

_USAGE = f"""
SELECT rounds, reserved, deadline_wall, {_EXECUTED},
       (SELECT count(*) FROM refusals f WHERE f.run_id = runs.run_id),
       (SELECT count(*) FROM attempts a WHERE a.run_id = runs.run_id AND a.legacy = 1)
FROM runs WHERE run_id = ?
"""


_FAMILY = Family("ledger", LedgerError, LedgerPathError, LedgerLockedError, LedgerFullError,
                 LedgerCorruptError)


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
        raise InvalidLedgerOptionError(
            f"SqliteLedger timeout must be between 0 and {MAX_TIMEOUT_S:g} s, got {value!r}"
        )
    return float(value)


@attrs.frozen
class _ReserveRequest:
    run_id: str
    kind: RoundKind
    requested: int
    policy: AllowancePolicy
    now: WallTime
    floor: WallTime


def _reserve_one(conn: sqlite3.Connection, request: _ReserveRequest) -> Reservation | BudgetRefusal:
    """The check-and-reserve of one round, inside the caller's write transaction.

    Judged under the write lock: a round that waited for another writer past the deadline is
    refused, not born expired.
    """
    run_id, kind, requested, policy = (
        request.run_id, request.kind, request.requested, request.policy
    )
    now_wall = max(read_time(request.now), read_time(request.floor))
    params = {
        "run_id": run_id,
        "now": now_wall,
        "deadline_s": policy.deadline_s,
        "max_searches": policy.max_searches,
        "max_rounds": policy.max_rounds,
        "requested": requested,
    }
    row = conn.execute(_RESERVE, params).fetchone()
    if row is not None:
        rounds, reserved, grant, deadline, opened, executed = row
        first = reserved - grant + 1
        conn.execute(
            "INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, rounds, kind.value, requested, first, grant, executed, now_wall),
        )
        return Reservation(
            run_id=run_id, round_index=rounds, kind=kind, requested=requested,
            first_slot=first, slots=grant, reserved=reserved, executed=executed,
            deadline_wall=float(deadline), opened_wall=float(opened),
            reserved_wall=float(now_wall),
        )
    rounds, reserved, deadline, max_rounds, max_searches, executed = conn.execute(
        _RUN_STATE, (run_id,)
    ).fetchone()
    if rounds >= max_rounds:
        reason = RefusalReason.ROUNDS
    elif reserved >= max_searches:
        reason = RefusalReason.SLOTS
    else:
        reason = RefusalReason.DEADLINE
    conn.execute(
        "INSERT INTO refusals (run_id, round_index, what, kind, reason, at_wall) "
        "VALUES (?, NULL, 'round', ?, ?, ?)",
        (run_id, kind.value, reason.value, now_wall),
    )
    return BudgetRefusal(reason=reason, run_id=run_id, reserved=reserved, executed=executed)


async def _retained_among(conn: _sqlite.Connection, run_id: str, ids: list[str]) -> set[str]:
    """Which of ``ids`` the run retained."""
    rows = await conn.fetchall(
        "SELECT evidence_id FROM retained WHERE run_id = ? AND evidence_id IN "
        "(SELECT value FROM json_each(?))", (run_id, json.dumps(ids)))
    return {row[0] for row in rows}


class SqliteLedger:
    """The default :class:`~plugin.control.ledger.Ledger`: ``async with SqliteLedger(path)``.

    ``timeout`` is how long a statement waits for another process's write lock before the
    operation fails with :class:`~plugin.errors.LedgerLockedError`. Opening creates the schema
    and switches the file to WAL; several processes may open one file at once.

    Raises :class:`~plugin.errors.LedgerPathError` when the folder does not exist or the file
    cannot be opened, :class:`~plugin.errors.LedgerCorruptError` for a file that is not a
    recallbound ledger (or is damaged), :class:`~plugin.errors.LedgerLockedError` when busy
    beyond ``timeout``. Every error is a :class:`~plugin.errors.LedgerError`.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float = 5.0, group_commit: bool = True
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidArgumentTypeError(
                f"SqliteLedger path must be a str or PathLike, got {type(path)!r}"
            )
        self._path = os.fspath(path)
        if self._path == "" or "\x00" in self._path:
            raise LedgerPathError(f"invalid ledger path {self._path!r}")
        self._timeout = _busy_timeout(timeout)
        self._conn: _sqlite.Connection | None = None
        self._identities = IdentityCache()
        # One connection, many tasks: a transaction must never interleave with another task's
        # statements on the same connection ("cannot start a transaction within a transaction").
        self._lock = anyio.Lock()
        if not isinstance(group_commit, bool):
            raise InvalidArgumentTypeError(
                f"SqliteLedger group_commit must be a bool, got {type(group_commit).__name__}"
            )
        self._group: GroupCommit[_ReserveRequest, Reservation | BudgetRefusal] | None = (
            GroupCommit(self._lock, self._reserve_batch, self._shared_failure)
            if group_commit else None
        )

    def _shared_failure(self, error: BaseException) -> BaseException:
        if isinstance(error, LedgerError):
            return type(error)(str(error))
        return LedgerError(f"ledger {self._path!r}: a group commit failed: {error!r}")

    @property
    def path(self) -> str:
        return self._path

    async def __aenter__(self) -> SqliteLedger:
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
        """Connect, switch to WAL and create the schema (idempotent across processes)."""
        if self._conn is not None:
            return
        problem = await _sqlite.path_problem(self._path)
        if problem is not None:
            raise LedgerPathError(f"ledger {self._path!r}: {problem}")
        try:
            conn = await _sqlite.connect(self._path, timeout=self._timeout)
        except (sqlite3.Error, OSError) as exc:
            raise _translate(exc, self._path) from exc
        try:
            with anyio.CancelScope(shield=True):
                await self._setup(conn)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await conn.close()
            if isinstance(exc, sqlite3.Error):
                raise _translate(exc, self._path) from exc
            raise
        self._conn = conn

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
                    f"{self._path!r} is an SQLite database but not a recallbound ledger"
                )
            return False
        if app_id != APPLICATION_ID:
            raise LedgerCorruptError(f"{self._path!r} is not a recallbound ledger")
        if version in _MIGRATABLE:
            return False  # ours, an older schema: created up to date under the write lock
        if version != SCHEMA_VERSION:
            raise LedgerCorruptError(
                f"ledger {self._path!r} has schema version {version}; "
                f"this recallbound reads version {SCHEMA_VERSION}"
            )
        return True

    async def _setup(self, conn: _sqlite.Connection) -> None:
        # Refuse a foreign file before touching it (the journal-mode switch would change it).
        await self._check_identity(conn)
        # A journal-mode switch needs an exclusive lock and, unlike ordinary statements, may
        # fail busy at once; several processes opening one file retry here until the timeout.
        try:
            with anyio.fail_after(self._timeout + 1.0, shield=True):
                while True:
                    try:
                        (mode,) = (await conn.fetchall("PRAGMA journal_mode=WAL"))[0]
                        break
                    except sqlite3.OperationalError as exc:
                        if not _sqlite.is_locked(exc):
                            raise
                        await anyio.sleep(0.01)
        except TimeoutError:
            raise LedgerLockedError(
                f"ledger {self._path!r} stayed locked by another connection beyond its busy "
                f"timeout while switching to WAL"
            ) from None
        if str(mode).lower() not in ("wal", "memory"):
            raise LedgerError(f"ledger {self._path!r} could not switch to WAL (mode {mode!r})")
        await conn.fetchall("PRAGMA synchronous=FULL")
        await conn.fetchall("BEGIN IMMEDIATE")
        try:
            # Checked again under the write lock: another process may have created it since.
            if not await self._check_identity(conn):
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        await conn.fetchall(statement)
                await conn.fetchall(f"PRAGMA application_id = {APPLICATION_ID}")
                await conn.fetchall(f"PRAGMA user_version = {SCHEMA_VERSION}")
            await conn.fetchall("COMMIT")
        except BaseException:
            # SQLite may have rolled back already (a full disk does): keep the real cause.
            with contextlib.suppress(sqlite3.Error):
                await conn.fetchall("ROLLBACK")
            raise

    async def aclose(self) -> None:
        """Close the connection; idempotent."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()

    def _connection(self) -> _sqlite.Connection:
        if self._conn is None:
            raise LedgerClosedError("SqliteLedger is not open: use `async with SqliteLedger(...)`")
        return self._conn

    async def _read(self, fn: Callable[[_sqlite.Connection], Awaitable[T]]) -> T:
        conn = self._connection()
        async with self._lock:
            try:
                return await fn(conn)
            except sqlite3.Error as exc:
                raise _translate(exc, self._path) from exc

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[_sqlite.Connection]:
        """One shielded ``BEGIN IMMEDIATE`` transaction; ``sqlite3`` errors translated."""
        conn = self._connection()
        try:
            async with _sqlite.immediate(conn, self._lock) as active:
                yield active
        except sqlite3.Error as exc:
            raise _translate(exc, self._path) from exc

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
        request = _ReserveRequest(run_id, kind, requested, policy, now, floor)
        self._connection()  # closed: fail now, not inside someone else's batch
        if self._group is None:
            async with self._lock:
                (outcome,) = await self._reserve_batch([request])
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        return await self._group.submit(request)

    async def _reserve_batch(
        self, batch: Sequence[_ReserveRequest]
    ) -> list[Reservation | BudgetRefusal | BaseException]:
        """One durable transaction for ``batch`` on the connection's thread (one hop)."""
        path = self._path

        def commit(conn: sqlite3.Connection) -> list[Reservation | BudgetRefusal | BaseException]:
            outcomes: list[Reservation | BudgetRefusal | BaseException] = []
            conn.execute("BEGIN IMMEDIATE")
            try:
                for request in batch:
                    # Each request in its own savepoint: one that fails fails alone.
                    conn.execute("SAVEPOINT reserve")
                    try:
                        outcomes.append(_reserve_one(conn, request))
                    except Exception as exc:  # a failing statement or a caller's broken clock
                        conn.execute("ROLLBACK TO reserve")
                        outcomes.append(
                            _translate(exc, path) if isinstance(exc, sqlite3.Error) else exc
                        )
                    conn.execute("RELEASE reserve")
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            return outcomes

        conn = self._connection()
        outcomes: list[Reservation | BudgetRefusal | BaseException] = []
        try:
            with anyio.CancelScope(shield=True):
                outcomes = await conn.run(commit)
        except sqlite3.Error as exc:
            raise _translate(exc, path) from exc
        return outcomes

    async def record(
        self, attempts: Sequence[AttemptTrace], refusals: Sequence[RefusalRecord]
    ) -> None:
        if not attempts and not refusals:
            return
        async with self._write() as conn:
            if attempts:
                await conn.executemany(
                    "INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (attempt_id) DO UPDATE SET "
                    "outcome = excluded.outcome, elapsed_s = excluded.elapsed_s",
                    [
                        (
                            t.attempt_id, t.run_id, t.round_index, t.slot, t.kind, t.strategy,
                            t.fingerprint, t.outcome.value, t.started_wall, t.elapsed_s,
                            int(t.legacy),
                        )
                        for t in attempts
                    ],
                )
            if refusals:
                await conn.executemany(
                    "INSERT INTO refusals (run_id, round_index, what, kind, reason, at_wall) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (r.run_id, r.round_index, r.what, r.kind, r.reason.value, r.at_wall)
                        for r in refusals
                    ],
                )

    async def retain(self, run_id: str, evidence_ids: Sequence[str], *, limit: int) -> None:
        ids = list(dict.fromkeys(evidence_ids))
        if not ids or limit < 1:
            return
        async with self._write() as conn:
            (held,) = (await conn.fetchall(
                "SELECT count(*) FROM retained WHERE run_id = ?", (run_id,)))[0]
            known = await _retained_among(conn, run_id, ids)
            fresh = [i for i in ids if i not in known][: max(0, limit - held)]
            if fresh:
                await conn.executemany(
                    "INSERT INTO retained VALUES (?, ?)", [(run_id, i) for i in fresh]
                )

    async def bind_identity(self, run_id: str, *, principal: str, scope: str) -> None:
        identity_arguments(run_id, principal, scope)
        bound = self._identities.get(run_id)
        if bound is None:
            select = "SELECT principal, scope FROM run_identity WHERE run_id = ?"
            rows = await self._read(lambda conn: conn.fetchall(select, (run_id,)))
            if not rows:  # first writer wins; everyone reads back the winner
                async with self._write() as conn:
                    await conn.fetchall(
                        "INSERT INTO run_identity VALUES (?, ?, ?) "
                        "ON CONFLICT (run_id) DO NOTHING", (run_id, principal, scope))
                    rows = await conn.fetchall(select, (run_id,))
            bound = self._identities.put(run_id, (rows[0][0], rows[0][1]))
        check_identity(run_id, bound, principal, scope)

    async def take_validations(
        self, run_id: str, evidence_ids: Sequence[str], *, limit: int
    ) -> dict[str, Validity]:
        ids = list(dict.fromkeys(evidence_ids))
        if not ids:
            return {}
        async with self._write() as conn:
            known = await _retained_among(conn, run_id, ids)
            rows = await conn.fetchall("SELECT used FROM validations WHERE run_id = ?",
                                       (run_id,))
            answers, used = grant_validations(ids, known, rows[0][0] if rows else 0, limit)
            await conn.fetchall(
                "INSERT INTO validations VALUES (?, ?) "
                "ON CONFLICT (run_id) DO UPDATE SET used = excluded.used",
                (run_id, used),
            )
            return answers

    async def usage(self, run_id: str) -> Usage:
        rows = await self._read(lambda conn: conn.fetchall(_USAGE, (run_id,)))
        if not rows:
            counts = await self._read(
                lambda conn: conn.fetchall(
                    "SELECT (SELECT count(*) FROM attempts WHERE run_id = :r AND legacy = 1), "
                    "(SELECT count(*) FROM refusals WHERE run_id = :r)",
                    {"r": run_id},
                )
            )
            legacy, refused = counts[0]
            return Usage(run_id=run_id, legacy_attempts=legacy, refused=refused)
        rounds, reserved, deadline, executed, refused, legacy_attempts = rows[0]
        return Usage(
            run_id=run_id,
            rounds=rounds,
            reserved=reserved,
            executed=executed,
            refused=refused,
            deadline_wall=float(deadline),
            legacy_attempts=legacy_attempts,
        )

    async def reservations(self, run_id: str) -> list[Reservation]:
        rows = await self._read(
            lambda conn: conn.fetchall(
                "SELECT r.round_index, r.kind, r.requested, r.first_slot, r.slots, "
                "r.first_slot + r.slots - 1, r.executed, r.reserved_wall, u.deadline_wall, "
                "u.opened_wall "
                "FROM rounds r JOIN runs u USING (run_id) WHERE r.run_id = ? "
                "ORDER BY r.round_index",
                (run_id,),
            )
        )
        return [
            Reservation(
                run_id=run_id,
                round_index=index,
                kind=RoundKind(kind),
                requested=requested,
                first_slot=first,
                slots=slots,
                reserved=last,
                executed=executed,
                deadline_wall=float(deadline),
                opened_wall=float(opened),
                reserved_wall=float(at),
            )
            for index, kind, requested, first, slots, last, executed, at, deadline, opened in rows
        ]

    async def attempts(self, run_id: str) -> list[AttemptTrace]:
        rows = await self._read(
            lambda conn: conn.fetchall(
                "SELECT attempt_id, round_index, slot, kind, strategy, fingerprint, outcome, "
                "started_wall, elapsed_s, legacy FROM attempts WHERE run_id = ? "
                "ORDER BY legacy, round_index, slot, started_wall",
                (run_id,),
            )
        )
        return [
            AttemptTrace(
                attempt_id=attempt_id,
                run_id=run_id,
                round_index=round_index,
                slot=slot,
                kind=kind,
                strategy=strategy,
                fingerprint=fingerprint,
                outcome=AttemptOutcome(outcome),
                started_wall=float(started),
                elapsed_s=None if elapsed is None else float(elapsed),
                legacy=bool(legacy),
            )
            for (attempt_id, round_index, slot, kind, strategy, fingerprint, outcome, started,
                 elapsed, legacy) in rows
        ]

    async def refusals(self, run_id: str) -> list[RefusalRecord]:
        rows = await self._read(
            lambda conn: conn.fetchall(
                "SELECT round_index, what, kind, reason, at_wall FROM refusals "
                "WHERE run_id = ? ORDER BY id",
                (run_id,),
            )
        )
        return [
            RefusalRecord(
                run_id=run_id,
                round_index=round_index,
                what=what,
                kind=kind,
                reason=RefusalReason(reason),
                at_wall=float(at),
            )
            for round_index, what, kind, reason, at in rows
        ]
