"""The clock a user hands RecallAllowance stays theirs: ``allowance.clock`` is that object
(a ManualClock subclass or a custom clock keeps its own methods), while every reading the
allowance takes is still checked."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from plugin import ManualClock, RecallAllowance, RoundKind, SqliteLedger
from plugin.errors import InvalidArgumentError

pytestmark = pytest.mark.anyio


class SteppedManualClock(ManualClock):
    """A ManualClock subclass, as a suite's own test clock would be."""


class CustomClock:
    """A user's clock with a method of its own and an int wall reading."""

    def __init__(self) -> None:
        self.wall_value: object = 1_800_000_000
        self.mono = 0.0

    def wall(self) -> float:
        return self.wall_value  # type: ignore[return-value]

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.mono += seconds


@pytest.mark.parametrize("make", [SteppedManualClock, CustomClock])
async def test_allowance_clock_is_the_clock_given(tmp_path: Path, make: type) -> None:
    clock = make()
    async with SqliteLedger(tmp_path / "l.db") as ledger:
        allowance = RecallAllowance(ledger, clock=clock)
        assert allowance.clock is clock
        allowance.clock.advance(4.0)
        async with allowance.round("run-1", RoundKind.DELIBERATE, slots=1) as permit:
            assert permit.seconds_left() == pytest.approx(10.0)
            allowance.clock.advance(4.0)
            assert permit.seconds_left() == pytest.approx(6.0)


async def test_a_custom_clock_bad_reading_is_still_a_typed_error(tmp_path: Path) -> None:
    clock = CustomClock()
    async with SqliteLedger(tmp_path / "l.db") as ledger:
        allowance = RecallAllowance(ledger, clock=clock)
        clock.wall_value = math.nan
        with pytest.raises(InvalidArgumentError):
            async with allowance.round("run-1", RoundKind.DELIBERATE, slots=1):
                pass
        with pytest.raises(InvalidArgumentError):
            allowance.now_for("run-1")
        with pytest.raises(InvalidArgumentError):
            await allowance.headroom("run-1")
