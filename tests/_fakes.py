"""Test doubles: an in-memory ledger (no threads, so trio's MockClock can autojump), and a
proxy that forwards every member to what it wraps.

:class:`MemoryLedger` runs through the ledger contract suite (tests/test_ledger_contract.py)
like the real ledgers: several ledgers may share one :class:`MemoryStore` (reopening, another
"connection"), and one made with :meth:`MemoryLedger.over` is closed until ``async with``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import attrs

from plugin.control import (
    AllowancePolicy,
    AttemptOutcome,
    AttemptTrace,
    BudgetRefusal,
    RefusalRecord,
    Reservation,
    RoundKind,
    Usage,
)
from plugin.control import ledger as rules
from plugin.control.headroom import Headroom
from plugin.control.ledger import (
    PENDING,
    CallIdentity,
    CallRecord,
    Validity,
    WallTime,
    grant_validations,
    read_time,
)
from plugin.control.ledger_admin import (
    PRUNED_TABLES,
    LedgerCheck,
    PruneReport,
    RunSummary,
    check_limit,
)
from plugin.control.sql_rows import (
    attempt_row,
    call_row,
    refusal_row,
    storable_evidence,
    storable_row,
)
from plugin.errors import LedgerClosedError


@attrs.define
class _Run:
    opened: float
    deadline: float
    max_searches: int
    max_rounds: int
    rounds: list[Reservation] = attrs.Factory(list)
    pruned: bool = False
    """Its tombstone: a pruned run keeps its limits, all spent, and nothing else."""
    tombstone_reserved: int = 0

    tombstone_rounds: int = 0

    @property
    def round_count(self) -> int:
        return self.tombstone_rounds + len(self.rounds)

    @property
    def reserved(self) -> int:
        return self.tombstone_reserved + sum(r.slots for r in self.rounds)


@attrs.define(eq=False)
class MemoryStore:
    """What a MemoryLedger stores; shared by every ledger opened over it."""

    runs: dict[str, _Run] = attrs.Factory(dict)
    traces: dict[str, AttemptTrace] = attrs.Factory(dict)
    refused: list[RefusalRecord] = attrs.Factory(list)
    retained: dict[str, list[str]] = attrs.Factory(dict)
    validations_used: dict[str, int] = attrs.Factory(dict)
    identities: dict[str, tuple[str, str]] = attrs.Factory(dict)
    calls: dict[tuple[str, str, str], CallRecord] = attrs.Factory(dict)
    run_opens: dict[tuple[str, str], dict[str, float]] = attrs.Factory(dict)


@attrs.define(eq=False)
class MemoryLedger:
    """A pure-Python Ledger with the same rules as SqliteLedger (checked by the contract suite).

    ``MemoryLedger()`` is open at once, over a store of its own (the convenient test double);
    :meth:`over` makes one that is closed until ``async with``, like a real ledger.
    """

    store: MemoryStore = attrs.Factory(MemoryStore)
    is_open: bool = True
    fail_reserve: BaseException | None = None

    @classmethod
    def over(cls, store: MemoryStore) -> MemoryLedger:
        """An unopened ledger over ``store``."""
        return cls(store=store, is_open=False)

    async def __aenter__(self) -> MemoryLedger:
        self.is_open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.is_open = False

    def _open(self) -> MemoryStore:
        if not self.is_open:
            raise LedgerClosedError("MemoryLedger is not open: use `async with`")
        return self.store

    @property
    def runs(self) -> dict[str, _Run]:
        return self._open().runs

    @property
    def traces(self) -> dict[str, AttemptTrace]:
        return self._open().traces

    @property
    def refused(self) -> list[RefusalRecord]:
        return self._open().refused

    @property
    def retained(self) -> dict[str, list[str]]:
        return self._open().retained

    @property
    def validations_used(self) -> dict[str, int]:
        return self._open().validations_used

    def _executed(self, run_id: str) -> int:
        return sum(1 for t in self.traces.values() if t.run_id == run_id and not t.legacy)

    async def reserve(
        self, run_id: str, kind: RoundKind, requested: int, policy: AllowancePolicy,
        now: WallTime,
        *,
        floor: WallTime = -math.inf,
    ) -> Reservation | BudgetRefusal:
        self._open()
        if self.fail_reserve is not None:
            raise self.fail_reserve
        run = self.runs.get(run_id)
        recorded = [r.reserved_wall for r in run.rounds] if run is not None else []
        recorded += [r.at_wall for r in self.refused if r.run_id == run_id]
        recorded += [t.started_wall + (t.elapsed_s or 0.0)
                     for t in self.traces.values() if t.run_id == run_id]
        now_wall = max(read_time(now), read_time(floor), *recorded)
        if run is None:
            run = self.runs[run_id] = _Run(
                now_wall, now_wall + policy.deadline_s, policy.max_searches, policy.max_rounds
            )
        left = Headroom(rounds=run.round_count, max_rounds=run.max_rounds,
                        reserved=run.reserved, max_searches=run.max_searches,
                        deadline_wall=run.deadline)
        reason = left.refusal(now_wall)
        if reason is not None:
            self.refused.append(RefusalRecord(
                run_id=run_id, round_index=None, what="round", kind=kind.value, reason=reason,
                at_wall=now_wall,
            ))
            return BudgetRefusal(reason=reason, run_id=run_id, reserved=run.reserved,
                                 executed=self._executed(run_id))
        grant = left.grant(requested)
        first = run.reserved + 1
        reservation = Reservation(
            run_id=run_id, round_index=run.round_count + 1, kind=kind, requested=requested,
            first_slot=first, slots=grant, reserved=run.reserved + grant,
            executed=self._executed(run_id), deadline_wall=run.deadline, opened_wall=run.opened,
            reserved_wall=now_wall,
        )
        run.rounds.append(reservation)
        return reservation

    async def record(
        self,
        attempts: Sequence[AttemptTrace],
        refusals: Sequence[RefusalRecord],
        calls: Sequence[CallRecord] = (),
        *,
        retain_limit: int = 0,
    ) -> None:
        store = self._open()
        for trace in attempts:
            attempt_row(trace)  # the same checks as the SQL ledgers
        for refusal in refusals:
            refusal_row(refusal)
        for call in calls:
            call_row(call)
        for trace in attempts:
            known = self.traces.get(trace.attempt_id)
            if known is None or known.outcome is AttemptOutcome.IN_FLIGHT:  # never regresses
                self.traces[trace.attempt_id] = trace
        keys = {r.key for r in self.refused if r.key is not None}
        self.refused.extend(r for r in refusals if r.key is None or r.key not in keys)
        for call in calls:
            key = (call.run_id, call.call_id, call.digest)
            if key not in store.calls or store.calls[key].status == PENDING:
                store.calls[key] = call
            if retain_limit > 0 and call.status == "ok":
                await self.retain(call.run_id, call.evidence_ids, limit=retain_limit)

    async def claim_calls(
        self, run_id: str, calls: Sequence[CallIdentity]
    ) -> dict[CallIdentity, CallRecord]:
        store, there = self._open(), {}
        for call_id, digest in calls:  # the same checks as the SQL ledgers
            storable_row({"call_id": call_id, "digest": digest}, "call")
        for call_id, digest in calls:
            key = (run_id, call_id, digest)
            if key in store.calls:
                there[call_id, digest] = store.calls[key]
            else:
                store.calls[key] = CallRecord(run_id=run_id, call_id=call_id, digest=digest,
                                              status=PENDING)
        return there

    async def release_calls(self, run_id: str, calls: Sequence[CallIdentity]) -> None:
        store = self._open()
        for call_id, digest in calls:
            storable_row({"call_id": call_id, "digest": digest}, "call")
        for call_id, digest in calls:
            key = (run_id, call_id, digest)
            if key in store.calls and store.calls[key].status == PENDING:
                del store.calls[key]

    async def recorded_calls(self, run_id: str, call_ids: Sequence[str]) -> list[CallRecord]:
        wanted = set(call_ids)
        return [call for (run, call_id, _), call in self._open().calls.items()
                if run == run_id and call_id in wanted]

    async def usage(self, run_id: str) -> Usage:
        run = self.runs.get(run_id)
        legacy = sum(1 for t in self.traces.values() if t.run_id == run_id and t.legacy)
        if run is None:
            return Usage(run_id=run_id, legacy_attempts=legacy)
        return Usage(
            run_id=run_id, rounds=run.round_count, reserved=run.reserved,
            executed=self._executed(run_id),
            refused=sum(1 for r in self.refused if r.run_id == run_id),
            deadline_wall=run.deadline, legacy_attempts=legacy,
        )

    async def reservations(self, run_id: str) -> list[Reservation]:
        run = self.runs.get(run_id)
        return [] if run is None else list(run.rounds)

    async def attempts(self, run_id: str) -> list[AttemptTrace]:
        return sorted((t for t in self.traces.values() if t.run_id == run_id),
                      key=lambda t: (t.legacy, t.round_index, t.slot))

    async def refusals(self, run_id: str) -> list[RefusalRecord]:
        return [r for r in self.refused if r.run_id == run_id]

    async def retain(self, run_id: str, evidence_ids: Sequence[str], *, limit: int) -> None:
        held = self.retained.setdefault(run_id, [])
        for evidence_id in dict.fromkeys(storable_evidence(evidence_ids)):
            if evidence_id not in held and len(held) < limit:
                held.append(evidence_id)

    async def bind_identity(self, run_id: str, *, principal: str, scope: str) -> None:
        rules.identity_arguments(run_id, principal, scope)
        bound = self._open().identities.setdefault(run_id, (principal, scope))
        rules.check_identity(run_id, bound, principal, scope)

    async def open_run(
        self, run_id: str, *, principal: str, scope: str, now: WallTime, per_hour: int,
        floor: WallTime = -math.inf,
    ) -> rules.RunOpening:
        rules.open_run_arguments(run_id, principal, scope)
        at = max(read_time(now), read_time(floor))
        identities = self._open().identities
        rules.check_identity(run_id, identities.get(run_id, (principal, scope)), principal, scope)
        opened = self._open().run_opens.setdefault((principal, scope), {})
        if run_id in identities:  # bound by its opening: never counted again
            identities.setdefault(run_id, (principal, scope))
            return rules.RunOpening.KNOWN
        for old in [r for r, at_ in opened.items() if at_ <= at - rules.RUN_OPENS_KEPT_S]:
            del opened[old]
        if sum(at_ > at - rules.RUN_RATE_WINDOW_S for at_ in opened.values()) >= per_hour:
            return rules.RunOpening.REFUSED  # nothing stored: the run is not bound either
        identities.setdefault(run_id, (principal, scope))
        opened[run_id] = at
        return rules.RunOpening.OPENED

    async def current_run(
        self, candidate: str, *, prefix: str, principal: str, scope: str, now: WallTime,
        live_s: float, per_hour: int, floor: WallTime = -math.inf
    ) -> str:
        rules.open_run_arguments(candidate, principal, scope)
        at = max(read_time(now), read_time(floor))
        opened = self._open().run_opens.get((principal, scope), {})
        live = []
        for run_id, opened_at in opened.items():
            run = self.runs.get(run_id)
            alive = (opened_at > at - live_s if run is None
                     else not run.pruned and run.deadline > at)
            if run_id.startswith(prefix) and alive:
                live.append((-opened_at, run_id))
        if live:
            return min(live)[1]
        await self.open_run(candidate, principal=principal, scope=scope, now=at,
                            per_hour=per_hour)
        return candidate

    async def take_validations(
        self, run_id: str, evidence_ids: Sequence[str], *, limit: int
    ) -> dict[str, Validity]:
        answers, self.validations_used[run_id] = grant_validations(
            list(dict.fromkeys(evidence_ids)), self.retained.get(run_id, []),
            self.validations_used.get(run_id, 0), limit,
        )
        return answers

    def admin(self) -> MemoryAdmin:
        """The operator's view of this ledger, as every ledger has one."""
        return MemoryAdmin(self)


@attrs.define(eq=False)
class MemoryAdmin:
    """The :class:`~plugin.control.ledger_admin.LedgerAdmin` of a :class:`MemoryLedger`, with
    the SQL admin's rules (the admin contract suite runs it)."""

    ledger: MemoryLedger

    def _summary(self, run_id: str) -> RunSummary:
        run, ledger = self.ledger.runs[run_id], self.ledger
        return RunSummary(
            run_id=run_id, opened_wall=run.opened, deadline_wall=run.deadline,
            rounds=len(run.rounds), max_rounds=run.max_rounds, reserved=run.reserved,
            max_searches=run.max_searches, executed=ledger._executed(run_id),
            refused=sum(1 for r in ledger.refused if r.run_id == run_id),
        )

    async def runs(self, *, limit: int) -> list[RunSummary]:
        check_limit(limit)
        live = [r for r, run in self.ledger.runs.items() if not run.pruned]
        order = sorted(live, key=lambda r: (-self.ledger.runs[r].opened, r))
        return [self._summary(run_id) for run_id in order[:limit]]

    async def run(self, run_id: str) -> RunSummary | None:
        run = self.ledger.runs.get(run_id)
        return self._summary(run_id) if run is not None and not run.pruned else None

    async def prune(self, *, before_wall: float, now_wall: float, dry_run: bool) -> PruneReport:
        ledger = self.ledger
        recorded = [
            *(run.opened for run in ledger.runs.values()),
            *(r.reserved_wall for run in ledger.runs.values() for r in run.rounds),
            *(t.started_wall for t in ledger.traces.values()),
            *(r.at_wall for r in ledger.refused),
        ]
        now = min(now_wall, max((t for t in recorded if math.isfinite(t)), default=-math.inf))
        gone = sorted((run.deadline, run_id) for run_id, run in ledger.runs.items()
                      if run.deadline < before_wall and run.deadline <= now and not run.pruned)
        ids = {run_id for _, run_id in gone}
        # and what was sent to a run pruned earlier since
        swept = ids | {run_id for run_id, run in ledger.runs.items() if run.pruned}
        rows = {
            "runs": len(ids),
            "rounds": sum(len(ledger.runs[r].rounds) for r in ids),
            "attempts": sum(1 for t in ledger.traces.values() if t.run_id in swept),
            "refusals": sum(1 for r in ledger.refused if r.run_id in swept),
            "retained": sum(len(ledger.retained.get(r, [])) for r in swept),
            "validations": sum(1 for r in swept if r in ledger.validations_used),
            "calls": sum(1 for key in ledger._open().calls if key[0] in swept),
        }
        if not dry_run:
            calls = ledger._open().calls
            for key in [key for key in calls if key[0] in swept]:
                del calls[key]
            for run_id in ids:
                run = ledger.runs[run_id]  # its tombstone: limits, spent, nothing else
                run.tombstone_rounds, run.tombstone_reserved = run.max_rounds, run.max_searches
                run.rounds.clear()
                run.pruned = True
                ledger.retained.pop(run_id, None)
                ledger.validations_used.pop(run_id, None)
            for attempt_id in [a for a, t in ledger.traces.items() if t.run_id in swept]:
                del ledger.traces[attempt_id]
            ledger.refused[:] = [r for r in ledger.refused if r.run_id not in swept]
        return PruneReport(before_wall=before_wall, now_wall=now_wall, dry_run=dry_run,
                           run_ids=tuple(run_id for _, run_id in gone),
                           rows={table: rows[table] for table in PRUNED_TABLES})

    async def check(self) -> LedgerCheck:
        problems = []
        for run_id in self.ledger.runs:
            summary = self._summary(run_id)
            if summary.executed > summary.reserved:
                problems.append(f"run {run_id}: {summary.executed} attempts executed, over its "
                                f"{summary.reserved} reserved slots")
        for trace in self.ledger.traces.values():
            run = self.ledger.runs.get(trace.run_id)
            if not trace.legacy and (run is None or not 1 <= trace.slot <= run.reserved):
                problems.append(f"run {trace.run_id}: attempt {trace.attempt_id} holds slot "
                                f"{trace.slot}, which the run never reserved")
        slots = {(t.run_id, t.slot) for t in self.ledger.traces.values() if not t.legacy}
        refused_runs = {r.run_id for r in self.ledger.refused}
        for call in self.ledger._open().calls.values():
            if call.slot is not None and (call.run_id, call.slot) not in slots:
                problems.append(f"run {call.run_id}: call {call.call_id} is recorded on slot "
                                f"{call.slot}, which no executed attempt of the run holds")
            elif call.slot is None and call.status != "refused":
                problems.append(f"run {call.run_id}: call {call.call_id} is recorded as "
                                f"{call.status} without a slot")
            elif call.slot is None and call.run_id not in refused_runs:
                problems.append(f"run {call.run_id}: call {call.call_id} is recorded as "
                                f"{call.status}, but the run has no refusal")
        return LedgerCheck(backend="memory", location="memory", schema_version=0,
                           expected_version=0, problems=tuple(problems),
                           checked=("the ledger's invariants (no run executed more attempts "
                                    "than it reserved slots, every attempt holds a slot its "
                                    "run reserved)",))


class Forwarding:
    """A proxy that forwards every member to the object it wraps through ``__getattr__``, as a
    logging, caching or metrics wrapper of a retriever or an embedding adapter does."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
