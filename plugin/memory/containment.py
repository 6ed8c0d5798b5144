"""Containment: how a retriever's call is awaited, so that what it does by mistake stays its own.

Every call into a retriever runs with the permit hidden (``current_permit()`` is None), and
whatever it raises becomes a :class:`~plugin.errors.RetrieverFailedError` with a typed reason
and none of its text; a real cancellation and a stop (``KeyboardInterrupt``, ``SystemExit``)
propagate. Reads outside a slot run apart (:func:`contained_apart`, :func:`contained_within`);
a search or a belief read runs in its attempt, in a task of its own
(:func:`in_attempt_apart`), so one that will not be cancelled cannot hold its caller.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import ParamSpec, TypeVar, cast

import anyio

from plugin.control import (
    Attempt,
    AttemptOutcome,
    Permit,
    RecallBudgetExceeded,
    RefusalReason,
    hide_permit,
)
from plugin.errors import RetrieverFailedError

from .cancellation import really_cancelled
from .detached import STOPS as STOPS
from .detached import within

__all__ = [
    "LATE_GRACE_S",
    "STOPS",
    "contained",
    "contained_apart",
    "contained_sync",
    "contained_within",
    "in_attempt_apart",
    "stop_unwrapped",
]

T = TypeVar("T")
P = ParamSpec("P")

def stop_unwrapped(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """``fn`` whose ``KeyboardInterrupt`` or ``SystemExit`` (a retriever's, never contained)
    leaves as itself, not inside the exception group of the task group it crossed: a host's
    ``except KeyboardInterrupt`` catches it."""

    @functools.wraps(fn)
    async def unwrapped(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except BaseException as exc:
            stop = _stop_in(exc)
            if stop is None or stop is exc:
                raise
            raise stop from None

    return unwrapped


def _stop_in(exc: BaseException) -> BaseException | None:
    if isinstance(exc, STOPS):
        return exc
    for inner in getattr(exc, "exceptions", ()):  # an exception group, on every Python
        if isinstance(inner, BaseException) and (stop := _stop_in(inner)) is not None:
            return stop
    return None


def _failure(exc: BaseException) -> RetrieverFailedError:
    reason = exc.reason if isinstance(exc, RetrieverFailedError) else "raised"
    return RetrieverFailedError(reason if isinstance(reason, str) else "raised")


async def contained(call: Callable[[], Awaitable[T]]) -> T:
    """Await a retriever call in this task, with the permit hidden; its failure becomes a
    :class:`~plugin.errors.RetrieverFailedError` (real cancellations and stops propagate).

    A search or a belief read runs so, inside its attempt, in the attempt's own task
    (:func:`in_attempt_apart`): it starts the moment its slot is taken, so a slot taken is a
    search started while the permit was live. Reads outside a slot run apart
    (:func:`contained_apart`)."""
    try:
        with hide_permit():
            return await call()
    except BaseException as exc:
        if _stop_in(exc) is not None or really_cancelled(exc):
            raise  # a stop inside the retriever's own task group is still a stop
        failure = _failure(exc)
    raise failure


async def contained_apart(call: Callable[[], Awaitable[T]]) -> T:
    """:func:`contained`, the call run apart in a task of its own
    (:func:`~plugin.memory.detached.within`): one that will not take a cancellation (a
    shielded wait, one that catches it and waits on) cannot hold its caller. When the caller
    is cancelled (a read's bound, the host), it stops waiting at once; the call is cancelled
    (again at each later await) and left to end on its own, and what it returns then is
    dropped."""
    with hide_permit():
        outcome = await within(call, math.inf)
    if outcome is None:  # cannot happen unbounded: it ended, or the caller was cancelled
        raise RetrieverFailedError("deadline")
    if outcome.error is None:
        return cast("T", outcome.value)
    if _stop_in(outcome.error) is not None:
        raise outcome.error  # a stop inside the retriever's own task group is still a stop
    raise _failure(outcome.error)


async def contained_within(call: Callable[[], Awaitable[T]], within_s: float | None) -> T:
    """:func:`contained_apart`, cut after ``within_s`` seconds (None: no bound). A read cut
    there, or one that answered past it (a swallowed cancellation, a blocked loop), is a
    :class:`~plugin.errors.RetrieverFailedError` with the reason ``deadline``: late is none."""
    answered: list[T] = []
    with anyio.move_on_after(within_s) as bound:
        answered.append(await contained_apart(call))
    if bound.cancel_called or anyio.current_time() >= bound.deadline:
        raise RetrieverFailedError("deadline")
    return answered[0]


def contained_sync(call: Callable[[], T]) -> T:
    """:func:`contained` for the protocol's one synchronous method."""
    try:
        with hide_permit():
            return call()
    except BaseException as exc:
        if _stop_in(exc) is not None:
            raise
        failure = _failure(exc)
    raise failure


LATE_GRACE_S = 1.0
"""How long past the deadline a call waits for a search or a belief read that the deadline's
cancellation did not end (it shields itself, or catches the cancellation and waits on)."""


async def in_attempt_apart(
    permit: Permit, entered: Attempt, attempt: Callable[[Callable[[], None]], Awaitable[T]],
    *, inner: Sequence[Attempt] = (),
) -> T:
    """``attempt`` (which enters ``entered``, an attempt of ``permit``, and makes the retriever
    call in it) run in a task of its own, and waited for until the permit's deadline and
    :data:`LATE_GRACE_S` more.

    The slot is taken and the call started in that task, one right after the other, so a slot
    taken is still a call started while the permit was live, and the attempt's cancel scope
    cuts the call at the deadline as before. A call that will not be cancelled no longer holds
    its caller: past the grace the caller stops waiting and ends the attempt as ``deadline``
    (traced in the round still open; the permit ends as at its deadline), the call is a
    ``deadline`` refusal with its slot spent, and the late call is left to end on its own,
    what it returns dropped. Once the call has returned (``searched()``), what is left is
    recallbound's own bounded work, which is waited for whatever the time. A caller cancelled
    (the host) cancels the call and waits up to the grace for the attempt to end and record
    itself, as it did in the caller's task; past it, the attempt is ended ``cancelled``.
    A cancellation the call brought on itself (a retriever that cancels its own task) is that
    call's own ``failed`` result (reason ``raised``), not the deadline. The attempts opened
    inside the call (``inner``: a search's nested belief reads) still open when the caller
    gives up end with it, the same way."""
    returned: list[bool] = []
    bound = permit.seconds_left() + LATE_GRACE_S
    try:
        outcome = await within(lambda: attempt(lambda: returned.append(True)), bound,
                               past_it=lambda: bool(returned), settle_s=LATE_GRACE_S)
    except BaseException:
        with anyio.CancelScope(shield=True):  # those that did not end while they settled
            await _abandon((entered, *inner), AttemptOutcome.CANCELLED)
        raise
    if outcome is None:  # the permit ends as at its deadline
        await _abandon((entered, *inner), AttemptOutcome.DEADLINE)
        raise RecallBudgetExceeded(permit.refusal(RefusalReason.DEADLINE))
    if isinstance(outcome.error, anyio.get_cancelled_exc_class()):
        raise RetrieverFailedError("raised")
    if outcome.error is not None:
        raise outcome.error
    return cast("T", outcome.value)


async def _abandon(attempts: Sequence[Attempt], outcome: AttemptOutcome) -> None:
    for attempt in attempts:
        await attempt.abandon(outcome)
