"""The one SQL layer under both durable ledgers: a small dialect and a ledger base.

:class:`SqlLedger` holds everything the SQLite and PostgreSQL ledgers share: the lifecycle
(``async with``), the trace writes (``record``), retained evidence and its re-check bound
(``retain``, ``take_validations``), the reads (``usage``, ``reservations``, ``attempts``,
``refusals``) and the operator's admin (:meth:`SqlLedger.admin`). A subclass keeps only what
really differs: opening and migrating its storage, ``reserve`` (SQLite's group commit,
PostgreSQL's batched statement) and the translation of its driver's errors, behind two
methods, :meth:`SqlLedger._fetch` (one read) and :meth:`SqlLedger._transact` (one shielded
transaction).

Every statement is written once, with named ``:name`` parameters and ``{q}`` before each
table name; the :class:`Dialect` turns it into what the driver expects.
"""

from __future__ import annotations

import abc
import functools
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeVar

import anyio
import attrs

from plugin.errors import LedgerError, LedgerLockedError, LedgerUnavailableError

from . import validate
from ._group import GroupCommit
from .ledger import (
    RUN_RATE_WINDOW_S,
    AttemptOutcome,
    AttemptTrace,
    IdentityCache,
    RefusalRecord,
    Reservation,
    RunOpening,
    Usage,
    Validity,
    WallTime,
    check_identity,
    grant_validations,
    identity_arguments,
    open_run_arguments,
    read_time,
)
from .policy import AllowancePolicy, RoundKind
from .refusal import RefusalReason

if TYPE_CHECKING:
    from .ledger_admin import LedgerAdmin

T = TypeVar("T")
Row: TypeAlias = "tuple[Any, ...]"
Rows: TypeAlias = "list[tuple[str, Sequence[Mapping[str, Any]]]]"
"""Statements to run once per row of theirs, in one transaction."""
Self = TypeVar("Self", bound="SqlLedger")

_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


class Session(Protocol):
    """A connection held for one read or one transaction."""

    async def fetchall(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        """Execute one statement and return its rows (none for a statement without rows)."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Execute one statement once per parameter set."""
        ...


@functools.lru_cache(maxsize=512)
def _render(template: str, prefix: str, pyformat: bool) -> str:
    sql = template.replace("{q}", prefix)
    return _NAMED.sub(r"%(\1)s", sql) if pyformat else sql


@attrs.frozen(kw_only=True)
class Dialect:
    """What differs between the SQL of two databases, and nothing else."""

    name: Literal["sqlite", "postgresql"]
    prefix: str = ""
    """Put before every table name: ``""`` or a quoted schema and a dot."""
    pyformat: bool = False
    """Parameters as ``%(name)s`` (psycopg) instead of ``:name`` (sqlite3)."""
    id_list: str = "IN (SELECT value FROM json_each(:{name}))"
    """Membership in a list parameter called ``name``."""
    lock_run: str | None = None
    """A statement taking the per-run lock on ``:run_id`` for the transaction, if the database
    has one (SQLite's write lock already covers the whole file)."""
    for_update: str = ""
    """Appended to a ``SELECT`` of ``runs`` rows to lock them for the transaction."""
    id_rows: str = "json_each(:{name}) AS j"
    """The list parameter ``name`` as a table ``j`` of ``(value, key)``, ``key`` its order."""
    greatest: str = "max"
    """The larger-of-several function."""
    binary_order: str = ""
    """Appended to an ``ORDER BY`` of run ids so that they sort byte-wise."""
    clock: str | None = None
    """An SQL expression of the database's own clock (epoch seconds), when it judges by it."""

    def sql(self, template: str) -> str:
        """``template`` for this database: ``{q}`` and ``:name`` placeholders rendered."""
        return _render(template, self.prefix, self.pyformat)

    def in_ids(self, name: str) -> str:
        """``IN``-list membership in the list parameter ``name`` (see :meth:`ids`)."""
        return self.id_list.format(name=name)

    def ids(self, values: Sequence[str]) -> Any:
        """The parameter value of an id list."""
        return list(values) if self.pyformat else json.dumps(list(values))


@attrs.frozen
class ReserveRequest:
    """One call of ``reserve``, waiting for its batch."""

    run_id: str
    kind: RoundKind
    requested: int
    policy: AllowancePolicy
    now: WallTime
    floor: WallTime


REFUSAL_REASON = (
    "CASE WHEN u.rounds >= u.max_rounds THEN 'rounds' "
    "WHEN u.reserved >= u.max_searches THEN 'slots' ELSE 'deadline' END"
)
"""Why a round of the run in row ``u`` of ``runs`` is refused, first reason first: its
rounds are used up, else its slots, else (the only other refusal) its deadline passed. Every
SQL ledger records its refusals through this one expression."""


@attrs.frozen
class Table:
    """One table of a ledger, written once for every database (see :func:`create_table`)."""

    name: str
    columns: tuple[str, ...]
    """Column and constraint definitions; ``{text}``, ``{real}``, ``{int}``, ``{bool}`` and
    ``{serial}`` (an auto-numbered primary key) stand for the database's types."""
    since: int
    """The schema version that added it."""
    indexes: tuple[tuple[str, str], ...] = ()
    """(name, column list) of its indexes."""


TABLES = (
    Table("runs", (
        "run_id {text} PRIMARY KEY", "opened_wall {real} NOT NULL",
        "deadline_wall {real} NOT NULL", "max_searches {int} NOT NULL",
        "max_rounds {int} NOT NULL", "rounds {int} NOT NULL", "reserved {int} NOT NULL",
        "last_grant {int} NOT NULL"), since=1),
    Table("rounds", (
        "run_id {text} NOT NULL", "round_index {int} NOT NULL", "kind {text} NOT NULL",
        "requested {int} NOT NULL", "first_slot {int} NOT NULL", "slots {int} NOT NULL",
        "executed {int} NOT NULL", "reserved_wall {real} NOT NULL",
        "PRIMARY KEY (run_id, round_index)"), since=1),
    Table("attempts", (
        "attempt_id {text} PRIMARY KEY", "run_id {text} NOT NULL",
        "round_index {int} NOT NULL", "slot {int} NOT NULL", "kind {text} NOT NULL",
        "strategy {text}", "fingerprint {text}", "outcome {text} NOT NULL",
        "started_wall {real} NOT NULL", "elapsed_s {real}", "legacy {bool} NOT NULL",
        "dropped {int} NOT NULL DEFAULT 0"),
        since=1, indexes=(("attempts_by_run", "run_id, legacy"),)),
    Table("refusals", (
        "id {serial}", "run_id {text} NOT NULL", "round_index {int}", "what {text} NOT NULL",
        "kind {text} NOT NULL", "reason {text} NOT NULL", "at_wall {real} NOT NULL"),
        since=1, indexes=(("refusals_by_run", "run_id"),)),
    Table("retained", (
        "run_id {text} NOT NULL", "evidence_id {text} NOT NULL",
        "PRIMARY KEY (run_id, evidence_id)"), since=2),
    Table("validations", ("run_id {text} PRIMARY KEY", "used {int} NOT NULL"), since=2),
    Table("run_identity", (
        "run_id {text} PRIMARY KEY", "principal {text} NOT NULL", "scope {text} NOT NULL"),
        since=3),
    Table("run_opens", (
        "principal {text} NOT NULL", "scope {text} NOT NULL", "run_id {text} NOT NULL",
        "opened_wall {real} NOT NULL", "PRIMARY KEY (principal, scope, run_id)"),
        since=6),
)
"""Every table of a ledger, the same on every database (``since``: PostgreSQL's version)."""


def create_table(table: Table, types: Mapping[str, str], *, prefix: str = "",
                 if_not_exists: bool = False, suffix: str = "") -> list[str]:
    """The statements creating ``table`` (and its indexes) with the database's ``types``."""
    exists = " IF NOT EXISTS" if if_not_exists else ""
    columns = ",\n    ".join(column.format(**types) for column in table.columns)
    return [
        f"CREATE TABLE{exists} {prefix}{table.name} (\n    {columns}){suffix}",
        *(f"CREATE INDEX{exists} {name} ON {prefix}{table.name} ({keys})"
          for name, keys in table.indexes),
    ]


# -- the shared statements --------------------------------------------------------------------

EXECUTED = "(SELECT count(*) FROM {q}attempts a WHERE a.run_id = u.run_id AND a.legacy = false)"
"""A run's executed attempts (legacy ones excluded), for a row ``u`` of ``runs``."""

_RECORD_ATTEMPT = """
INSERT INTO {q}attempts (attempt_id, run_id, round_index, slot, kind, strategy, fingerprint,
                         outcome, started_wall, elapsed_s, legacy, dropped)
VALUES (:attempt_id, :run_id, :round_index, :slot, :kind, :strategy, :fingerprint, :outcome,
        :started_wall, :elapsed_s, :legacy, :dropped)
ON CONFLICT (attempt_id) DO UPDATE SET outcome = excluded.outcome, elapsed_s = excluded.elapsed_s,
                                       dropped = excluded.dropped
"""

_RECORD_REFUSAL = """
INSERT INTO {q}refusals (run_id, round_index, what, kind, reason, at_wall)
VALUES (:run_id, :round_index, :what, :kind, :reason, :at_wall)
"""

_RETAINED_AMONG = "SELECT evidence_id FROM {q}retained WHERE run_id = :run_id AND evidence_id "
_RETAIN = """
INSERT INTO {q}retained (run_id, evidence_id)
SELECT :run_id, j.value FROM {ids}
WHERE NOT EXISTS (SELECT 1 FROM {q}retained r WHERE r.run_id = :run_id AND r.evidence_id = j.value)
ORDER BY j.key
LIMIT {greatest}(0, :limit - (SELECT count(*) FROM {q}retained c WHERE c.run_id = :run_id))
"""
"""The first ids of ``:ids`` the run has not retained yet, as many as its limit leaves room
for, in one statement (under the run's lock)."""
_USED = "SELECT used FROM {q}validations WHERE run_id = :run_id"
_SET_USED = """
INSERT INTO {q}validations (run_id, used) VALUES (:run_id, :used)
ON CONFLICT (run_id) DO UPDATE SET used = excluded.used
"""

_BIND = """
INSERT INTO {q}run_identity (run_id, principal, scope) VALUES (:run_id, :principal, :scope)
ON CONFLICT (run_id) DO NOTHING
"""
_BOUND = "SELECT principal, scope FROM {q}run_identity WHERE run_id = :run_id"

_CELL = "principal = :principal AND scope = :scope"
_OPENED = "SELECT 1 FROM {q}run_opens WHERE " + _CELL + " AND run_id = :run_id"
_FORGET_OPENS = "DELETE FROM {q}run_opens WHERE " + _CELL + " AND opened_wall <= :since"
_OPENS = "SELECT count(*) FROM {q}run_opens WHERE " + _CELL
_OPEN = """
INSERT INTO {q}run_opens (principal, scope, run_id, opened_wall)
VALUES (:principal, :scope, :run_id, :now)
"""

_USAGE = """
SELECT u.rounds, u.reserved, u.deadline_wall,
       (SELECT count(*) FROM {q}attempts a WHERE a.run_id = :run_id AND a.legacy = false),
       (SELECT count(*) FROM {q}refusals f WHERE f.run_id = :run_id),
       (SELECT count(*) FROM {q}attempts a WHERE a.run_id = :run_id AND a.legacy = true)
FROM (SELECT 1 AS one) AS one LEFT JOIN {q}runs u ON u.run_id = :run_id
"""

_RESERVATIONS = """
SELECT r.round_index, r.kind, r.requested, r.first_slot, r.slots, r.first_slot + r.slots - 1,
       r.executed, r.reserved_wall, u.deadline_wall, u.opened_wall
FROM {q}rounds r JOIN {q}runs u ON u.run_id = r.run_id WHERE r.run_id = :run_id
ORDER BY r.round_index
"""

_ATTEMPTS = """
SELECT attempt_id, round_index, slot, kind, strategy, fingerprint, outcome, started_wall,
       elapsed_s, legacy, dropped
FROM {q}attempts WHERE run_id = :run_id ORDER BY legacy, round_index, slot, started_wall
"""

_REFUSALS = """
SELECT round_index, what, kind, reason, at_wall FROM {q}refusals WHERE run_id = :run_id
ORDER BY id
"""


def attempt_row(trace: AttemptTrace) -> dict[str, Any]:
    """An attempt trace as the parameters of the attempt upsert."""
    return {
        "attempt_id": trace.attempt_id, "run_id": trace.run_id,
        "round_index": trace.round_index, "slot": trace.slot, "kind": trace.kind,
        "strategy": trace.strategy, "fingerprint": trace.fingerprint,
        "outcome": trace.outcome.value, "started_wall": trace.started_wall,
        "elapsed_s": trace.elapsed_s, "legacy": bool(trace.legacy), "dropped": trace.dropped,
    }


def refusal_row(record: RefusalRecord) -> dict[str, Any]:
    """A refusal as the parameters of its insert."""
    return {
        "run_id": record.run_id, "round_index": record.round_index, "what": record.what,
        "kind": record.kind, "reason": record.reason.value, "at_wall": record.at_wall,
    }


def reservation(run_id: str, kind: RoundKind, requested: int, *, rounds: int, reserved: int,
                grant: int, executed: int, deadline: float, opened: float,
                judged: float) -> Reservation:
    """The reservation a reserving statement returned (the run's counts after the round)."""
    return Reservation(
        run_id=run_id, round_index=int(rounds), kind=kind, requested=requested,
        first_slot=int(reserved - grant + 1), slots=int(grant), reserved=int(reserved),
        executed=int(executed), deadline_wall=float(deadline), opened_wall=float(opened),
        reserved_wall=float(judged),
    )


class SqlLedger(abc.ABC):
    """The shared part of the SQL ledgers (see the module). Not a ledger on its own."""

    _dialect: Dialect

    def __init__(self) -> None:
        self._identities = IdentityCache()
        """Bindings this ledger object already read back (a binding never changes)."""
        self._writes: GroupCommit[tuple[str, Rows], bool] = GroupCommit(
            anyio.Lock(), self._write_batch, self._shared_failure)
        """Writes (traces, retained evidence; each with the run it locks, or "") that arrive
        while one is in flight share the next transaction."""

    # -- what a database module provides -----------------------------------------------------

    @abc.abstractmethod
    async def open(self) -> None:
        """Open the storage (idempotent)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close the storage; idempotent."""

    @abc.abstractmethod
    async def _fetch(self, sql: str, params: Mapping[str, Any], where: str) -> list[Row]:
        """One read statement (already rendered); errors typed."""

    @abc.abstractmethod
    async def _transact(
        self, fn: Callable[[Session], Awaitable[T]], where: str, *, read_only: bool = False
    ) -> T:
        """``fn`` in one transaction, shielded from cancellation once begun; errors typed.

        ``read_only``: one consistent snapshot that writes nothing (admin reads).
        """

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the ledger is, for display (never a password)."""

    @abc.abstractmethod
    async def _inspect_storage(self, session: Session, problems: list[str]) -> tuple[int, bool]:
        """Check what only this database has (file integrity, schema identity), appending
        each problem; return the stored schema version (-1 when unknown) and whether every
        table is there to check the invariants on."""

    schema_version: int
    """The schema version this code writes."""

    backend: str
    """The database's name in an admin check."""

    storage_checks: tuple[str, ...]
    """What an admin check verifies of the storage itself, before the ledger's invariants."""

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self: Self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def admin(self) -> LedgerAdmin:
        """The operator's view of this ledger (``recallbound ledger …``)."""
        from .sql_admin import SqlAdmin  # it builds on this module

        return SqlAdmin(self)

    def _shared_failure(self, error: BaseException) -> BaseException:
        """What each other request of a group commit gets when its whole batch failed: a
        fresh error of its own (the same type for a ledger error)."""
        if isinstance(error, LedgerError):
            return type(error)(str(error))
        return LedgerError(f"ledger {self.location}: a group commit failed: {error!r}")

    def _sql(self, template: str) -> str:
        return self._dialect.sql(template)

    async def _read(self, template: str, params: Mapping[str, Any], where: str) -> list[Row]:
        return await self._fetch(self._sql(template), params, where)

    async def _lock_run(self, s: Session, run_id: str) -> None:
        if self._dialect.lock_run is not None:
            await s.fetchall(self._sql(self._dialect.lock_run), self._lock_params(run_id))

    def _lock_params(self, run_id: str) -> dict[str, Any]:
        return {"run_id": run_id}

    # -- the Ledger protocol's shared methods ------------------------------------------------

    async def record(
        self, attempts: Sequence[AttemptTrace], refusals: Sequence[RefusalRecord]
    ) -> None:
        if not attempts and not refusals:
            return

        statements: Rows = [
            (self._sql(_RECORD_ATTEMPT), [attempt_row(t) for t in attempts]),
            (self._sql(_RECORD_REFUSAL), [refusal_row(r) for r in refusals]),
        ]
        await self._writes.submit(("", statements))

    async def _write_batch(
        self, batch: Sequence[tuple[str, Rows]]
    ) -> list[bool | BaseException]:
        """The writes of ``batch`` (trace writes, retained evidence) in one transaction, those
        that lock a run ordered by it (two batches never wait for each other in a cycle); if
        one of them fails (a statement, not the database), each again on its own, so that it
        fails alone."""
        where = "writing traces and retained evidence"
        ordered = sorted(batch, key=lambda request: request[0])  # stable: traces keep order
        try:
            await self._write_rows([statement for _, rows in ordered for statement in rows],
                                   where)
            return [True] * len(batch)
        except (LedgerUnavailableError, LedgerLockedError):
            raise  # the database, not one request: every request of the batch fails with it
        except Exception:  # a statement, or a value the driver cannot take
            if len(batch) == 1:
                raise
        outcomes: list[bool | BaseException] = []
        for _, rows in batch:
            try:
                await self._write_rows(rows, where)
                outcomes.append(True)
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    async def _write_rows(self, statements: Rows, where: str) -> None:
        """Each statement once per row, all in one transaction (a database that can send it
        all at once does: one round trip)."""

        async def write(s: Session) -> None:
            for sql, rows in statements:
                if rows:
                    await s.executemany(sql, rows)

        await self._transact(write, where)

    async def _retained_among(self, s: Session, run_id: str, ids: list[str]) -> set[str]:
        rows = await s.fetchall(
            self._sql(_RETAINED_AMONG + self._dialect.in_ids("ids")),
            {"run_id": run_id, "ids": self._dialect.ids(ids)},
        )
        return {row[0] for row in rows}

    async def retain(self, run_id: str, evidence_ids: Sequence[str], *, limit: int) -> None:
        validate.run_id(run_id)
        ids = list(dict.fromkeys(evidence_ids))
        if not ids or limit < 1:
            return

        dialect = self._dialect
        statements: Rows = []
        if dialect.lock_run is not None:
            statements.append((self._sql(dialect.lock_run), [self._lock_params(run_id)]))
        retain = _RETAIN.replace("{ids}", dialect.id_rows.format(name="ids"))
        statements.append((
            self._sql(retain.replace("{greatest}", dialect.greatest)),
            [{"run_id": run_id, "ids": dialect.ids(ids), "limit": limit}],
        ))
        # Group-committed with the trace writes; a batch takes its runs' locks in one order.
        await self._writes.submit((run_id, statements))

    async def bind_identity(self, run_id: str, *, principal: str, scope: str) -> None:
        identity_arguments(run_id, principal, scope)
        bound = self._identities.get(run_id)
        if bound is None:
            where = f"binding the identity of run {run_id!r}"
            rows = await self._read(_BOUND, {"run_id": run_id}, where)
            if not rows:  # the first writer wins; everyone reads the winner back

                async def write(s: Session) -> list[Row]:
                    await s.fetchall(self._sql(_BIND), {"run_id": run_id, "principal": principal,
                                                       "scope": scope})
                    # A statement of its own: on PostgreSQL it takes a new snapshot, so it
                    # sees the row of a concurrent first writer the INSERT waited for.
                    return await s.fetchall(self._sql(_BOUND), {"run_id": run_id})

                rows = await self._transact(write, where)
            bound = self._identities.put(run_id, (str(rows[0][0]), str(rows[0][1])))
        check_identity(run_id, bound, principal, scope)

    async def open_run(
        self, run_id: str, *, principal: str, scope: str, now: WallTime, per_hour: int
    ) -> RunOpening:
        open_run_arguments(run_id, principal, scope)
        cell = {"principal": principal, "scope": scope}
        at = read_time(now)

        async def write(s: Session) -> RunOpening:
            # One lock per (principal, scope): two processes opening runs for it queue here.
            await self._lock_run(s, json.dumps(["run_opens", principal, scope]))
            bound = self._identities.get(run_id)
            if bound is None:  # bound as bind_identity binds it, in this transaction
                await s.fetchall(self._sql(_BIND), {**cell, "run_id": run_id})
                ((first, second),) = await s.fetchall(self._sql(_BOUND), {"run_id": run_id})
                bound = (str(first), str(second))
            check_identity(run_id, bound, principal, scope)  # raises: nothing is stored
            self._identities.put(run_id, bound)
            if await s.fetchall(self._sql(_OPENED), {**cell, "run_id": run_id}):
                return RunOpening.KNOWN
            # Openings older than the window count no more: the pair's rows stay bounded.
            await s.fetchall(self._sql(_FORGET_OPENS), {**cell, "since": at - RUN_RATE_WINDOW_S})
            ((opened,),) = await s.fetchall(self._sql(_OPENS), cell)
            if opened >= per_hour:
                return RunOpening.REFUSED
            await s.fetchall(self._sql(_OPEN), {**cell, "run_id": run_id, "now": at})
            return RunOpening.OPENED

        return await self._transact(write, f"opening run {run_id!r}")

    async def take_validations(
        self, run_id: str, evidence_ids: Sequence[str], *, limit: int
    ) -> dict[str, Validity]:
        validate.run_id(run_id)
        ids = list(dict.fromkeys(evidence_ids))
        if not ids:
            return {}

        async def write(s: Session) -> dict[str, Validity]:
            await self._lock_run(s, run_id)
            known = await self._retained_among(s, run_id, ids)
            rows = await s.fetchall(self._sql(_USED), {"run_id": run_id})
            answers, used = grant_validations(ids, known, rows[0][0] if rows else 0, limit)
            await s.fetchall(self._sql(_SET_USED), {"run_id": run_id, "used": used})
            return answers

        return await self._transact(write, f"taking validations of run {run_id!r}")

    async def usage(self, run_id: str) -> Usage:
        validate.run_id(run_id)
        ((rounds, reserved, deadline, executed, refused, legacy),) = await self._read(
            _USAGE, {"run_id": run_id}, f"reading the usage of run {run_id!r}")
        if rounds is None:
            return Usage(run_id=run_id, legacy_attempts=legacy, refused=refused)
        return Usage(
            run_id=run_id, rounds=rounds, reserved=reserved, executed=executed, refused=refused,
            deadline_wall=float(deadline), legacy_attempts=legacy,
        )

    async def reservations(self, run_id: str) -> list[Reservation]:
        validate.run_id(run_id)
        rows = await self._read(_RESERVATIONS, {"run_id": run_id},
                                f"reading the rounds of run {run_id!r}")
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
        validate.run_id(run_id)
        rows = await self._read(_ATTEMPTS, {"run_id": run_id},
                                f"reading the attempts of run {run_id!r}")
        return [
            AttemptTrace(
                attempt_id=attempt_id, run_id=run_id, round_index=round_index, slot=slot,
                kind=kind, strategy=strategy, fingerprint=fingerprint,
                outcome=AttemptOutcome(outcome), started_wall=float(started),
                elapsed_s=None if elapsed is None else float(elapsed), legacy=bool(legacy),
                dropped=int(dropped),
            )
            for (attempt_id, round_index, slot, kind, strategy, fingerprint, outcome, started,
                 elapsed, legacy, dropped) in rows
        ]

    async def refusals(self, run_id: str) -> list[RefusalRecord]:
        validate.run_id(run_id)
        rows = await self._read(_REFUSALS, {"run_id": run_id},
                                f"reading the refusals of run {run_id!r}")
        return [
            RefusalRecord(
                run_id=run_id, round_index=round_index, what=what, kind=kind,
                reason=RefusalReason(reason), at_wall=float(at),
            )
            for round_index, what, kind, reason, at in rows
        ]
