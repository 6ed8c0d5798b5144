"""Allowance rules that no other test held: each was found by changing the code that
implements it and seeing every test still pass.

The ledger is the in-memory double (no ledger worker threads), so trio's autojump clock is safe.
"""

from __future__ import annotations

import anyio
import pytest

from plugin import (
    AllowancePolicy,
    AttemptOutcome,
    ManualClock,
    RecallAllowance,
    RecallBudgetExceeded,
    RefusalReason,
    RoundKind,
    bind_permits,
    current_permit,
)
from plugin.errors import LedgerCorruptError

from ._fakes import MemoryLedger
from ._loops import VIRTUAL_TIME_LOOPS

pytestmark = pytest.mark.anyio


@pytest.fixture(params=VIRTUAL_TIME_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    """Both loops; trio on an autojumping MockClock (no worker threads here)."""
    return request.param


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall=1_000_000.0, monotonic=50.0)


@pytest.fixture
def allowance(clock: ManualClock) -> RecallAllowance:
    return RecallAllowance(MemoryLedger(), clock=clock)


async def test_a_permit_left_and_past_its_deadline_refuses_as_closed(
    allowance: RecallAllowance, clock: ManualClock
) -> None:
    # Both apply; the implementation's order names the ended phase first: a task that
    # outlived the phase is told its phase ended, whatever the clock says since.
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        pass
    clock.advance(60.0)
    assert permit.closed and permit.expired()
    with pytest.raises(RecallBudgetExceeded) as info:
        async with permit.attempt():
            pytest.fail("a closed permit ran a search")
    assert info.value.refusal.reason is RefusalReason.CLOSED
    with pytest.raises(RecallBudgetExceeded) as info, permit.attempt_sync():
        pytest.fail("a closed permit ran a search")
    assert info.value.refusal.reason is RefusalReason.CLOSED


async def test_a_source_read_after_the_phase_ended_is_refused_as_closed(
    allowance: RecallAllowance,
) -> None:
    # A fallback stays inside its attempt: an attempt that outlives its phase reads no more.
    phase_over = anyio.Event()
    outcome: list[object] = []

    async def outliving_attempt(slot: int) -> None:
        await phase_over.wait()
        try:
            outcome.append(permit.source_read(slot))
        except RecallBudgetExceeded as exc:
            outcome.append(exc.reason)

    async with anyio.create_task_group() as outer:
        async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
            async with permit.attempt() as slot:
                outer.start_soon(outliving_attempt, slot)
        phase_over.set()

    assert outcome == [RefusalReason.CLOSED]


class _UnwritableLedger(MemoryLedger):
    """Reserves, but every trace write fails for good (a failure no later write gets past)."""

    async def record(self, *args: object, **kwargs: object) -> None:
        raise LedgerCorruptError("the ledger's attempts table is damaged")


@pytest.mark.parametrize("holder", [False, True], ids=["contextvar", "run_holder"])
async def test_a_round_whose_traces_cannot_be_written_still_unbinds_its_permit(
    clock: ManualClock, holder: bool
) -> None:
    allowance = RecallAllowance(_UnwritableLedger(), clock=clock)

    async def one_round() -> None:
        with pytest.raises(LedgerCorruptError):  # noqa: PT012 (raised as the round ends)
            async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
                async with permit.attempt():
                    pass
        assert permit.closed
        assert current_permit() is None  # left the phase: nothing bound, even on failure

    if holder:
        with bind_permits():
            await one_round()
    else:
        await one_round()


async def test_a_worker_thread_attempt_that_raises_is_traced_as_an_error(
    allowance: RecallAllowance,
) -> None:
    def tool(permit_slots: list[int]) -> None:
        permit = current_permit()
        assert permit is not None
        with permit.attempt_sync() as slot:
            permit_slots.append(slot)
            raise KeyError("the tool failed")

    taken: list[int] = []
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        with pytest.raises(KeyError):
            await anyio.to_thread.run_sync(tool, taken)
        assert taken == [1] and permit.remaining == 1  # consumed all the same
    (trace,) = await allowance.ledger.attempts("r")
    assert trace.outcome is AttemptOutcome.ERROR


async def test_a_wall_step_back_during_the_checkpoint_does_not_lengthen_the_permit(
    clock: ManualClock,
) -> None:
    # The permit's worker deadline counts from before the reservation: time that passed in
    # the host's checkpoint is spent, even when the wall clock was stepped back meanwhile.
    async def checkpoint(run_id: str, round_index: int) -> None:
        clock.advance(3.0)
        clock.step_wall(-3.0)

    allowance = RecallAllowance(MemoryLedger(), clock=clock, checkpoint=checkpoint)
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        assert permit.seconds_left() == 7.0
        clock.advance(7.0)
        assert permit.expired()


async def test_headroom_is_zero_once_every_round_is_used_with_slots_unreserved(
    clock: ManualClock,
) -> None:
    allowance = RecallAllowance(
        MemoryLedger(), clock=clock, policy=AllowancePolicy(max_searches=4, max_rounds=1)
    )
    async with allowance.round("r", RoundKind.AUTOMATIC):
        pass
    assert await allowance.headroom("r") == 0  # two slots unreserved, but no round left
    assert (await allowance.room("r")).slots == 0
