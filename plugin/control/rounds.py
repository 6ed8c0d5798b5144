"""A reserved round: the async context manager :meth:`RecallAllowance.round` returns.

Entering it reserves the round (durably) and binds its permit; leaving it closes the permit
and writes what the round recorded. A write that fails for a reason that passes (the ledger
stayed locked beyond its busy timeout and the retries, or could not be reached, or its disk
was full) does not fail a round whose work is done: the records stay owed by the allowance,
and its next round writes them with its own (or :meth:`RecallAllowance.flush` does).
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn

from plugin.errors import LedgerError, RoundReusedError

from . import observe
from .binding import Binding
from .logs import CONTROL, log_event
from .permit import PASSING_FAILURES, Permit
from .policy import RoundKind
from .refusal import RecallBudgetExceeded

if TYPE_CHECKING:
    from .allowance import RecallAllowance


def _log_unissued(run_id: str, kind: RoundKind, exc: BaseException) -> None:
    if isinstance(exc, RecallBudgetExceeded):
        refusal = exc.refusal
        log_event(CONTROL, logging.INFO, "round.refused", run_id=run_id, kind=kind.value,
                  reason=refusal.reason.value, reserved=refusal.reserved,
                  executed=refusal.executed)
    elif isinstance(exc, Exception):
        log_event(CONTROL, logging.WARNING, "round.failed", run_id=run_id, kind=kind.value,
                  error=repr(exc))


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10."""
    notes = getattr(exc, "__notes__", None)
    if notes is None:
        notes = []
        exc.__notes__ = notes  # type: ignore[attr-defined, unused-ignore]
    notes.append(note)


class Round:
    """The async context manager returned by :meth:`RecallAllowance.round`."""

    __slots__ = (
        "_allowance", "_binding", "_entered", "_kind", "_permit", "_requested",
        "_run_id", "_watch",
    )

    def __init__(
        self, allowance: RecallAllowance, run_id: str, kind: RoundKind, requested: int
    ) -> None:
        self._allowance = allowance
        self._run_id = run_id
        self._kind = kind
        self._requested = requested
        self._permit: Permit | None = None
        self._binding: Binding | None = None
        self._entered = False
        self._watch: tuple[observe.Observer, object] | None = None

    def __copy__(self) -> Round:
        raise RoundReusedError("a Round cannot be copied; call allowance.round() for a new one")

    def __deepcopy__(self, memo: object) -> Round:
        raise RoundReusedError("a Round cannot be copied; call allowance.round() for a new one")

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise RoundReusedError("a Round cannot be pickled")

    async def __aenter__(self) -> Permit:
        # Claimed before the first await: two tasks entering one Round cannot both reserve.
        if self._entered:
            raise RoundReusedError("a round is entered once; reserve a new round instead")
        self._entered = True
        observer = observe.active
        if observer is not None:
            self._watch = (observer, observer.round_started(
                self._run_id, self._kind, self._requested))
        try:
            permit = await self._allowance._issue(self._run_id, self._kind, self._requested)
        except BaseException as exc:
            if self._watch is not None:
                self._watch[0].round_ended(self._watch[1], None, exc)
            _log_unissued(self._run_id, self._kind, exc)
            raise
        log_event(CONTROL, logging.DEBUG, "round.granted", run_id=self._run_id,
                  round=permit.round_index, kind=self._kind.value, slots=permit.slots,
                  legacy=permit.legacy)
        self._permit = permit
        self._binding = Binding.install(permit)
        if self._watch is not None:
            self._watch[0].round_granted(self._watch[1], permit)
        return permit

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        permit, binding = self._permit, self._binding
        assert permit is not None and binding is not None
        try:
            await permit._finish_phase()
        except LedgerError as failure:
            # What was not written stays on the permit, owed: a later round writes it.
            if exc is None and not isinstance(failure, PASSING_FAILURES):
                raise
            if exc is None:  # the round's work is done and its reservation durable
                log_event(CONTROL, logging.WARNING, "round.traces_deferred",
                          run_id=self._run_id, round=permit.round_index, error=repr(failure))
            else:  # the body's own exception is what the caller must see
                log_event(CONTROL, logging.WARNING, "round.traces_unwritten",
                          run_id=self._run_id, round=permit.round_index, error=repr(failure))
                _add_note(exc, f"recallbound: the round's traces were not written: {failure!r}")
        finally:
            binding.uninstall(permit)
            if self._watch is not None:
                self._watch[0].round_ended(self._watch[1], permit, exc)
