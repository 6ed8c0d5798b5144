"""The control core's observer seam, with a recording observer (no telemetry library)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from plugin import AttemptKind, ManualClock, RecallAllowance, RecallBudgetExceeded, RoundKind
from plugin.control import AttemptOutcome, AttemptTrace, Permit, observe
from plugin.control.policy import RoundKind as _RoundKind
from plugin.control.refusal import BudgetRefusal

from ._fakes import MemoryLedger
from ._loops import VIRTUAL_TIME_LOOPS

pytestmark = pytest.mark.anyio


@pytest.fixture(params=VIRTUAL_TIME_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def round_started(self, run_id: str, kind: _RoundKind, requested: int) -> object:
        self.calls.append(("round_started", run_id, kind.value, requested))
        return f"round-{len(self.calls)}"

    def round_granted(self, token: object, permit: Permit) -> None:
        self.calls.append(("round_granted", token, permit.round_index, permit.slots))

    def round_ended(self, token: object, permit: Permit | None,
                    error: BaseException | None) -> None:
        reason = (error.refusal.reason.value if isinstance(error, RecallBudgetExceeded)
                  else None if error is None else type(error).__name__)
        self.calls.append(("round_ended", token, permit is not None, reason))

    def attempt_started(self, permit: Permit, trace: AttemptTrace) -> object:
        self.calls.append(("attempt_started", trace.slot, trace.outcome.value))
        return f"attempt-{trace.slot}"

    def attempt_refused(self, permit: Permit, kind: AttemptKind, refusal: BudgetRefusal) -> None:
        self.calls.append(("attempt_refused", kind.value, refusal.reason.value))

    def attempt_ended(self, token: object, trace: AttemptTrace) -> None:
        self.calls.append(("attempt_ended", token, trace.outcome.value, trace.elapsed_s))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    installed = Recorder()
    previous = observe.set_observer(installed)
    yield installed
    observe.set_observer(previous)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall=1e9, monotonic=1.0)


async def test_the_seam_reports_rounds_and_attempts_in_order(
    recorder: Recorder, clock: ManualClock
) -> None:
    allowance = RecallAllowance(MemoryLedger(), clock=clock)
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        async with permit.attempt(AttemptKind.BASE):
            clock.advance(0.5)
        with permit.attempt_sync(AttemptKind.DELTA):
            pass
        with pytest.raises(RecallBudgetExceeded):
            async with permit.attempt(AttemptKind.DELTA):
                pass  # pragma: no cover
    async with allowance.round("r", RoundKind.DELIBERATE, slots=2):
        pass
    with pytest.raises(RecallBudgetExceeded):
        async with allowance.round("r", RoundKind.DELIBERATE, slots=1):
            pass  # pragma: no cover
    assert recorder.calls == [
        ("round_started", "r", "automatic", 2),
        ("round_granted", "round-1", 1, 2),
        ("attempt_started", 1, "in_flight"),
        ("attempt_ended", "attempt-1", "ok", 0.5),
        ("attempt_started", 2, "in_flight"),
        ("attempt_ended", "attempt-2", "ok", 0.0),
        ("attempt_refused", "delta", "slots"),
        ("round_ended", "round-1", True, None),
        ("round_started", "r", "deliberate", 2),
        ("round_granted", "round-9", 2, 2),
        ("round_ended", "round-9", True, None),
        ("round_started", "r", "deliberate", 1),
        ("round_ended", "round-12", False, "rounds"),
    ]


async def test_an_attempt_reports_to_the_observer_it_started_with(
    recorder: Recorder, clock: ManualClock
) -> None:
    allowance = RecallAllowance(MemoryLedger(), clock=clock)
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        async with permit.attempt(AttemptKind.BASE):
            observe.set_observer(None)  # removed mid-attempt
    ended = [c for c in recorder.calls if c[0] in ("attempt_ended", "round_ended")]
    assert [c[0] for c in ended] == ["attempt_ended", "round_ended"]
    assert ended[0][2] == AttemptOutcome.OK.value


async def test_a_body_error_reaches_round_ended(recorder: Recorder, clock: ManualClock) -> None:
    allowance = RecallAllowance(MemoryLedger(), clock=clock)
    with pytest.raises(KeyError):
        async with allowance.round("r", RoundKind.AUTOMATIC):
            raise KeyError("boom")
    assert recorder.calls[-1] == ("round_ended", "round-1", True, "KeyError")


def test_no_observer_by_default() -> None:
    assert observe.current_observer() is None
