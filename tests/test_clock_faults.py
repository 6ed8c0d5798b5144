"""A hostile injected clock through the whole pipeline (open_hooks, prepare, dispatch): a bad
reading anywhere is one typed error raised as itself, and no search goes uncounted."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from plugin import Evidence, SearchRequest, SimpleRetriever, WorkingState
from plugin.errors import InvalidArgumentError, RecallboundError
from runtime_hooks import ToolCall
from runtime_hooks.bootstrap import RecallConfig, open_hooks

pytestmark = pytest.mark.anyio

P, S = "mara", "notes"


class SwitchClock:
    """A user's clock: each reading is whatever the test last set (a bad value, a step in
    either direction)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.wall_value: object = 1_800_000_000.0
        self.mono_value: object = 50.0

    def wall(self) -> float:
        with self._lock:
            return self.wall_value  # type: ignore[return-value]

    def monotonic(self) -> float:
        with self._lock:
            return self.mono_value  # type: ignore[return-value]


def _config(tmp_path: Path) -> RecallConfig:
    return RecallConfig(ledger_path=tmp_path / "ledger.db")


def _calls(tag: str, n: int) -> list[ToolCall]:
    return [ToolCall(call_id=f"{tag}-{i}", arguments={"query": f"q {i}"}) for i in range(n)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, None, "soon"], ids=repr)
async def test_a_bad_monotonic_reading_before_the_round_is_a_typed_error(
    tmp_path: Path, bad: object
) -> None:
    clock = SwitchClock()
    searched: list[str] = []

    async def search(request: SearchRequest) -> list[Evidence]:
        searched.append(request.text)
        return [Evidence(id="m1", text="x")]

    async with open_hooks(
        _config(tmp_path), clock=clock, retriever=SimpleRetriever(search)
    ) as hooks:
        clock.mono_value = bad
        with pytest.raises(InvalidArgumentError, match="monotonic"):
            await hooks.prepare(WorkingState("q"), run_id="r", scope=S, principal=P)
        with pytest.raises(InvalidArgumentError, match="monotonic"):
            await hooks.dispatch(_calls("a", 2), run_id="r", scope=S, principal=P)
    assert searched == []


@pytest.mark.parametrize("bad", [math.nan, None], ids=repr)
async def test_a_bad_wall_reading_after_a_round_is_a_typed_error(
    tmp_path: Path, bad: object
) -> None:
    clock = SwitchClock()

    async def search(request: SearchRequest) -> list[Evidence]:
        return [Evidence(id="m1", text="x")]

    async with open_hooks(
        _config(tmp_path), clock=clock, retriever=SimpleRetriever(search)
    ) as hooks:
        await hooks.prepare(WorkingState("q"), run_id="r", scope=S, principal=P)
        clock.wall_value = bad  # what the allowance learned of the run is judged by it
        with pytest.raises(InvalidArgumentError, match="wall"):
            await hooks.dispatch(_calls("a", 2), run_id="r", scope=S, principal=P)


async def test_a_bad_reading_during_parallel_calls_is_raised_as_itself(tmp_path: Path) -> None:
    clock = SwitchClock()
    searched: list[str] = []

    async def search(request: SearchRequest) -> list[Evidence]:
        searched.append(request.text)
        clock.mono_value = math.nan  # the next call's slot reads it
        return [Evidence(id="m1", text="x")]

    async with open_hooks(
        _config(tmp_path), clock=clock, retriever=SimpleRetriever(search)
    ) as hooks:
        with pytest.raises(RecallboundError) as caught:
            await hooks.dispatch(_calls("a", 3), run_id="r", scope=S, principal=P)
        assert type(caught.value) is InvalidArgumentError  # not an exception group
        clock.mono_value = 60.0
        usage = await hooks.allowance.ledger.usage("r")
    assert searched == ["q 0"]
    assert (usage.rounds, usage.reserved) == (1, 3) and usage.executed >= len(searched)


async def test_a_monotonic_clock_stepped_back_mid_search_still_counts_the_search(
    tmp_path: Path,
) -> None:
    clock = SwitchClock()
    searched: list[str] = []

    async def search(request: SearchRequest) -> list[Evidence]:
        searched.append(request.text)
        clock.mono_value = 45.0  # a broken monotonic clock, stepped back 5 s
        return [Evidence(id="m1", text="x")]

    async with open_hooks(
        _config(tmp_path), clock=clock, retriever=SimpleRetriever(search)
    ) as hooks:
        context = await hooks.prepare(WorkingState("q"), run_id="r", scope=S, principal=P)
        usage = await hooks.allowance.ledger.usage("r")
    assert searched == ["q"] and context.slots == (1,)
    assert (usage.rounds, usage.reserved, usage.executed) == (1, 2, 1)
