"""The one SQL layer under both durable ledgers: a small dialect and a ledger base.

:class:`SqlLedger` holds all the SQLite and PostgreSQL ledgers share: the lifecycle, the trace
writes, retained evidence and its re-check bound, run identities and openings, the reads and
the operator's admin (:meth:`SqlLedger.admin`). A subclass keeps what really differs: its
storage, ``reserve`` (SQLite's group commit, PostgreSQL's batched statement) and its driver's
errors, behind :meth:`SqlLedger._fetch` (one read) and :meth:`SqlLedger._transact` (one
shielded transaction). Every statement is written once, with named ``:name`` parameters and
``{q}`` before each table name; the :class:`Dialect` turns it into what the driver expects.
"""

from __future__ import annotations

import abc
import json
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from plugin.errors import LedgerError, LedgerLockedError, LedgerUnavailableError

from . import validate
from ._group import GroupCommit
from .ledger import (
    RUN_OPENS_KEPT_S,
    RUN_RATE_WINDOW_S,
    AttemptTrace,
    CallRecord,
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
from .ledger_admin import LedgerAdmin
from .sql_admin import SqlAdmin
from .sql_calls import SqlCalls
from .sql_rows import (
    _ATTEMPTS,
    _BIND,
    _BOUND,
    _FORGET_OPENS,
    _OPEN,
    _OPENS,
    _RECORD_ATTEMPT,
    _RECORD_CALL,
    _RECORD_REFUSAL,
    _REFUSALS,
    _RESERVATIONS,
    _RETAIN,
    _RETAINED_AMONG,
    _SET_USED,
    _USAGE,
    _USED,
    CURRENT_RUN,
    attempt_row,
    attempts_of,
    call_row,
    refusal_row,
    refusals_of,
    reservations_of,
    storable_evidence,
    usage_of,
)
from .sql_schema import Dialect, Row, Rows, Session

T = TypeVar("T")
Self = TypeVar("Self", bound="SqlLedger")


class SqlLedger(SqlCalls, abc.ABC):
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

    async def _transact_unsynced(self, fn: Callable[[Session], Awaitable[T]], where: str) -> T:
        """As :meth:`_transact`; durable by the next synced commit, where the database can."""
        return await self._transact(fn, where)

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

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def admin(self) -> LedgerAdmin:
        """The operator's view of this ledger (``recallbound ledger …``)."""
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

    async def record(self, attempts: Sequence[AttemptTrace], refusals: Sequence[RefusalRecord],
                     calls: Sequence[CallRecord] = (), *, retain_limit: int = 0) -> None:
        if not attempts and not refusals and not calls:
            return
        statements: Rows = [
            (self._sql(_RECORD_ATTEMPT), [attempt_row(t) for t in attempts]),
            (self._sql(_RECORD_REFUSAL), [refusal_row(r) for r in refusals]),
            (self._sql(_RECORD_CALL), [call_row(c) for c in calls]),
        ]
        found: dict[str, list[str]] = {}
        if retain_limit > 0:
            for call in calls:
                if call.status == "ok" and call.evidence_ids:
                    found.setdefault(call.run_id, []).extend(call.evidence_ids)
        for run_id in sorted(found):  # the runs' locks in one order, as a batch takes them
            statements.extend(self._retaining(run_id, found[run_id], retain_limit))
        await self._writes.submit((min(found, default=""), statements))

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

    def _retaining(self, run_id: str, evidence_ids: Sequence[str], limit: int) -> Rows:
        """The statements retaining ``evidence_ids`` with the run (under its lock)."""
        ids = list(dict.fromkeys(evidence_ids))
        dialect = self._dialect
        statements: Rows = []
        if dialect.lock_run is not None:
            statements.append((self._sql(dialect.lock_run), [self._lock_params(run_id)]))
        retain = _RETAIN.replace("{ids}", dialect.id_rows.format(name="ids"))
        statements.append((
            self._sql(retain.replace("{greatest}", dialect.greatest)),
            [{"run_id": run_id, "ids": dialect.ids(ids), "limit": limit}],
        ))
        return statements

    async def retain(self, run_id: str, evidence_ids: Sequence[str], *, limit: int) -> None:
        validate.run_id(run_id)
        if not evidence_ids or limit < 1:
            return
        storable_evidence(evidence_ids)  # record()'s calls were checked as their rows were built
        # Group-committed with the trace writes; a batch takes its runs' locks in one order.
        await self._writes.submit((run_id, self._retaining(run_id, evidence_ids, limit)))

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
        self, run_id: str, *, principal: str, scope: str, now: WallTime, per_hour: int,
        floor: WallTime = -math.inf,
    ) -> RunOpening:
        open_run_arguments(run_id, principal, scope)
        at = read_time(now)

        async def write(s: Session) -> RunOpening:
            # One lock per (principal, scope): two processes opening runs for it queue here.
            await self._lock_run(s, json.dumps(["run_opens", principal, scope]))
            return await self._open_run(s, run_id, principal, scope,
                                        await self._judged_at(s, at, floor), per_hour)

        return await self._transact_unsynced(write, f"opening run {run_id!r}")

    async def current_run(self, candidate: str, *, prefix: str, principal: str, scope: str,
                          now: WallTime, live_s: float, per_hour: int,
                          floor: WallTime = -math.inf) -> str:
        open_run_arguments(candidate, principal, scope)
        at = read_time(now)
        live = validate.seconds(live_s, field="live_s")
        cell = {"principal": principal, "scope": scope}

        async def write(s: Session) -> str:
            await self._lock_run(s, json.dumps(["run_opens", principal, scope]))
            now = await self._judged_at(s, at, floor)
            rows = await s.fetchall(self._sql(CURRENT_RUN), {
                **cell, "prefix": prefix, "prefix_length": len(prefix), "now": now,
                "since": now - live})
            if rows:
                return str(rows[0][0])
            await self._open_run(s, candidate, principal, scope, now, per_hour)
            return candidate

        return await self._transact_unsynced(write, f"finding the current run of {prefix!r}")

    async def _judged_at(self, s: Session, now: float, floor: WallTime) -> float:
        """When a run opening is judged: by the clock deadlines are set by (the database's
        own, where it judges by it; else ``now``), never before ``floor`` (read here, inside
        the transaction, after the pair's lock)."""
        if self._dialect.clock is not None:
            ((now,),) = await s.fetchall(self._sql("SELECT " + self._dialect.clock), {})
        return max(float(now), read_time(floor))

    async def _open_run(self, s: Session, run_id: str, principal: str, scope: str, at: float,
                        per_hour: int) -> RunOpening:
        """:meth:`open_run`, the pair's lock held; a run already bound is never counted again."""
        cell = {"principal": principal, "scope": scope}
        bound = self._identities.get(run_id)
        rows = [] if bound else await s.fetchall(self._sql(_BOUND), {"run_id": run_id})
        bound = bound or next(((str(p), str(c)) for p, c in rows), None)
        known = bound is not None  # bound by its opening: whatever run_opens holds now
        if not known:
            # Openings older than a day go (the pair's rows stay bounded); those of the hour
            # before ``at`` count, and so do any after it (a clock that stepped back).
            await s.fetchall(self._sql(_FORGET_OPENS), {**cell, "since": at - RUN_OPENS_KEPT_S})
            ((opened,),) = await s.fetchall(self._sql(_OPENS),
                                            {**cell, "since": at - RUN_RATE_WINDOW_S})
            if opened >= per_hour:
                return RunOpening.REFUSED  # nothing of a refused run is stored, its binding neither
        if bound is None:  # bound as bind_identity binds it, in this transaction
            await s.fetchall(self._sql(_BIND), {**cell, "run_id": run_id})
            ((first, second),) = await s.fetchall(self._sql(_BOUND), {"run_id": run_id})
            bound = (str(first), str(second))
        check_identity(run_id, bound, principal, scope)  # raises: nothing is stored
        self._identities.put(run_id, bound)
        if known:
            return RunOpening.KNOWN
        await s.fetchall(self._sql(_OPEN), {**cell, "run_id": run_id, "now": at})
        return RunOpening.OPENED

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
        where = f"reading the usage of run {validate.run_id(run_id)!r}"
        return usage_of(run_id, (await self._read(_USAGE, {"run_id": run_id}, where))[0])

    async def reservations(self, run_id: str) -> list[Reservation]:
        where = f"reading the rounds of run {validate.run_id(run_id)!r}"
        return reservations_of(run_id, await self._read(_RESERVATIONS, {"run_id": run_id}, where),
                               where)

    async def attempts(self, run_id: str) -> list[AttemptTrace]:
        where = f"reading the attempts of run {validate.run_id(run_id)!r}"
        return attempts_of(run_id, await self._read(_ATTEMPTS, {"run_id": run_id}, where), where)

    async def refusals(self, run_id: str) -> list[RefusalRecord]:
        where = f"reading the refusals of run {validate.run_id(run_id)!r}"
        return refusals_of(run_id, await self._read(_REFUSALS, {"run_id": run_id}, where), where)
