"""The store's injected clock is read like every other clock of the plugin: a reading that is
not a finite number of seconds is refused at once and nothing is written, so one glitch can
never become a memory's time (an infinite one would list it first for ever: an upsert never
moves a memory's time back)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TypedDict

import attrs
import pytest

from plugin.errors import InvalidArgumentError
from plugin.memory.store import MemoryStore

pytestmark = pytest.mark.anyio


class Who(TypedDict):
    principal: str
    scope: str


ME: Who = {"principal": "u1", "scope": "proj"}


@attrs.define
class GlitchingClock:
    """A host clock whose next wall reading is ``glitch``, then ``1000.0`` again."""

    glitch: object = None

    def wall(self) -> float:
        value, self.glitch = self.glitch, None
        return 1000.0 if value is None else value  # type: ignore[return-value]

    def monotonic(self) -> float:
        return 0.0


@pytest.mark.parametrize("reading", [math.inf, -math.inf, math.nan, "1000", True])
async def test_a_reading_that_is_not_a_finite_time_writes_nothing(
    tmp_path: Path, reading: object
) -> None:
    clock = GlitchingClock()
    async with MemoryStore(tmp_path / "memory.db", clock=clock) as store:
        await store.remember("the release is on Friday", id="m1", **ME)
        clock.glitch = reading
        with pytest.raises(InvalidArgumentError, match="clock"):
            await store.remember("the release moved to Monday", id="m1", **ME)
        clock.glitch = reading
        with pytest.raises(InvalidArgumentError, match="clock"):
            await store.remember("a new memory", id="m2", **ME)
        listed = [(m.id, m.text, m.created_at) async for m in store.memories(**ME)]
        assert listed == [("m1", "the release is on Friday", 1000.0)]
        # The next good reading writes as always.
        await store.remember("the release moved to Monday", id="m1", **ME)
        assert [m.text async for m in store.memories(**ME)] == ["the release moved to Monday"]
