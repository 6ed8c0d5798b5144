"""A seam for watching the allowance: rounds and attempts, as they start and end.

The control core imports no telemetry library. A round and an attempt each report to the
process-wide :class:`Observer` installed with :func:`set_observer` (OpenTelemetry's lives outside
the core, in :mod:`runtime_hooks.telemetry`). With none installed, the default, every call site
costs one module-attribute read and a ``None`` test: ``bench/bench_telemetry.py`` measures it.

An observer gets the :class:`~plugin.control.permit.Permit` itself (typed here by what it may
read, :class:`PermitView`, so this module needs nothing of the permit's), so it can tie an
attempt to its round whatever task or worker thread runs the attempt. It must be fast and must not
raise: its calls sit on the allowance's hot path (an error it raises would end the round or
attempt that reported it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .ledger import AttemptTrace
    from .policy import AttemptKind, RoundKind
    from .refusal import BudgetRefusal


class PermitView(Protocol):
    """What an observer may read of a permit (a :class:`~plugin.control.permit.Permit` is one);
    an observer keys its records by the permit's identity."""

    @property
    def run_id(self) -> str: ...

    @property
    def round_index(self) -> int: ...

    @property
    def slots(self) -> int: ...

    @property
    def first_slot(self) -> int: ...

    @property
    def legacy(self) -> bool: ...

    @property
    def remaining(self) -> int: ...


class Observer(Protocol):
    """What the allowance reports. Tokens are the observer's own; the core only hands them back."""

    def round_started(self, run_id: str, kind: RoundKind, requested: int) -> object:
        """A round is about to be reserved (in the task that entered it); returns a token."""
        ...

    def round_granted(self, token: object, permit: PermitView) -> None:
        """The round's reservation committed and its permit was issued."""
        ...

    def round_ended(
        self, token: object, permit: PermitView | None, error: BaseException | None
    ) -> None:
        """The round's phase ended (``permit`` set), or it never got a permit (``error`` set:
        a :class:`~plugin.control.refusal.RecallBudgetExceeded` for a refusal). Called in the
        task that entered the round."""
        ...

    def attempt_started(self, permit: PermitView, trace: AttemptTrace) -> object:
        """An attempt took a slot (``trace`` is its in-flight trace); returns a token."""
        ...

    def attempt_refused(
        self, permit: PermitView, kind: AttemptKind, refusal: BudgetRefusal
    ) -> None:
        """An attempt was refused a slot."""
        ...

    def attempt_ended(self, token: object, trace: AttemptTrace) -> None:
        """The attempt ended; ``trace`` carries its outcome and elapsed time."""
        ...


active: Observer | None = None
"""The installed observer; ``None`` (the default) observes nothing at no cost."""


def set_observer(observer: Observer | None) -> Observer | None:
    """Install ``observer`` for the whole process (``None``: observe nothing); return the previous.

    Rounds and attempts already running keep reporting to the observer they started with.
    """
    global active
    previous, active = active, observer
    return previous


def current_observer() -> Observer | None:
    """The installed observer, or ``None``."""
    return active
