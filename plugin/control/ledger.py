"""The durable ledger's interface and the values it stores.

A ledger is the single source of truth for a run's allowance: rounds, reserved slots, the
original deadline, and the trace of every attempt and refusal. :class:`SqliteLedger` is the
default implementation, :class:`PostgresLedger` (extra ``postgres``) the one a fleet of workers
shares; any other must pass ``tests/test_ledger_contract.py``, as those two do.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Container, Sequence
from typing import Protocol, TypeAlias

import attrs

from plugin.errors import InvalidArgumentTypeError, RunIdentityError

from . import validate
from .identity_cache import IdentityCache as IdentityCache
from .policy import AllowancePolicy, RoundKind
from .refusal import BudgetRefusal, RefusalReason

WallTime: TypeAlias = "float | Callable[[], float]"
"""A wall time, or a clock reading that the ledger takes inside its reserving transaction."""


def read_time(value: WallTime) -> float:
    """The time ``value`` stands for, read now if it is a clock reading."""
    return float(value() if callable(value) else value)


class Validity(enum.Enum):
    """A ledger's answer to a request to re-check one piece of retained evidence."""

    GRANTED = "granted"
    BOUNDED = "bounded"
    NOT_RETAINED = "not_retained"


def grant_validations(
    ids: Sequence[str], retained: Container[str], used: int, limit: int
) -> tuple[dict[str, Validity], int]:
    """The re-check decision every ledger makes inside its transaction: ``ids`` are distinct,
    in the caller's order; ``retained`` holds those the run retained; ``used`` is the run's
    count so far. Returns each id's answer and the new count."""
    answers: dict[str, Validity] = {}
    for evidence_id in ids:
        if evidence_id not in retained:
            answers[evidence_id] = Validity.NOT_RETAINED
        elif used >= limit:
            answers[evidence_id] = Validity.BOUNDED
        else:
            used += 1
            answers[evidence_id] = Validity.GRANTED
    return answers, used


def check_identity(
    run_id: str, bound: tuple[str, str], principal: str, scope: str
) -> tuple[str, str]:
    """``bound`` (the run's principal and scope as the ledger holds them) if the caller's
    match; raises :class:`~plugin.errors.RunIdentityError` otherwise."""
    if bound != (principal, scope):
        raise RunIdentityError(
            f"run {run_id!r} is bound to another principal or scope than this call's"
        )
    return bound


def identity_arguments(run_id: object, principal: object, scope: object) -> None:
    """Type-check :meth:`Ledger.bind_identity`'s arguments (every ledger does, before storing)."""
    _text_arguments("bind_identity", run_id, principal, scope)


def open_run_arguments(run_id: object, principal: object, scope: object) -> None:
    """Type-check :meth:`Ledger.open_run`'s arguments (every ledger does, before storing)."""
    _text_arguments("open_run", run_id, principal, scope)


def _text_arguments(method: str, run_id: object, principal: object, scope: object) -> None:
    for name, value in (("run_id", run_id), ("principal", principal), ("scope", scope)):
        if not isinstance(value, str):
            raise InvalidArgumentTypeError(
                f"{method} {name} must be a str, got {type(value).__name__}"
            )
    validate.run_id(run_id)
    validate.bounded_text(principal, field="principal", max_bytes=validate.MAX_ID_BYTES)
    validate.bounded_text(scope, field="scope", max_bytes=validate.MAX_ID_BYTES)


RUN_RATE_WINDOW_S = 3600.0
"""The window :meth:`Ledger.open_run` counts a caller's run openings over (an hour)."""
RUN_OPENS_KEPT_S = 24 * RUN_RATE_WINDOW_S
"""How long a run's opening is kept (a day, far past the hour it counts in), so a clock that
steps forward and then back does not lose the openings of the hour it returns to."""


class RunOpening(enum.Enum):
    """What :meth:`Ledger.open_run` did; true unless the opening was refused."""

    OPENED = "opened"
    """Counted now: no server had opened the run before."""
    KNOWN = "known"
    """The run is bound already (opened, or used through the hooks, by this or another
    process): not counted."""
    REFUSED = "refused"
    """The pair already opened its runs for the hour: nothing was stored."""

    def __bool__(self) -> bool:
        return self is not RunOpening.REFUSED


class AttemptOutcome(enum.Enum):
    """How an attempt ended, as recorded in its trace."""

    IN_FLIGHT = "in_flight"
    """Started, and still running when its phase ended and the traces were written."""
    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"
    """Cancelled from outside (not by the permit's deadline)."""
    DEADLINE = "deadline"
    """Cancelled by the permit's deadline."""


@attrs.frozen(kw_only=True)
class Reservation:
    """A committed round: what the ledger granted. Data only; it can never become a permit."""

    run_id: str
    round_index: int
    """1 for the run's first round, 2 for the second, ..."""
    kind: RoundKind
    requested: int
    first_slot: int
    """The run-wide number of this round's first slot (slots are numbered 1, 2, ... per run)."""
    slots: int
    reserved: int
    """The run's reserved slots after this round."""
    executed: int
    """The run's executed attempts recorded when this round was reserved."""
    deadline_wall: float
    opened_wall: float
    reserved_wall: float


@attrs.frozen(kw_only=True)
class Usage:
    """A run's totals. For a run the ledger has never seen, counts are 0 and deadline is None."""

    run_id: str
    rounds: int = 0
    reserved: int = 0
    """Slots reserved by the run's rounds (conservative: unused slots count)."""
    executed: int = 0
    """Attempts that took a slot and started, whatever their outcome (observed)."""
    refused: int = 0
    """Refused rounds and refused attempts."""
    deadline_wall: float | None = None
    legacy_attempts: int = 0
    """Attempts made under the explicit legacy (unenforced) mode; not part of ``executed``."""


@attrs.frozen(kw_only=True)
class AttemptTrace:
    """One attempt as recorded in the ledger."""

    attempt_id: str
    run_id: str
    round_index: int
    slot: int
    kind: str
    outcome: AttemptOutcome
    started_wall: float
    elapsed_s: float | None
    strategy: str | None = None
    fingerprint: str | None = None
    legacy: bool = False
    dropped: int = 0
    """Evidence items the attempt's retriever returned for another principal or scope: dropped
    before anything was rendered, and counted here."""


MAX_CALL_EVIDENCE = 64
"""The most evidence ids one call record keeps (the rest are counted in ``more``)."""

MAX_CALL_EVIDENCE_BYTES = 16_384
"""The most UTF-8 bytes of evidence ids one call record keeps (the rest are counted)."""

PENDING = "pending"
"""A claimed call's status until its outcome is recorded: it is searching, or it was
interrupted (cancelled, or its process died) before its outcome was written."""
CALL_STATUSES = ("ok", "refused", "failed", PENDING)
"""What a recorded call's status may be (an invalid call is never recorded)."""

CallIdentity = tuple[str, str]
"""A call of a run: its call id and the digest of its canonical arguments."""


def bound_evidence(evidence_ids: Sequence[str]) -> tuple[tuple[str, ...], int]:
    """The first ``evidence_ids`` within :data:`MAX_CALL_EVIDENCE` ids and
    :data:`MAX_CALL_EVIDENCE_BYTES` bytes, and how many were left out."""
    kept: list[str] = []
    size = 0
    for evidence_id in evidence_ids:
        size += len(evidence_id.encode("utf-8", "surrogatepass")) + 1
        if len(kept) >= MAX_CALL_EVIDENCE or size > MAX_CALL_EVIDENCE_BYTES:
            break
        kept.append(evidence_id)
    return tuple(kept), len(evidence_ids) - len(kept)


@attrs.frozen(kw_only=True)
class CallRecord:
    """One dispatched tool call's outcome, as recorded in the ledger.

    Its identity is (``run_id``, ``call_id``, ``digest``): the digest is of the call's
    canonical arguments, so a reused call id with other arguments is another call. A replay
    of the identity returns this outcome instead of searching again.
    """

    run_id: str
    call_id: str
    digest: str
    """Hex SHA-256 of the call's canonical arguments."""
    status: str
    """``"ok"``, ``"refused"``, ``"failed"``, or :data:`PENDING` (claimed, no outcome yet)."""
    slot: int | None = None
    """The run-wide slot the call's search took, or None (a refusal before any slot)."""
    reason: str | None = None
    """The refusal's reason (a :class:`RefusalReason` value) or the failure's reason."""
    evidence_ids: tuple[str, ...] = ()
    """The ids the model was shown, in order, within the record's bounds."""
    more: int = 0
    """Evidence ids shown but left out of the record by its bounds."""
    reserved: int = 0
    """For a refusal: the run's reserved slots when it was refused."""
    executed: int = 0
    """For a refusal: the run's executed attempts when it was refused."""

@attrs.frozen(kw_only=True)
class RefusalRecord:
    """One refused round or attempt as recorded in the ledger."""

    run_id: str
    round_index: int | None
    """The round whose permit refused an attempt; None for a refused round."""
    what: str
    """``"round"`` or ``"attempt"``."""
    kind: str
    """The round kind (for a round) or attempt kind (for an attempt)."""
    reason: RefusalReason
    at_wall: float
    key: str | None = None
    """Unique to an attempt's refusal, so that writing it again (its commit unacknowledged) adds
    nothing; None for a round's, recorded in the transaction that judged it."""


class Ledger(Protocol):
    """What :class:`~plugin.control.allowance.RecallAllowance` needs from durable storage."""

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
        """Atomically check and reserve a round; durable before it returns.

        The round is judged at ``max(now, floor)``, read *inside* the reserving transaction
        (after any wait for the write lock), so a round that waited past the deadline is
        refused. ``floor`` is the earliest time the caller knows has passed (its monotonic
        observation of the run); a ledger with an authoritative clock of its own may judge by
        that clock instead of ``now``, never below ``floor``. ``Reservation.reserved_wall`` is
        the time the round was judged at.

        The first round of a run opens it (deadline = judged time + ``policy.deadline_s``,
        limits from ``policy``); later rounds keep the run's original deadline and limits. A
        round is granted ``min(requested, slots left)`` slots, or refused (and the refusal
        recorded) when the run has its maximum rounds, no slot left, or its deadline passed.
        """
        ...

    async def record(
        self,
        attempts: Sequence[AttemptTrace],
        refusals: Sequence[RefusalRecord],
        calls: Sequence[CallRecord] = (),
        *,
        retain_limit: int = 0,
    ) -> None:
        """Persist attempt traces (a later trace of the same attempt replaces the earlier one),
        refusals and call outcomes, all in one commit. A call's outcome replaces its claim; a
        later outcome of the same identity leaves the first in place. With ``retain_limit``,
        the evidence ids of the ``ok`` calls are retained with their run in the same commit,
        as :meth:`retain` does with that limit."""
        ...

    async def claim_calls(
        self, run_id: str, calls: Sequence[CallIdentity]
    ) -> dict[CallIdentity, CallRecord]:
        """Claim each call before it searches: a :data:`PENDING` record, durable when this
        returns, unless the identity is already recorded or claimed. Returns the records that
        were there first (an outcome, or another claimant's claim, here or in another
        process), by identity; an identity missing from it is this caller's to run. A call's
        outcome later replaces its claim (:meth:`record`)."""
        ...

    async def release_calls(self, run_id: str, calls: Sequence[CallIdentity]) -> None:
        """Withdraw this caller's claims on ``calls`` (from :meth:`claim_calls`), for calls that
        never searched because no round was granted to them: their :data:`PENDING` records go,
        so the same call sent again runs. An outcome already recorded stays."""
        ...

    async def recorded_calls(self, run_id: str, call_ids: Sequence[str]) -> list[CallRecord]:
        """The recorded outcomes (and claims) of the run's calls with these ids (any
        arguments)."""
        ...

    async def usage(self, run_id: str) -> Usage:
        """The run's totals."""
        ...

    async def reservations(self, run_id: str) -> list[Reservation]:
        """The run's committed rounds, oldest first."""
        ...

    async def attempts(self, run_id: str) -> list[AttemptTrace]:
        """The run's attempt traces, by slot."""
        ...

    async def refusals(self, run_id: str) -> list[RefusalRecord]:
        """The run's refusals, oldest first."""
        ...

    async def retain(self, run_id: str, evidence_ids: Sequence[str], *, limit: int) -> None:
        """Remember evidence the run's deliberate searches returned, durably, with the run.

        At most ``limit`` distinct ids per run are kept (the first ones); a repeated id is kept
        once. This is what :meth:`take_validations` later re-checks, after a resume too.
        """
        ...

    async def bind_identity(self, run_id: str, *, principal: str, scope: str) -> None:
        """Bind the run to ``principal`` and ``scope`` on its first use; check it after.

        The first binding of a run id wins, atomically and durably, across every process that
        shares the ledger; it never changes. A call with another principal or scope raises
        :class:`~plugin.errors.RunIdentityError` and stores nothing.
        """
        ...

    async def open_run(
        self, run_id: str, *, principal: str, scope: str, now: WallTime, per_hour: int,
        floor: WallTime = -math.inf,
    ) -> RunOpening:
        """Bind ``run_id`` to ``principal`` and ``scope`` (as :meth:`bind_identity`: another
        principal or scope raises :class:`~plugin.errors.RunIdentityError` and stores nothing)
        and count it as a run they opened at ``now``, once; in one transaction. ``now`` is
        judged as :meth:`reserve` judges it: a ledger with an authoritative clock of its own
        reads that clock instead (so a worker whose clock is off cannot move the fleet's
        hour), never below ``floor``.

        ``OPENED`` when the run is counted now; ``KNOWN`` when it is bound already, however
        long ago it opened: a run is never counted twice; ``REFUSED`` (false),
        storing nothing, when the pair already opened ``per_hour`` other runs in the
        :data:`RUN_RATE_WINDOW_S` before ``now``. Atomic and shared at once by every process
        that shares the ledger, so a fleet of servers keeps one count per pair; durable at the
        latest with the run's first reservation, which is synced before anything of the run is
        searched (a ledger may leave the opening's own commit unsynced: the next synced commit
        makes it durable, in order, so a reservation never outlives its run's opening).
        """
        ...

    async def current_run(self, candidate: str, *, prefix: str, principal: str, scope: str,
                          now: WallTime, live_s: float, per_hour: int,
                          floor: WallTime = -math.inf) -> str:
        """The pair's newest run named ``prefix...`` whose deadline has not passed (not yet
        reserved: opened less than ``live_s`` before), judged at ``now`` or the ledger's own
        clock as :meth:`reserve` is, never before ``floor``; else ``candidate``, opened as
        :meth:`open_run` does. One transaction under the pair's lock."""
        ...

    async def take_validations(
        self, run_id: str, evidence_ids: Sequence[str], *, limit: int
    ) -> dict[str, Validity]:
        """Decide, atomically and durably, which ids may be re-checked now.

        For each distinct id: ``NOT_RETAINED`` when the run never retained it, ``BOUNDED``
        when the run already used ``limit`` re-checks, else ``GRANTED`` (and counted). The
        count lives with the run in the ledger, so a resume or another process cannot reset it.
        """
        ...
