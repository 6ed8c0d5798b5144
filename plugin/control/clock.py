"""Clocks: the only way the control layer learns the time.

A :class:`Clock` has two readings. ``wall()`` is seconds since the epoch: it is what the durable
ledger stores (audit, resume across processes) and it can jump in either direction. ``monotonic()``
is the worker timer: it never goes backwards and only differences of it mean anything. Nothing in
:mod:`plugin.control` reads an ambient clock; the composition root picks :class:`SystemClock`,
tests pick :class:`ManualClock`.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

import attrs

from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError

from .validate import finite, number_text


@runtime_checkable
class Clock(Protocol):
    """Wall and monotonic time, injected wherever time is read."""

    def wall(self) -> float:
        """Seconds since the epoch; may be stepped in either direction."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences are meaningful."""
        ...


@attrs.frozen
class SystemClock:
    """The process's real clocks: :func:`time.time` and :func:`time.monotonic`."""

    # The builtins themselves, not wrappers: a permit reads both on every slot it gives out.
    wall = staticmethod(time.time)
    monotonic = staticmethod(time.monotonic)


def _finite(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentTypeError(f"{name} must be a number, got {type(value).__name__}")
    if not finite(value):
        raise InvalidArgumentError(f"{name} must be finite, got {number_text(value)}")
    return float(value)


@attrs.define(eq=False)
class ManualClock:
    """A clock that moves only when told to: the determinism adapter for tests and replays.

    ``advance(s)`` moves both readings forward (time passing); ``step_wall(s)`` moves the wall
    reading alone, in either direction (an NTP step, a VM resume). Safe to use from threads.
    """

    _wall: float = attrs.field(default=1_700_000_000.0, alias="wall")
    _monotonic: float = attrs.field(default=0.0, alias="monotonic")
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._wall = _finite(self._wall, "wall")
        self._monotonic = _finite(self._monotonic, "monotonic")

    def wall(self) -> float:
        with self._lock:
            return self._wall

    def monotonic(self) -> float:
        with self._lock:
            return self._monotonic

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` (>= 0) pass on both clocks."""
        seconds = _finite(seconds, "seconds")
        if seconds < 0:
            raise InvalidArgumentError(
                f"seconds must be >= 0 (time does not run backwards), got {seconds}"
            )
        with self._lock:
            self._wall += seconds
            self._monotonic += seconds

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock alone by ``seconds`` (negative steps it backwards)."""
        seconds = _finite(seconds, "seconds")
        with self._lock:
            self._wall += seconds


def _reading(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"the clock's {name}() returned {type(value).__name__} "
                                f"{value!r}, not a number of seconds")
    if not finite(value):
        raise InvalidArgumentError(
            f"the clock's {name}() returned {number_text(value)}, not a finite number")
    return float(value)


@attrs.frozen
class FiniteClock:
    """An injected clock whose every reading is checked: a number, and finite.

    A reading that is not raises :class:`~plugin.errors.InvalidArgumentError` at once, so a
    glitch (``inf`` or ``nan`` once) can never be judged or stored.
    """

    inner: Clock

    def wall(self) -> float:
        return _reading(self.inner.wall(), "wall")

    def monotonic(self) -> float:
        return _reading(self.inner.monotonic(), "monotonic")


def finite_clock(clock: Clock) -> Clock:
    """``clock`` with every reading checked (:class:`FiniteClock`).

    :class:`SystemClock` and :class:`ManualClock` are returned as they are: their readings are
    finite by construction, and a permit reads the clock on every slot it gives out.
    """
    if type(clock) in (SystemClock, ManualClock) or isinstance(clock, FiniteClock):
        return clock
    return FiniteClock(clock)
