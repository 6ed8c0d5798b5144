"""Permits: scoped, nonrenewable authority to search, shared by every task of a phase.

A permit is one mutable object with identity. The phase that holds it binds it to a
:class:`~contextvars.ContextVar` (:mod:`plugin.control.binding`); every task spawned inside the
phase copies the context and so holds a reference to the *same* object. Taking a slot is a
check-and-increment under a :class:`threading.Lock` with no ``await`` in between, so parallel
tool calls (tasks or worker threads) always take distinct slots. Leaving the phase closes the
permit first, which reaches every copied context at once, and only then resets the ContextVar.

Only :meth:`RecallAllowance.round <plugin.control.allowance.RecallAllowance.round>` issues a
permit, after its reservation committed: ``Permit(...)`` raises :class:`TypeError`, and a
permit cannot be copied or pickled, so a run's slots are counted on one object.

**What this contains, and what it does not.** Code in the same process can read any frame,
closure or object, so no Python library can keep a permit away from it. The hooks take every
slot themselves and call a retriever where no permit is bound (``current_permit()`` is None
there): a retriever's *mistakes* (re-entering the hooks, spawning work, blocking, raising)
cannot spend slots it was not given. Its *malice* is not contained in-process: a retriever that
walks frames or the garbage collector can find a permit and take its round's slots (never more
than the run reserved: the ledger's reservation still holds). An untrusted retriever runs in
another process, behind :class:`plugin.ProcessRetriever <plugin.memory.process.ProcessRetriever>`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

import anyio
import anyio.from_thread
import attrs

from plugin.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LedgerClosedError,
    LedgerFullError,
    LedgerLockedError,
    LedgerUnavailableError,
)

from .attempt import Attempt, SyncAttempt
from .binding import PermitHolder as PermitHolder
from .binding import bind_permits as bind_permits
from .binding import current_permit as current_permit
from .binding import hide_permit as hide_permit
from .clock import Clock
from .constructor import NoPublicConstructor
from .ledger import AttemptTrace, CallRecord, RefusalRecord
from .policy import AttemptKind, RoundKind
from .refusal import BudgetRefusal, RecallBudgetExceeded, RefusalReason
from .shield import finish, loop_token
from .tally import RunTally

if TYPE_CHECKING:
    from .ledger import Ledger

__all__ = [
    "LEGACY_SLOTS", "Attempt", "NoPublicConstructor", "Permit", "PermitHolder", "SyncAttempt",
    "bind_permits", "current_permit", "hide_permit",
]

_RECORD_RETRIES = (0.05, 0.2, None)
"""Pauses between tries of a trace write that found the ledger locked (None: give up); none
once the run's deadline is nearer than the pause (the records are then owed)."""

PASSING_FAILURES = (LedgerLockedError, LedgerUnavailableError, LedgerFullError)
"""Ledger failures a later write can get past: records that meet one stay owed, written by a
later round of the allowance, and the work they record stands."""

_MISUSE = (
    "a Permit is one object, issued only by RecallAllowance.round() after its reservation "
    "committed; it cannot be copied or pickled"
)

Records = tuple[dict[str, AttemptTrace], list[RefusalRecord], list[CallRecord], list[int]]
"""A permit's buffered records: traces by attempt id, refusals, call outcomes, retain limits."""

LEGACY_SLOTS = sys.maxsize
"""``Permit.slots`` of a legacy (unenforced) permit."""


@attrs.define(eq=False)
class Permit(metaclass=NoPublicConstructor):
    """The authority to run this round's search attempts.

    ``slots`` were granted to the round; each attempt takes one (:meth:`attempt`), numbered
    across the whole run. The permit expires at the run's original wall deadline *and* when
    the monotonic time elapsed since issue exceeds what was left at issue, whichever comes
    first, so a wall clock stepped backwards never extends it. It closes when its phase ends.
    It can never be extended, refilled or re-issued. Issued only by ``allowance.round``.
    """

    run_id: str = attrs.field(on_setattr=attrs.setters.frozen)
    round_index: int = attrs.field(on_setattr=attrs.setters.frozen)
    kind: RoundKind = attrs.field(on_setattr=attrs.setters.frozen)
    slots: int = attrs.field(on_setattr=attrs.setters.frozen)
    first_slot: int = attrs.field(on_setattr=attrs.setters.frozen)
    legacy: bool = attrs.field(on_setattr=attrs.setters.frozen)
    _clock: Clock = attrs.field(repr=False)
    _ledger: Ledger = attrs.field(repr=False)
    _deadline_wall: float = attrs.field(repr=False)
    _expires_wall: float = attrs.field(repr=False)
    _issued_mono: float = attrs.field(repr=False)
    _left_at_issue: float = attrs.field(repr=False)
    _source_reads_limit: int = attrs.field(repr=False)
    _reserved_total: int = attrs.field(repr=False)
    _executed_before: int = attrs.field(repr=False)
    _owner: Callable[[Permit], None] | None = attrs.field(default=None, repr=False)
    """Told of this permit when a write of its records fails: it owes them (the allowance)."""
    _tally: RunTally = attrs.field(factory=RunTally, repr=False)  # the run's, in this process
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)
    _taken: int = attrs.field(default=0, init=False, repr=False)
    _closed: bool = attrs.field(default=False, init=False, repr=False)
    _flushed: bool = attrs.field(default=False, init=False, repr=False)
    _source_reads: dict[int, int] = attrs.field(factory=dict, init=False, repr=False)
    _dropped: dict[int, int] = attrs.field(factory=dict, init=False, repr=False)
    _traces: dict[str, AttemptTrace] = attrs.field(factory=dict, init=False, repr=False)
    _refusals: list[RefusalRecord] = attrs.field(factory=list, init=False, repr=False)
    _calls: list[CallRecord] = attrs.field(factory=list, init=False, repr=False)
    _retain_limit: list[int] = attrs.field(factory=list, init=False, repr=False)
    _wall: Callable[[], float] = attrs.field(init=False, repr=False)
    _monotonic: Callable[[], float] = attrs.field(init=False, repr=False)
    _mono_deadline: float = attrs.field(init=False, repr=False)
    _ended: bool = attrs.field(default=False, init=False, repr=False)
    """Whether the permit was seen expired (by either clock): it never un-expires."""
    _loop: object = attrs.field(factory=loop_token, init=False, repr=False)  # the ledger's

    def __attrs_post_init__(self) -> None:
        # Bound once: taking a slot reads both clocks, and it is the hot path.
        self._wall = self._clock.wall
        self._monotonic = self._clock.monotonic
        self._mono_deadline = self._issued_mono + self._left_at_issue

    # -- one object: the run's slots are counted on it, never on a copy ------------------------

    def __copy__(self) -> NoReturn:
        raise InvalidArgumentTypeError(_MISUSE)

    def __deepcopy__(self, memo: object) -> NoReturn:
        raise InvalidArgumentTypeError(_MISUSE)

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise InvalidArgumentTypeError(_MISUSE)

    def __reduce__(self) -> NoReturn:
        raise InvalidArgumentTypeError(_MISUSE)

    # -- state -------------------------------------------------------------------------------

    @property
    def remaining(self) -> int:
        """Slots of this round not yet taken."""
        with self._lock:
            return self.slots - self._taken

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def deadline_wall(self) -> float:
        """The run's original wall-clock deadline (``inf`` for a legacy permit)."""
        return self._deadline_wall

    def seconds_left(self) -> float:
        """Seconds until the permit expires; never negative (``inf`` for a legacy permit)."""
        if self._ended:
            return 0.0
        left = min(self._expires_wall - self._wall(), self._mono_deadline - self._monotonic())
        if left <= 0:
            self._ended = True
        return max(0.0, left)

    def expired(self) -> bool:
        """Whether the deadline has passed (a closed permit need not be expired). Once seen
        expired, it stays expired: a wall clock stepped back later does not revive it."""
        if not self._ended and (
            self._wall() >= self._expires_wall or self._monotonic() >= self._mono_deadline
        ):
            self._ended = True  # only ever set: no lock needed
        return self._ended

    def close(self) -> None:
        """End the permit for every context that holds it. Idempotent; never un-closes."""
        self._closed = True

    def refusal(self, reason: RefusalReason) -> BudgetRefusal:
        """A refusal carrying the run's totals as this process knows them."""
        with self._lock:
            executed = self._executed_before + self._taken
        reserved, executed = self._tally.totals(reserved=self._reserved_total, executed=executed)
        return BudgetRefusal(reason=reason, run_id=self.run_id, reserved=reserved,
                             executed=executed)

    # -- taking slots ------------------------------------------------------------------------

    def _take(self, kind: AttemptKind) -> int:
        """Take one slot or raise; the refusal is buffered for the ledger either way."""
        if not isinstance(kind, AttemptKind):
            raise InvalidArgumentTypeError(f"kind must be an AttemptKind, got {kind!r}")
        expired = self.expired()  # the clocks need no lock; only check-and-increment does
        with self._lock:
            if self._closed:
                reason: RefusalReason | None = RefusalReason.CLOSED
            elif expired:
                reason = RefusalReason.DEADLINE
            elif self._taken >= self.slots:
                reason = RefusalReason.SLOTS
            else:
                reason = None
                self._taken = taken = self._taken + 1
                slot = self.first_slot + taken - 1
            if reason is not None:
                self._refusals.append(
                    RefusalRecord(
                        run_id=self.run_id,
                        round_index=self.round_index,
                        what="attempt",
                        kind=kind.value,
                        reason=reason,
                        at_wall=self._clock.wall(),
                        key=uuid.uuid4().hex,
                    )
                )
        if reason is not None:
            raise RecallBudgetExceeded(self.refusal(reason))
        self._tally.started()
        return slot

    def _trace(self, trace: AttemptTrace) -> None:
        with self._lock:
            self._traces[trace.attempt_id] = trace

    def attempt(self, kind: AttemptKind = AttemptKind.DELIBERATE, *,
                strategy: str | None = None, fingerprint: str | None = None) -> Attempt:
        """One search attempt: ``async with permit.attempt() as slot: ...``.

        Takes a slot (its number is distinct across the run) and runs the body in a cancel
        scope that ends at the permit's deadline. Raises :class:`RecallBudgetExceeded` with
        reason ``CLOSED`` after the phase ended, ``DEADLINE`` when the permit has expired, or
        ``SLOTS`` when the round has no slot left; a body cancelled by the deadline, or one that
        returns after the deadline (it blocked where no cancel scope reaches, or swallowed
        the cancellation), also leaves as ``DEADLINE``. The slot stays consumed whatever
        happens; the trace is recorded.
        """
        return Attempt(self, kind, strategy, fingerprint)

    def attempt_sync(self, kind: AttemptKind = AttemptKind.DELIBERATE, *,
                     strategy: str | None = None, fingerprint: str | None = None) -> SyncAttempt:
        """:meth:`attempt` as a plain context manager, for tools running in worker threads.

        The deadline is checked when the slot is taken; there is no cancel scope.
        """
        return SyncAttempt(self, kind, strategy, fingerprint)

    def source_read(self, slot: int) -> int:
        """Account one source-read fallback of the attempt holding ``slot``; return its number.

        A fallback stays inside its attempt: it takes no new slot and keeps the deadline. It
        raises :class:`RecallBudgetExceeded` (``SOURCE_READS``) past the policy's finite number
        of fallbacks, ``DEADLINE`` when expired, ``CLOSED`` after the phase ended.
        """
        with self._lock:
            if not self.first_slot <= slot < self.first_slot + self._taken:
                raise InvalidArgumentError(f"slot {slot} was not taken from this permit")
            if self._closed:
                reason: RefusalReason | None = RefusalReason.CLOSED
            elif self.expired():
                reason = RefusalReason.DEADLINE
            elif self._source_reads.get(slot, 0) >= self._source_reads_limit:
                reason = RefusalReason.SOURCE_READS
            else:
                reason = None
                self._source_reads[slot] = count = self._source_reads.get(slot, 0) + 1
        if reason is not None:
            raise RecallBudgetExceeded(self.refusal(reason))
        return count

    def note_dropped(self, slot: int, count: int) -> None:
        """Count, in the trace of the attempt holding ``slot``, ``count`` evidence items its
        retriever returned for another principal or scope (dropped before anything was
        rendered)."""
        if count <= 0:
            return
        with self._lock:
            if not self.first_slot <= slot < self.first_slot + self._taken:
                raise InvalidArgumentError(f"slot {slot} was not taken from this permit")
            self._dropped[slot] = self._dropped.get(slot, 0) + count

    # -- traces ------------------------------------------------------------------------------

    def record_calls(self, calls: Sequence[CallRecord], *, retain_limit: int = 0) -> None:
        """Buffer the round's call outcomes: written in the same commit as the round's traces,
        when its phase ends, with the ``ok`` calls' evidence retained within ``retain_limit``
        (see :meth:`Ledger.record`). Only while the phase runs (``InvalidArgumentError`` after)."""
        with self._lock:
            if self._flushed:
                raise InvalidArgumentError("call outcomes are recorded before the round ends")
            self._calls.extend(calls)
            self._retain_limit.append(retain_limit)

    async def flush(self) -> None:
        """Write buffered traces and refusals to the ledger, to the end whatever cancels the
        caller (:func:`~plugin.control.shield.finish`). A flush takes what is buffered out of
        the buffer, so flushes at once never write a record twice. A failed write puts it
        back, behind nothing newer, and its error propagates: nothing leaves before the ledger
        committed it; past a locked, unreachable or full ledger the allowance owes it."""
        traces, refusals, calls, _ = self._take_records()
        if not traces and not refusals and not calls:
            return

        failed: list[BaseException] = []  # the write's own error, if it ended in one

        async def write() -> None:
            try:
                for delay in _RECORD_RETRIES:
                    try:
                        if calls:
                            await self._ledger.record(
                                list(traces.values()), refusals, calls,
                                retain_limit=max(self._retain_limit, default=0))
                        else:  # a ledger written before call records still takes this
                            await self._ledger.record(list(traces.values()), refusals)
                        return
                    except LedgerLockedError:
                        if delay is None or self.seconds_left() <= delay:  # none past the end
                            raise
                        await anyio.sleep(delay)
            except BaseException as exc:
                failed.append(exc)
                raise

        try:
            await finish(write)  # a caller's cancellation comes through after the write ended
        except BaseException as exc:
            if failed or not isinstance(exc, anyio.get_cancelled_exc_class()):  # not written:
                # owed only past a failure that passes (one no write can store would ride
                # along with every later round's records and fail them too)
                owed = bool(failed) and isinstance(failed[0], PASSING_FAILURES)
                self._put_back((traces, refusals, calls, []), owed=owed)
            raise

    def _take_records(self) -> Records:
        """Everything buffered, taken out (handed to a later permit of the same allowance,
        whose flush writes it with its own)."""
        with self._lock:
            taken = (dict(self._traces), list(self._refusals), list(self._calls),
                     list(self._retain_limit))
            self._traces.clear()
            self._refusals.clear()
            self._calls.clear()
        return taken

    def _put_back(self, records: Records, *, owed: bool = True) -> None:
        """Records a write did not commit (or another permit's), back ahead of what is newer;
        the owner then owes them (unless not ``owed``: this permit's own flush will write)."""
        traces, refusals, calls, limits = records
        with self._lock:
            for attempt_id, trace in traces.items():
                self._traces.setdefault(attempt_id, trace)  # a newer trace wins
            self._refusals[:0] = refusals
            self._calls[:0] = calls
            self._retain_limit.extend(limits)
        if owed and (traces or refusals or calls):
            self._owe()

    def _flush_from_thread(self) -> None:
        """After the phase, write what a worker thread recorded, if it can reach the loop: an
        anyio worker thread (``to_thread.run_sync``) can; from any other thread it is owed."""
        if not self._flushed:
            return  # the phase will write it
        try:
            anyio.from_thread.run(self._flush_late)
        except RuntimeError:  # not an anyio worker thread, or no loop
            self._owe()

    def _owe(self) -> None:  # its next round, or its flush(), writes what is buffered
        if self._owner is not None:
            self._owner(self)

    async def _flush_late(self) -> None:
        """After the phase, write what a late attempt recorded (owed instead on another event
        loop than the permit's); a failure that passes leaves it owed (:meth:`flush`); a ledger
        closed since (the host shut down) leaves the attempt's outcome, a refusal or its work."""
        if self._flushed and loop_token() != self._loop:
            self._owe()
        elif self._flushed:
            with contextlib.suppress(*PASSING_FAILURES, LedgerClosedError):
                await self.flush()

    async def _finish_phase(self) -> None:
        """Close, then persist what the phase recorded. Later records are written as they come."""
        self._closed = True
        self._flushed = True
        await self.flush()
