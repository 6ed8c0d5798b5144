"""What the allowance state machine drives its steps with: a clock it moves by hand (the
monotonic reading too, backwards) and one memory backend that records every search."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import attrs

from plugin import Evidence, SimpleRetriever

P, S = "u1", "proj"
MEMORIES = [Evidence(id=f"m{i}", text=f"cutover note {i}", principal=P, scope=S) for i in range(2)]


@attrs.define(eq=False)
class SteppedClock:
    """A clock the machine moves: both readings forward, the wall alone either way, and the
    monotonic reading alone backwards (a clock no host should have, that must not extend a
    permit either)."""

    _wall: float = 1_800_000_000.0
    _mono: float = 100.0
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def wall(self) -> float:
        with self._lock:
            return self._wall

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._wall += seconds
            self._mono += seconds

    def step_wall(self, seconds: float) -> None:
        with self._lock:
            self._wall += seconds

    def step_mono(self, seconds: float) -> None:
        with self._lock:
            self._mono += seconds


@attrs.define
class Search:
    run_id: str
    text: str
    wall: float
    mono: float
    round_wall: float
    round_mono: float


class World:
    """The one memory backend: records every search (with the clock's readings and the round
    it belongs to), may pass time inside a search, and may hold searches until cancelled."""

    def __init__(self, clock: SteppedClock) -> None:
        self.clock = clock
        self.searches: list[Search] = []
        self.round_at = (clock.wall(), clock.monotonic())
        self.slow_s = 0.0
        self.wall_step_s = 0.0
        self.hold = False
        self.held: anyio.Event | None = None
        self.retriever = SimpleRetriever(self.search, get=self.get)

    def begin_round(self, slow: tuple[float, float] = (0.0, 0.0), hold: bool = False) -> None:
        self.round_at = (self.clock.wall(), self.clock.monotonic())
        (self.slow_s, self.wall_step_s), self.hold = slow, hold

    def record(self, text: str) -> None:
        run_id = text.split(" ", 1)[0]
        self.searches.append(
            Search(run_id, text, self.clock.wall(), self.clock.monotonic(), *self.round_at)
        )

    async def search(self, request: Any) -> list[Evidence]:
        self.record(request.text)
        if self.hold:
            assert self.held is not None
            self.held.set()
            await anyio.sleep_forever()
        self.clock.advance(self.slow_s)
        self.clock.step_wall(self.wall_step_s)
        await anyio.lowlevel.checkpoint()
        return list(MEMORIES)

    async def get(self, evidence_id: str, *, principal: str, scope: str) -> Evidence | None:
        return next((m for m in MEMORIES if m.id == evidence_id), None)
