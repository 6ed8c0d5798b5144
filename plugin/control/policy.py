"""The allowance policy and the kinds of rounds."""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs

from plugin.errors import InvalidArgumentError

from .validate import finite, number_text


class RoundKind(enum.Enum):
    """Which phase of the agent loop a round belongs to."""

    AUTOMATIC = "automatic"
    """Preparation: recall before the model is called (a base search and a possible delta)."""
    DELIBERATE = "deliberate"
    """Tool dispatch: the model's own search calls of one turn."""


MAX_COUNT = 2**31 - 1
"""The largest count a policy or a round may name: storable by every ledger."""


def _int_in(low: int) -> Callable[[object, attrs.Attribute[int], object], None]:
    def check(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(
                f"AllowancePolicy.{attribute.name} must be an int, got {type(value).__name__}"
            )
        if not low <= value <= MAX_COUNT:
            raise InvalidArgumentError(
                f"AllowancePolicy.{attribute.name} must be between {low} and {MAX_COUNT}, "
                f"got {value}"
            )

    return check


MAX_DEADLINE_S = 366 * 86_400.0
"""The longest deadline a policy may name (a year): wall times stay exact as floats."""

_positive_int = _int_in(1)


def _deadline(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(
            f"AllowancePolicy.deadline_s must be a number, got {type(value).__name__}"
        )
    if not finite(value) or not 0 < value <= MAX_DEADLINE_S:
        raise InvalidArgumentError(
            f"AllowancePolicy.deadline_s must be finite, > 0 and <= {MAX_DEADLINE_S}, "
            f"got {number_text(value)}"
        )


@attrs.frozen(kw_only=True)
class AllowancePolicy:
    """How much recall one agent run may do.

    At most ``max_searches`` search attempts in at most ``max_rounds`` rounds, all before the
    deadline fixed when the run's first round opens (``deadline_s`` later). An automatic round
    reserves ``automatic_slots``; an attempt may fall back to reading a cited source at most
    ``source_read_fallbacks`` times without taking a new slot.

    Raises :class:`~plugin.errors.InvalidArgumentError` (a ``ValueError``) for zero or negative
    counts, a NaN, infinite or non-positive deadline, or more automatic slots than searches.
    """

    max_searches: int = attrs.field(default=4, validator=_positive_int)
    max_rounds: int = attrs.field(default=2, validator=_positive_int)
    deadline_s: float = attrs.field(default=10.0, validator=_deadline)
    automatic_slots: int = attrs.field(default=2, validator=_positive_int)
    source_read_fallbacks: int = attrs.field(default=2, validator=_positive_int)

    def __attrs_post_init__(self) -> None:
        if self.automatic_slots > self.max_searches:
            raise InvalidArgumentError(
                f"AllowancePolicy.automatic_slots ({self.automatic_slots}) must not exceed "
                f"max_searches ({self.max_searches})"
            )


class AttemptKind(enum.Enum):
    """What a search attempt is for; every kind takes one slot."""

    BASE = "base"
    """The automatic round's base search."""
    DELTA = "delta"
    """The automatic round's follow-up, run only when the base leaves need unmet."""
    DELIBERATE = "deliberate"
    """One of the model's own search calls."""
    NESTED = "nested"
    """A People-to-belief read nested inside another attempt."""
