"""The statements the SQL ledgers share, and the rows they take and give.

Each statement is written once for both databases (see :class:`~plugin.control.sql_schema.
Dialect`); each converter turns one of the ledger's values into a statement's parameters, or
a statement's row back into a value.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from plugin.errors import InvalidArgumentError, LedgerCorruptError

from .ledger import (
    PENDING,
    AttemptOutcome,
    AttemptTrace,
    CallIdentity,
    CallRecord,
    RefusalRecord,
    Reservation,
    Usage,
)
from .policy import RoundKind
from .refusal import RefusalReason
from .sql_schema import Row
from .validate import finite, storable

_RECORD_ATTEMPT = """
INSERT INTO {q}attempts AS a (attempt_id, run_id, round_index, slot, kind, strategy, fingerprint,
                              outcome, started_wall, elapsed_s, legacy, dropped)
VALUES (:attempt_id, :run_id, :round_index, :slot, :kind, :strategy, :fingerprint, :outcome,
        :started_wall, :elapsed_s, :legacy, :dropped)
ON CONFLICT (attempt_id) DO UPDATE SET outcome = excluded.outcome, elapsed_s = excluded.elapsed_s,
                                       dropped = excluded.dropped
WHERE a.outcome = 'in_flight'
"""
"""An attempt's trace; its final outcome replaces its ``in_flight`` one, never the reverse (an
``in_flight`` trace written late, by a flush that began before the attempt ended or by a later
round that took it over, leaves the final one as it is)."""

_RECORD_REFUSAL = """
INSERT INTO {q}refusals (run_id, round_index, what, kind, reason, at_wall, refusal_key)
VALUES (:run_id, :round_index, :what, :kind, :reason, :at_wall, :key)
ON CONFLICT DO NOTHING
"""
"""A refusal; written again (its first commit unacknowledged), it is there already."""

_INSERT_CALL = """
INSERT INTO {q}calls AS c (run_id, call_id, digest, status, slot, reason, evidence, more,
                           reserved, executed)
VALUES (:run_id, :call_id, :digest, :status, :slot, :reason, :evidence, :more, :reserved,
        :executed)
ON CONFLICT (run_id, call_id, digest) DO """
_CLAIM_CALL = _INSERT_CALL + "NOTHING"
"""A call's claim (status ``pending``), written before it searches; the first claim stays."""
_RELEASE_CALL = f"""
DELETE FROM {{q}}calls WHERE run_id = :run_id AND call_id = :call_id AND digest = :digest
AND status = '{PENDING}'
"""
"""A claim withdrawn by its claimant (the call never searched); an outcome stays."""
_WITHDRAW_CLAIMS = f"""
DELETE FROM {{q}}calls WHERE run_id = :run_id AND status = '{PENDING}' AND reason = :reason
"""
"""Every claim of one claimant (by its token), withdrawn: its calls never ran."""
_RECORD_CALL = _INSERT_CALL + f"""UPDATE SET status = excluded.status, slot = excluded.slot,
    reason = excluded.reason, evidence = excluded.evidence, more = excluded.more,
    reserved = excluded.reserved, executed = excluded.executed
WHERE c.status = '{PENDING}'
"""
"""A call's outcome, in place of its claim; the first outcome of an identity stays."""

_CALLS = """
SELECT call_id, digest, status, slot, reason, evidence, more, reserved, executed
FROM {q}calls WHERE run_id = :run_id AND call_id """

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
_FORGET_OPENS = "DELETE FROM {q}run_opens WHERE " + _CELL + " AND opened_wall <= :since"
_OPENS = "SELECT count(*) FROM {q}run_opens WHERE " + _CELL + " AND opened_wall > :since"
_OPEN = """
INSERT INTO {q}run_opens (principal, scope, run_id, opened_wall)
VALUES (:principal, :scope, :run_id, :now)
"""
CURRENT_RUN = """
SELECT o.run_id FROM {q}run_opens o LEFT JOIN {q}runs u ON u.run_id = o.run_id
WHERE o.principal = :principal AND o.scope = :scope
  AND substr(o.run_id, 1, :prefix_length) = :prefix
  AND (u.pruned IS NULL OR u.pruned = false)
  AND ((u.deadline_wall IS NULL AND o.opened_wall > :since) OR u.deadline_wall > :now)
ORDER BY o.opened_wall DESC, o.run_id LIMIT 1
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
SELECT round_index, what, kind, reason, at_wall, refusal_key FROM {q}refusals
WHERE run_id = :run_id
ORDER BY id
"""


def storable_row(row: dict[str, Any], what: str) -> dict[str, Any]:
    """``row`` if every one of its strings can be stored by every ledger
    (:func:`~plugin.control.validate.storable`), else
    :class:`~plugin.errors.InvalidArgumentError` naming ``what`` and the field."""
    for field, value in row.items():
        if isinstance(value, str):
            storable(value, field=f"{what}: {field}")
    return row


def attempt_row(trace: AttemptTrace) -> dict[str, Any]:
    """An attempt trace as the parameters of the attempt upsert. Its start and its end must be
    finite times (the end is the run's clock for its later rounds), and its text storable
    (:func:`storable_row`)."""
    elapsed = 0.0 if trace.elapsed_s is None else trace.elapsed_s
    if not (finite(trace.started_wall) and finite(elapsed) and elapsed >= 0
            and finite(trace.started_wall + elapsed)):
        raise InvalidArgumentError(
            f"attempt {trace.attempt_id!r}: its start and end must be finite times")
    return storable_row({
        "attempt_id": trace.attempt_id, "run_id": trace.run_id,
        "round_index": trace.round_index, "slot": trace.slot, "kind": trace.kind,
        "strategy": trace.strategy, "fingerprint": trace.fingerprint,
        "outcome": trace.outcome.value, "started_wall": trace.started_wall,
        "elapsed_s": trace.elapsed_s, "legacy": bool(trace.legacy), "dropped": trace.dropped,
    }, "attempt")


def call_row(record: CallRecord) -> dict[str, Any]:
    """A call record as the parameters of its insert; its text storable."""
    storable_evidence(record.evidence_ids)
    return storable_row({
        "run_id": record.run_id, "call_id": record.call_id, "digest": record.digest,
        "status": record.status, "slot": record.slot, "reason": record.reason,
        "evidence": json.dumps(list(record.evidence_ids), ensure_ascii=True),
        "more": record.more, "reserved": record.reserved, "executed": record.executed,
    }, "call")


def storable_evidence(evidence_ids: Sequence[str]) -> Sequence[str]:
    """``evidence_ids`` if every ledger can store each of them, else
    :class:`~plugin.errors.InvalidArgumentError` naming ``evidence_id``."""
    for evidence_id in evidence_ids:
        storable(evidence_id, field="evidence_id")
    return evidence_ids


def claim_rows(run_id: str, calls: Sequence[CallIdentity], token: str) -> list[dict[str, Any]]:
    """The claims of the claimant with ``token`` on ``calls``, as the parameters of their
    inserts (a claim is a ``pending`` record whose reason is its claimant's token)."""
    return [call_row(CallRecord(run_id=run_id, call_id=call_id, digest=digest, status=PENDING,
                                reason=token))
            for call_id, digest in calls]


def held(run_id: str, records: Iterable[CallRecord], calls: Sequence[CallIdentity], token: str,
         *, last: bool) -> tuple[dict[CallIdentity, CallRecord], list[CallIdentity]]:
    """The records of ``calls`` that are not the claims of the claimant with ``token``, and
    the calls with no record at all, to claim again: a claim is this claimant's only when its
    token is read back. On the ``last`` try those are held as claimed (never searched)."""
    found = {(r.call_id, r.digest): r for r in records}
    wanted = set(calls)
    there = {call: record for call, record in found.items() if call in wanted
             and not (record.status == PENDING and record.reason == token)}
    missing = [call for call in calls if call not in found]
    if last:
        there.update((call, CallRecord(run_id=run_id, call_id=call[0], digest=call[1],
                                       status=PENDING)) for call in missing)
    return there, [] if last else missing


def call_record(run_id: str, row: Row) -> CallRecord:
    """A call record from a row of :data:`_CALLS`."""
    call_id, digest, status, slot, reason, evidence, more, reserved, executed = row
    ids = json.loads(evidence)  # JSONDecodeError is a ValueError
    if not isinstance(ids, list):
        raise TypeError(f"evidence is not a list: {type(ids).__name__}")
    return CallRecord(
        run_id=run_id, call_id=str(call_id), digest=str(digest), status=str(status),
        slot=None if slot is None else int(slot), reason=reason,
        evidence_ids=tuple(str(i) for i in ids), more=int(more),
        reserved=int(reserved), executed=int(executed),
    )


def refusal_row(record: RefusalRecord) -> dict[str, Any]:
    """A refusal as the parameters of its insert; its text storable."""
    return storable_row({
        "run_id": record.run_id, "round_index": record.round_index, "what": record.what,
        "kind": record.kind, "reason": record.reason.value, "at_wall": record.at_wall,
        "key": record.key,
    }, "refusal")


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


@contextlib.contextmanager
def stored_values(where: str) -> Iterator[None]:
    """Rows turned back into values: one the ledger never writes (a damaged file, a hand edit)
    is a :class:`~plugin.errors.LedgerCorruptError`, not a bare ``ValueError``."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        raise LedgerCorruptError(f"{where}: a stored value is damaged: {exc}") from None


def usage_of(run_id: str, row: Row) -> Usage:
    """A run's totals from the row of :data:`_USAGE`."""
    rounds, reserved, deadline, executed, refused, legacy = row
    if rounds is None:
        return Usage(run_id=run_id, legacy_attempts=legacy, refused=refused)
    return Usage(run_id=run_id, rounds=rounds, reserved=reserved, executed=executed,
                 refused=refused, deadline_wall=float(deadline), legacy_attempts=legacy)


def reservations_of(run_id: str, rows: Sequence[Row], where: str) -> list[Reservation]:
    """The run's rounds from their rows."""
    with stored_values(where):
        return [
            Reservation(
                run_id=run_id, round_index=index, kind=RoundKind(kind), requested=requested,
                first_slot=first, slots=slots, reserved=last, executed=executed,
                deadline_wall=float(deadline), opened_wall=float(opened),
                reserved_wall=float(at),
            )
            for (index, kind, requested, first, slots, last, executed, at, deadline,
                 opened) in rows
        ]


def attempts_of(run_id: str, rows: Sequence[Row], where: str) -> list[AttemptTrace]:
    """The run's attempt traces from their rows."""
    with stored_values(where):
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


def refusals_of(run_id: str, rows: Sequence[Row], where: str) -> list[RefusalRecord]:
    """The run's refusals from their rows."""
    with stored_values(where):
        return [
            RefusalRecord(
                run_id=run_id, round_index=round_index, what=what, kind=kind,
                reason=RefusalReason(reason), at_wall=float(at), key=key,
            )
            for round_index, what, kind, reason, at, key in rows
        ]


def calls_of(run_id: str, rows: Sequence[Row], where: str) -> list[CallRecord]:
    """The run's call records from their rows."""
    with stored_values(where):
        return [call_record(run_id, row) for row in rows]
