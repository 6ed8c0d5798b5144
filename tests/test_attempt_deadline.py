"""An attempt whose body swallows its deadline's cancellation still leaves as DEADLINE.

The permit's clock here is a ManualClock that never moves: only the attempt's cancel scope
(loop time: trio's MockClock, or asyncio's real clock) sees the deadline pass. The ledger is
the in-memory double (no worker threads), so trio's autojump clock is safe.
"""

from __future__ import annotations

import anyio
import pytest

from plugin import (
    AllowancePolicy,
    AttemptKind,
    ManualClock,
    Permit,
    RecallAllowance,
    RecallBudgetExceeded,
    RefusalReason,
    RoundKind,
)
from plugin.control import AttemptOutcome

from ._fakes import MemoryLedger
from ._loops import VIRTUAL_TIME_LOOPS

pytestmark = pytest.mark.anyio


@pytest.fixture(params=VIRTUAL_TIME_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


async def test_a_body_that_swallows_the_deadline_cancel_leaves_as_deadline() -> None:
    ledger = MemoryLedger()
    allowance = RecallAllowance(
        ledger, policy=AllowancePolicy(deadline_s=0.05), clock=ManualClock()
    )
    late: list[str] = []

    async def swallowing(permit: Permit) -> None:
        async with permit.attempt(AttemptKind.BASE):
            try:
                await anyio.sleep(3600)
            except anyio.get_cancelled_exc_class():
                pass  # a hostile body: it swallows the cancellation and answers late
            late.append("answered")

    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        with pytest.raises(RecallBudgetExceeded) as caught:
            await swallowing(permit)
        assert caught.value.refusal.reason is RefusalReason.DEADLINE
    assert late == ["answered"]
    traces = await ledger.attempts("r")
    assert [(t.slot, t.outcome) for t in traces] == [(1, AttemptOutcome.DEADLINE)]
    usage = await ledger.usage("r")
    assert (usage.reserved, usage.executed) == (2, 1)


async def test_a_body_that_ends_before_the_deadline_is_ok() -> None:
    ledger = MemoryLedger()
    allowance = RecallAllowance(
        ledger, policy=AllowancePolicy(deadline_s=0.05), clock=ManualClock()
    )
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        async with permit.attempt(AttemptKind.BASE):
            await anyio.sleep(0)
    traces = await ledger.attempts("r")
    assert [t.outcome for t in traces] == [AttemptOutcome.OK]


async def _cut_at_the_deadline(permit: Permit) -> None:
    async with permit.attempt():
        await anyio.sleep(3600)


async def test_a_permit_whose_attempt_was_cut_at_the_deadline_stays_expired() -> None:
    ledger = MemoryLedger()
    allowance = RecallAllowance(
        ledger, policy=AllowancePolicy(deadline_s=0.05), clock=ManualClock()
    )
    async with allowance.round("r", RoundKind.DELIBERATE, slots=2) as permit:
        with pytest.raises(RecallBudgetExceeded) as cut:
            await _cut_at_the_deadline(permit)
        assert cut.value.refusal.reason is RefusalReason.DEADLINE
        assert permit.expired()
        assert permit.seconds_left() == 0.0
        # No second slot with a fresh deadline: the permit is not renewed.
        with pytest.raises(RecallBudgetExceeded) as refused:
            await _cut_at_the_deadline(permit)
        assert refused.value.refusal.reason is RefusalReason.DEADLINE
        assert permit.remaining == 1
    usage = await ledger.usage("r")
    assert (usage.reserved, usage.executed, usage.refused) == (2, 1, 1)
