"""Fault injection at every scheduling checkpoint of an operation.

An operation runs with counting wrappers around what it awaits (the ledger, the retriever, the
memory store's connection) and around the clock it reads. Every await through a wrapper is a
checkpoint; :func:`sweep` runs the operation once per checkpoint N = 1, 2, ... with a fault at
the N-th, until a run reaches no N-th checkpoint. The faults:

* ``cancel``: the operation's outer cancel scope is cancelled there (cancellation from outside);
* ``forward``: the monotonic clock steps forward past the run's deadline;
* ``backward``: the monotonic clock steps backward;
* ``raise``: the ledger (a :class:`~plugin.errors.LedgerUnavailableError`), the retriever (a
  ``RuntimeError``) or the store's connection (a ``sqlite3.OperationalError``) raises there,
  before or after the call it wraps (a write that committed, then its answer was lost).

Each wrapper checkpoints before and after the call it wraps, so both "before the write" and
"after the commit" are hit. A hang is caught by :func:`anyio.fail_after` on the event loop's
own clock, which the injected clock never moves.
"""

from __future__ import annotations

import gc
import inspect
import sqlite3
import sys
import warnings
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import attrs

from plugin import Evidence, ManualClock, SimpleRetriever
from plugin.errors import LedgerUnavailableError

FAULTS = ("cancel", "forward", "backward", "raise")
HANG_S = 30.0
"""How long one operation may take on the event loop's clock before it counts as a hang."""
MAX_CHECKPOINTS = 200
"""A sweep that still finds an N-th checkpoint here is itself a bug (an endless loop)."""

T = TypeVar("T")


class InjectedFault(RuntimeError):
    """What an injected retriever raises."""


@attrs.define(eq=False)
class SteppingClock:
    """A :class:`ManualClock` whose monotonic reading can also be stepped (either way)."""

    inner: ManualClock
    offset: float = 0.0

    def wall(self) -> float:
        return self.inner.wall()

    def monotonic(self) -> float:
        return self.inner.monotonic() + self.offset


@attrs.define(eq=False)
class Checkpoints:
    """Counts checkpoints and fires ``fault`` at the ``at``-th, while ``armed``."""

    fault: str
    at: int
    clock: SteppingClock
    armed: bool = True
    step_s: float = 60.0
    count: int = 0
    fired: str | None = None
    """Where the fault fired (a wrapper's label), once it did."""
    scope: anyio.CancelScope = attrs.field(factory=anyio.CancelScope)

    async def point(self, where: str, error: Callable[[], BaseException]) -> None:
        """One checkpoint at ``where``; ``error`` builds what a ``raise`` fault raises."""
        if not self.armed:
            return
        self.count += 1
        if self.count == self.at:
            self.fired = where
            if self.fault == "cancel":
                self.scope.cancel()
            elif self.fault == "forward":
                self.clock.offset += self.step_s
            elif self.fault == "backward":
                self.clock.offset -= self.step_s
            else:
                raise error()
        await anyio.lowlevel.checkpoint()

    async def around(
        self, where: str, error: Callable[[], BaseException], call: Callable[[], Awaitable[T]]
    ) -> T:
        """``call()`` with a checkpoint before and after it."""
        await self.point(f"{where}:before", error)
        result = await call()
        await self.point(f"{where}:after", error)
        return result


class CountingLedger:
    """A ledger whose every coroutine method is wrapped by :meth:`Checkpoints.around`."""

    def __init__(self, inner: object, points: Checkpoints) -> None:
        self.inner = inner
        self.points = points

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(found):
            return found

        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            return await self.points.around(
                f"ledger.{name}",
                lambda: LedgerUnavailableError("injected: ledger lost"),
                lambda: found(*args, **kwargs),
            )

        return wrapped


class CountingConnection(CountingLedger):
    """A SQLite connection (a store's or a ledger's), wrapped like :class:`CountingLedger`;
    its ``raise`` fault is a ``sqlite3.OperationalError`` with ``message``."""

    def __init__(self, inner: object, points: Checkpoints, message: str = "disk I/O error") -> None:
        super().__init__(inner, points)
        self.message = message

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(found) or name == "close":
            return found

        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            return await self.points.around(
                f"conn.{name}",
                lambda: sqlite3.OperationalError(self.message),
                lambda: found(*args, **kwargs),
            )

        return wrapped


class CountingRetriever:
    """A retriever over fixed memories that records each query it searches."""

    def __init__(self, memories: dict[str, Evidence], points: Checkpoints) -> None:
        self.memories = memories
        self.points = points
        self.searched: list[str] = []
        self.retriever = SimpleRetriever(self.search, get=self.get)

    async def search(self, request: Any) -> list[Evidence]:
        async def found() -> list[Evidence]:
            self.searched.append(request.text)
            return list(self.memories.values())

        return await self.points.around(
            "retriever.search", lambda: InjectedFault("retriever down"), found
        )

    async def get(self, evidence_id: str, *, principal: str, scope: str) -> Evidence | None:
        async def found() -> Evidence | None:
            return self.memories.get(evidence_id)

        return await self.points.around(
            "retriever.get", lambda: InjectedFault("retriever down"), found
        )


@contextmanager
def no_stray_warnings() -> Iterator[None]:
    """Fail on a coroutine never awaited or a resource never closed, however it surfaces
    (a warning, or an unraisable error in a finalizer)."""
    unraisable: list[str] = []
    previous = sys.unraisablehook

    def hook(info: Any) -> None:
        unraisable.append(f"{info.exc_type.__name__}: {info.exc_value} in {info.object!r}")

    sys.unraisablehook = hook
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
            gc.collect()
    finally:
        sys.unraisablehook = previous
    stray = [
        str(w.message) for w in caught if issubclass(w.category, (RuntimeWarning, ResourceWarning))
    ]
    assert not stray and not unraisable, (stray, unraisable)


CANCELLED = "cancelled"
"""What :func:`run_cut` gives for an operation that the injected cancellation ended."""


async def run_cut(points: Checkpoints, operation: Callable[[], Awaitable[T]]) -> object:
    """Run ``operation`` under a fresh ``points.scope``: its result, the exception it ended
    with, or :data:`CANCELLED`. A hang fails the test; so does an exception group (one fault
    must come out as itself). ``points`` is disarmed afterwards: what runs next (checks,
    retries) runs without a fault."""
    outcome: object = CANCELLED
    points.scope = anyio.CancelScope()
    with anyio.fail_after(HANG_S):
        with points.scope:
            try:
                outcome = await operation()
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:
                outcome = exc
            finally:
                points.armed = False
    assert not isinstance(outcome, BaseExceptionGroup), (points.fired, outcome)
    return outcome


async def sweep(
    fault: str,
    attempt: Callable[[Checkpoints], Awaitable[None]],
    clock: Callable[[], SteppingClock],
) -> int:
    """``attempt(points)`` once per checkpoint with ``fault`` at it, until the fault no longer
    fires; returns how many checkpoints the operation has."""
    with no_stray_warnings():  # one full collection per sweep: each costs a tenth of a second
        for at in range(1, MAX_CHECKPOINTS):
            points = Checkpoints(fault=fault, at=at, clock=clock())
            await attempt(points)
            if points.fired is None:
                assert at > 1, "the operation reached no checkpoint"
                return at - 1
    raise AssertionError(f"more than {MAX_CHECKPOINTS} checkpoints")


if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup
