"""The batch window in isolation: which requests share a round, and when a batch closes.

A stub stands in for the hooks (what the allowance says the run has left, and a recording
``dispatch``; its answer for a run the window has not served stands for what the window
knows of the run), so nothing
here uses a worker thread: trio runs on an autojumping MockClock and the window's waits are
virtual (asyncio runs the tests whose outcome needs no timer to fire).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import attrs
import pytest

from plugin import AllowancePolicy, ManualClock
from plugin.control.allowance import Room
from plugin.errors import LedgerUnavailableError
from runtime_hooks.hooks import ToolCall, ToolResult
from runtime_hooks.mcp.window import BatchWindow, check_window

from ._loops import VIRTUAL_TIME_LOOPS


@pytest.fixture(params=VIRTUAL_TIME_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


@attrs.frozen
class _Usage:
    rounds: int
    reserved: int
    deadline_wall: float | None = None


@attrs.define
class _Ledger:
    usage_now: _Usage

    async def usage(self, run_id: str) -> _Usage:
        return self.usage_now


@attrs.define
class _Allowance:
    ledger: _Ledger
    policy: AllowancePolicy = attrs.field(factory=AllowancePolicy)
    clock: ManualClock = attrs.field(factory=ManualClock)
    is_legacy: bool = False

    @property
    def checked_clock(self) -> ManualClock:
        return self.clock

    def known_room(self, run_id: str) -> Room:
        return self.fresh_room()

    def fresh_room(self) -> Room:
        used = self.ledger.usage_now
        rounds = max(0, self.policy.max_rounds - used.rounds)
        slots = max(0, self.policy.max_searches - used.reserved) if rounds else 0
        return Room(slots=slots, rounds=rounds, deadline_wall=used.deadline_wall)


@attrs.define
class _Hooks:
    """Records each dispatched batch: (virtual time, call ids)."""

    allowance: _Allowance
    batches: list[tuple[float, list[str]]] = attrs.field(factory=list)
    fail: Exception | None = None
    release: anyio.Event | None = None

    async def dispatch(self, calls: Sequence[ToolCall], **_: Any) -> list[ToolResult]:
        self.batches.append((anyio.current_time(), [call.call_id for call in calls]))
        if self.release is not None:
            await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [ToolResult(call_id=c.call_id, status="ok", content=c.call_id) for c in calls]


def _hooks(rounds: int = 0, reserved: int = 0) -> _Hooks:
    return _Hooks(_Allowance(_Ledger(_Usage(rounds=rounds, reserved=reserved))))


async def _send(window: BatchWindow, name: str, results: dict[str, str]) -> None:
    result = await window.search(ToolCall(call_id=name, arguments={"query": name}),
                                 run_id="r", principal="ana", scope="atlas")
    results[name] = result.content


async def _burst(window: BatchWindow, names: Sequence[str], gap: float = 0.0) -> dict[str, str]:
    results: dict[str, str] = {}
    async with window.running(), anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(_send, window, name, results)
            if gap:
                await anyio.sleep(gap)
    assert window.rounds_in_use() == 0  # nothing of the run outlives its requests
    return results



@pytest.mark.trio
async def test_a_lone_request_waits_the_window_for_the_rest_of_its_burst(
    autojump_clock: Any,
) -> None:
    hooks = _hooks()
    window = BatchWindow(hooks, window_s=3600.0)  # type: ignore[arg-type]
    started = anyio.current_time()
    assert await _burst(window, ["a"]) == {"a": "a"}
    assert hooks.batches == [(pytest.approx(started + 3600.0), ["a"])]  # and no longer


@pytest.mark.anyio
async def test_requests_sent_together_share_one_batch(anyio_backend: object) -> None:
    hooks = _hooks()
    window = BatchWindow(hooks, window_s=3600.0)  # type: ignore[arg-type]
    await _burst(window, list("abcdef"))
    # one round for all six (the hooks grant 4 slots and refuse 2), no wait: the batch
    # already held more calls than the run has slots
    assert [sorted(ids) for _, ids in hooks.batches] == [list("abcdef")]


@pytest.mark.anyio
async def test_on_the_last_round_the_batch_waits_for_the_rest_of_the_burst(
    anyio_backend: object,
) -> None:
    hooks = _hooks(rounds=1, reserved=2)  # after an automatic round: 2 slots, 1 round left
    window = BatchWindow(hooks, window_s=3600.0)  # type: ignore[arg-type]
    await _burst(window, list("abcdef"))
    assert [sorted(ids) for _, ids in hooks.batches] == [list("abcdef")]


@pytest.mark.anyio
async def test_a_spent_run_is_refused_without_waiting(anyio_backend: object) -> None:
    hooks = _hooks(rounds=2, reserved=4)
    window = BatchWindow(hooks, window_s=3600.0)  # type: ignore[arg-type]
    started = anyio.current_time()
    await _burst(window, ["a"])
    assert hooks.batches == [(pytest.approx(started, abs=0.5), ["a"])]


@pytest.mark.anyio
async def test_a_batch_failure_reaches_every_request_of_the_batch(anyio_backend: object) -> None:
    hooks = _hooks()
    hooks.fail = LedgerUnavailableError("the ledger is down")
    window = BatchWindow(hooks, window_s=0.01)  # type: ignore[arg-type]
    failures: list[str] = []

    async def one(name: str) -> None:
        try:
            await _send(window, name, {})
        except LedgerUnavailableError as exc:
            failures.append(f"{name}: {exc}")

    async with window.running(), anyio.create_task_group() as tg:
        for name in "ab":
            tg.start_soon(one, name)
    assert sorted(failures) == ["a: the ledger is down", "b: the ledger is down"]
    assert window.rounds_in_use() == 0


@pytest.mark.anyio
async def test_a_cancelled_request_leaves_its_batch_running(anyio_backend: object) -> None:
    hooks = _hooks()
    hooks.release = anyio.Event()
    window = BatchWindow(hooks, window_s=0.01)  # type: ignore[arg-type]
    results: dict[str, str] = {}
    scopes: list[anyio.CancelScope] = []

    async def leaving() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await _send(window, "a", results)

    async with window.running(), anyio.create_task_group() as tg:
        tg.start_soon(_send, window, "b", results)
        tg.start_soon(leaving)
        while not hooks.batches:  # the round is in flight
            await anyio.sleep(0.001)
        scopes[0].cancel()  # the client of "a" leaves
        await anyio.sleep(0.001)
        hooks.release.set()
    assert sorted(hooks.batches[0][1]) == ["a", "b"]  # its slot was taken all the same
    assert results == {"b": "b"}  # and the batch still answered the others
    assert window.rounds_in_use() == 0


@pytest.mark.trio
async def test_several_requests_hold_the_batch_open_for_the_window(autojump_clock: Any) -> None:
    hooks = _hooks()
    window = BatchWindow(hooks, window_s=0.005)  # type: ignore[arg-type]
    results: dict[str, str] = {}
    started = anyio.current_time()
    async with window.running(), anyio.create_task_group() as tg:
        tg.start_soon(_send, window, "a", results)
        tg.start_soon(_send, window, "b", results)
        await anyio.sleep(0.003)
        tg.start_soon(_send, window, "c", results)  # within the window: joins
        await anyio.sleep(0.004)
        tg.start_soon(_send, window, "d", results)  # after it: the next batch
    assert [sorted(ids) for _, ids in hooks.batches] == [["a", "b", "c"], ["d"]]
    assert hooks.batches[0][0] == pytest.approx(started + 0.005)
    assert results == {name: name for name in "abcd"}


@pytest.mark.trio
async def test_a_lone_request_on_the_last_round_waits_at_most_the_window(
    autojump_clock: Any,
) -> None:
    hooks = _hooks(rounds=1, reserved=1)
    window = BatchWindow(hooks, window_s=0.005)  # type: ignore[arg-type]
    started = anyio.current_time()
    await _burst(window, ["a"])
    assert hooks.batches == [(pytest.approx(started + 0.005), ["a"])]


@pytest.mark.trio
async def test_a_batch_holds_a_call_at_most_half_of_what_its_run_has_left(
    autojump_clock: Any,
) -> None:
    # A window longer than the run has left would hold a live run's call until its deadline
    # and refuse it for that: the batch closes within half of the time left.
    hooks = _hooks(rounds=1, reserved=1)
    clock = hooks.allowance.clock
    hooks.allowance.ledger.usage_now = _Usage(rounds=1, reserved=1,
                                              deadline_wall=clock.wall() + 1.0)
    window = BatchWindow(hooks, window_s=0.6)  # type: ignore[arg-type]
    started = anyio.current_time()
    await _burst(window, ["a"])
    assert hooks.batches == [(pytest.approx(started + 0.5), ["a"])]


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), True, "5"])
def test_a_bad_window_is_refused(value: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        check_window(value)
