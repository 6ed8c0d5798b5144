"""One search attempt under a permit: :class:`Attempt` (async) and :class:`SyncAttempt`.

Both take a slot when entered (:meth:`Permit.attempt <plugin.control.permit.Permit.attempt>`,
:meth:`Permit.attempt_sync <plugin.control.permit.Permit.attempt_sync>`) and record the
attempt's trace when it starts and when it ends. The async one runs its body in a cancel scope
that ends at the permit's deadline; the sync one, for tools in worker threads, checks the
deadline when the slot is taken.
"""

from __future__ import annotations

import uuid
from types import TracebackType
from typing import TYPE_CHECKING

import anyio

from plugin.errors import InvalidArgumentError, RoundReusedError

from . import observe, validate
from .ledger import AttemptOutcome, AttemptTrace
from .policy import AttemptKind
from .refusal import RecallBudgetExceeded, RefusalReason

if TYPE_CHECKING:
    from .permit import Permit


def _storable(value: str | None, field: str) -> str | None:
    """``value``, text every ledger can store in a trace (valid Unicode, no NUL, bounded), or
    None; else :class:`~plugin.errors.InvalidArgumentError`."""
    if value is None:
        return None
    validate.bounded_text(value, field=field, max_bytes=validate.MAX_ID_BYTES)
    if "\x00" in value:
        raise InvalidArgumentError(f"{field} must not contain NUL")
    return value


class _AttemptBase:
    """What both kinds of attempt share: taking the slot and writing the trace."""

    __slots__ = (
        "_fingerprint", "_id", "_kind", "_permit", "_slot", "_started_mono", "_started_wall",
        "_strategy", "_watch",
    )

    def __init__(
        self, permit: Permit, kind: AttemptKind, strategy: str | None, fingerprint: str | None
    ) -> None:
        self._permit = permit
        self._kind = kind
        self._strategy = _storable(strategy, "strategy")
        self._fingerprint = _storable(fingerprint, "fingerprint")
        self._slot = 0
        self._id = ""
        self._started_wall = 0.0
        self._started_mono = 0.0
        self._watch: tuple[observe.Observer, object] | None = None

    @property
    def slot(self) -> int:
        return self._slot

    def _begin(self) -> int:
        if self._id:  # entered before (or by another task right now): one attempt, one slot
            raise RoundReusedError("an attempt is entered once; take a new one with "
                                   "permit.attempt()")
        self._id = "entered"
        permit = self._permit
        observer = observe.active
        try:
            self._slot = permit._take(self._kind)
        except RecallBudgetExceeded as exc:
            if observer is not None:
                observer.attempt_refused(permit, self._kind, exc.refusal)
            raise
        self._id = uuid.uuid4().hex
        clock = permit._clock
        self._started_wall = clock.wall()
        self._started_mono = clock.monotonic()
        trace = self._record(AttemptOutcome.IN_FLIGHT)
        permit._trace(trace)
        if observer is not None:
            self._watch = (observer, observer.attempt_started(permit, trace))
        return self._slot

    def _end(self, outcome: AttemptOutcome) -> None:
        trace = self._record(outcome)
        self._permit._trace(trace)
        if self._watch is not None:
            self._watch[0].attempt_ended(self._watch[1], trace)

    def _record(self, outcome: AttemptOutcome) -> AttemptTrace:
        permit = self._permit
        elapsed = (
            None
            if outcome is AttemptOutcome.IN_FLIGHT
            # never negative: a monotonic clock stepped back cannot unrecord an attempt
            else max(0.0, permit._clock.monotonic() - self._started_mono)
        )
        return AttemptTrace(
            attempt_id=self._id,
            run_id=permit.run_id,
            round_index=permit.round_index,
            slot=self._slot,
            kind=self._kind.value,
            outcome=outcome,
            started_wall=self._started_wall,
            elapsed_s=elapsed,
            strategy=self._strategy,
            fingerprint=self._fingerprint,
            legacy=permit.legacy,
            dropped=permit._dropped.get(self._slot, 0),
        )


class Attempt(_AttemptBase):
    """``async with permit.attempt() as slot:``: one attempt, cut at the permit's deadline."""

    __slots__ = ("_abandoned", "_scope")

    def __init__(
        self, permit: Permit, kind: AttemptKind, strategy: str | None, fingerprint: str | None
    ) -> None:
        super().__init__(permit, kind, strategy, fingerprint)
        self._scope: anyio.CancelScope | None = None
        self._abandoned = False

    async def abandon(self, outcome: AttemptOutcome) -> None:
        """End the attempt now with ``outcome`` (``deadline`` or ``cancelled``), for a caller
        that stopped waiting for a body running in another task: its trace is recorded now
        (written with the round, or at once after it), and the body, when it ends, records
        nothing more. A ``deadline`` ends the permit as the deadline does; so does a
        cancellation past the deadline, which is traced as the deadline (as in
        :meth:`__aexit__`). Does nothing for an attempt that took no slot or has already
        ended."""
        if not self._id or self._id == "entered" or self._abandoned or self._scope is None:
            return
        if anyio.current_time() >= self._scope.deadline or self._permit.expired():
            outcome = AttemptOutcome.DEADLINE
        self._abandoned = True
        if outcome is AttemptOutcome.DEADLINE:
            self._permit._ended = True
        self._end(outcome)
        await self._permit._flush_late()

    async def __aenter__(self) -> int:
        try:
            slot = self._begin()
        except RecallBudgetExceeded:
            await self._permit._flush_late()
            raise
        self._scope = anyio.CancelScope(
            deadline=anyio.current_time() + self._permit.seconds_left()  # inf for legacy
        )
        self._scope.__enter__()
        return slot

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._scope is not None
        scope, self._scope = self._scope, None
        swallowed = scope.__exit__(exc_type, exc, tb)
        if self._abandoned:  # its caller ended it and recorded its trace
            return bool(swallowed)
        late = anyio.current_time() >= scope.deadline or self._permit.expired()
        if scope.cancelled_caught or (exc is None and (scope.cancel_called or late)):
            # A body that returns past the deadline blocked where no cancel scope reaches, or
            # swallowed the deadline's cancellation, or ran while the wall clock stepped past
            # the run's deadline (no cancel scope follows the wall clock): what it produced is
            # late, so it leaves the way a cancelled one does. The permit's deadline was
            # reached: it stays expired, so no later attempt gets a slot, nor a fresh cancel
            # scope (the permit is not renewed).
            outcome = AttemptOutcome.DEADLINE
            self._permit._ended = True
        elif exc is None:
            outcome = AttemptOutcome.OK
        elif isinstance(exc, anyio.get_cancelled_exc_class()):
            # One past the deadline cut late work (its own scope's was swallowed): traced as
            # the deadline, and the cancellation goes on.
            outcome = AttemptOutcome.DEADLINE if late else AttemptOutcome.CANCELLED
            if late:
                self._permit._ended = True
        else:
            outcome = AttemptOutcome.ERROR
        self._end(outcome)
        await self._permit._flush_late()
        if outcome is AttemptOutcome.DEADLINE and (exc is None or scope.cancelled_caught):
            raise RecallBudgetExceeded(self._permit.refusal(RefusalReason.DEADLINE)) from None
        return bool(swallowed)


class SyncAttempt(_AttemptBase):
    """``with permit.attempt_sync() as slot:``: one attempt in a worker thread (no cancel
    scope; the deadline is checked when the slot is taken)."""

    __slots__ = ()

    def __enter__(self) -> int:
        try:
            return self._begin()
        except RecallBudgetExceeded:
            self._permit._flush_from_thread()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end(AttemptOutcome.OK if exc is None else AttemptOutcome.ERROR)
        self._permit._flush_from_thread()
