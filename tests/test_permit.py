"""Permit behaviour on both loops, with virtual time (trio's MockClock and a ManualClock).

The ledger here is the in-memory double (no worker threads), so trio's autojump clock is safe.
"""

from __future__ import annotations

import contextvars
from typing import Any

import anyio
import pytest
import trio.testing

from plugin import (
    AllowancePolicy,
    AttemptKind,
    ManualClock,
    Permit,
    RecallAllowance,
    RecallBudgetExceeded,
    RefusalReason,
    RoundKind,
    current_permit,
)
from plugin.control import AttemptOutcome, bind_permits

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
def ledger() -> MemoryLedger:
    return MemoryLedger()


@pytest.fixture
def allowance(ledger: MemoryLedger, clock: ManualClock) -> RecallAllowance:
    return RecallAllowance(ledger, clock=clock)


async def _refusal_of_an_attempt(permit: Permit) -> RefusalReason:
    """Why ``permit`` refuses one more attempt (it must)."""
    with pytest.raises(RecallBudgetExceeded) as caught:
        async with permit.attempt():
            pass
    return caught.value.refusal.reason


async def test_parallel_attempts_in_a_task_group_take_distinct_slots(
    allowance: RecallAllowance, ledger: MemoryLedger
) -> None:
    taken: list[int] = []
    refused: list[RefusalReason] = []

    async def call() -> None:
        permit = current_permit()
        assert permit is not None
        try:
            async with permit.attempt() as slot:
                await anyio.sleep(0)  # let the other calls interleave inside their attempts
                taken.append(slot)
        except RecallBudgetExceeded as exc:
            refused.append(exc.refusal.reason)

    async with allowance.round("r", RoundKind.DELIBERATE, slots=3) as permit:
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(call)
        assert permit.remaining == 0

    assert sorted(taken) == [1, 2, 3]
    assert refused == [RefusalReason.SLOTS] * 7
    usage = await ledger.usage("r")
    assert (usage.reserved, usage.executed, usage.refused) == (3, 3, 7)


async def test_slots_are_numbered_across_the_run(allowance: RecallAllowance) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC) as first:
        async with first.attempt(AttemptKind.BASE) as a, first.attempt(AttemptKind.DELTA) as b:
            assert (a, b) == (1, 2)
    async with allowance.round("r", RoundKind.DELIBERATE, slots=2) as second:
        async with second.attempt() as c:
            assert c == 3
        assert (second.first_slot, second.slots, second.remaining) == (3, 2, 1)


async def test_permit_is_bound_only_inside_its_phase(allowance: RecallAllowance) -> None:
    assert current_permit() is None
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        assert current_permit() is permit
        assert not permit.closed
    assert current_permit() is None
    assert permit.closed


async def test_child_that_outlives_the_phase_finds_the_permit_closed(
    allowance: RecallAllowance, ledger: MemoryLedger
) -> None:
    phase_over = anyio.Event()
    outcome: list[object] = []

    async def late_child() -> None:
        await phase_over.wait()
        permit = current_permit()  # the value it copied when it was spawned
        assert permit is not None
        try:
            async with permit.attempt():
                outcome.append("searched")
        except RecallBudgetExceeded as exc:
            outcome.append(exc.refusal.reason)

    async with anyio.create_task_group() as outer:
        async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
            outer.start_soon(late_child)  # spawned inside the phase: it copies the permit
            await anyio.sleep(0)
        phase_over.set()

    assert outcome == [RefusalReason.CLOSED]
    assert permit.remaining == 2  # the late child took nothing
    refusals = await ledger.refusals("r")
    assert [(r.what, r.reason) for r in refusals] == [("attempt", RefusalReason.CLOSED)]


async def test_a_copied_context_keeps_the_closed_permit_after_reset(
    allowance: RecallAllowance,
) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC):
        copied = contextvars.copy_context()
    permit = copied.run(current_permit)
    assert permit is not None and permit.closed
    with pytest.raises(RecallBudgetExceeded) as info, copied.run(permit.attempt_sync):
        pass
    assert info.value.refusal.reason is RefusalReason.CLOSED


async def test_run_scoped_holder_reaches_contexts_copied_before_the_round(
    allowance: RecallAllowance,
) -> None:
    # A framework copies the run's context for its tool calls before preparation sets anything;
    # without the holder those tools would see no permit at all.
    seen: list[Permit | None] = []
    round_open = anyio.Event()
    tool_done = anyio.Event()

    async def tool() -> None:
        await round_open.wait()
        seen.append(current_permit())
        tool_done.set()

    async def hook() -> None:
        async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
            seen.append(permit)
            round_open.set()
            await tool_done.wait()

    with bind_permits():
        async with anyio.create_task_group() as tg:
            tg.start_soon(tool)
            tg.start_soon(hook)
    assert seen[0] is not None and seen[1] is seen[0]

    # The same shape without a holder: the tool's context never sees the hook's permit.
    seen.clear()
    round_open = anyio.Event()
    tool_done = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(tool)
        tg.start_soon(hook)
    assert seen[0] is not None and seen[1] is None


async def test_expired_permit_refuses_before_it_is_closed(
    allowance: RecallAllowance, clock: ManualClock
) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        assert permit.seconds_left() == 10.0
        clock.advance(10.0)
        assert permit.expired() and not permit.closed
        assert permit.seconds_left() == 0.0
        with pytest.raises(RecallBudgetExceeded) as info:
            async with permit.attempt():
                pytest.fail("an expired permit ran a search")
        assert info.value.refusal.reason is RefusalReason.DEADLINE
        assert permit.remaining == 2


async def test_wall_clock_stepped_backwards_never_extends_the_permit(
    allowance: RecallAllowance, clock: ManualClock
) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        clock.advance(4.0)
        clock.step_wall(-3600.0)
        assert permit.seconds_left() == 6.0  # the monotonic bound holds
        clock.advance(6.0)
        assert permit.expired()
        assert await _refusal_of_an_attempt(permit) is RefusalReason.DEADLINE


async def test_wall_clock_stepped_forwards_ends_the_permit_early(
    allowance: RecallAllowance, clock: ManualClock
) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        clock.step_wall(7.5)
        assert permit.seconds_left() == 2.5
        clock.step_wall(3.0)
        assert permit.expired()


async def test_a_wall_step_back_while_the_first_round_waits_never_outlives_its_deadline(
    allowance: RecallAllowance, clock: ManualClock, ledger: MemoryLedger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first reservation waits (another process holds the write lock) while the wall
    # clock is stepped back: the run's durable deadline is judged from the stepped-back time,
    # and the permit must end there, whatever it read before the wait.
    reserve = MemoryLedger.reserve

    async def waited(self: MemoryLedger, *args: Any, **kwargs: Any) -> Any:
        clock.step_wall(-100.0)
        return await reserve(self, *args, **kwargs)

    monkeypatch.setattr(MemoryLedger, "reserve", waited)
    async with allowance.round("r", RoundKind.DELIBERATE, slots=2) as permit:
        assert permit.seconds_left() == 10.0
        clock.step_wall(100.0)  # corrected: 90 s past the stored deadline
        assert permit.expired() and permit.seconds_left() == 0.0
        assert await _refusal_of_an_attempt(permit) is RefusalReason.DEADLINE
    assert (await ledger.usage("r")).executed == 0


@pytest.mark.parametrize("seen_by", ["expired", "seconds_left", "attempt"])
async def test_a_permit_seen_expired_stays_expired_when_the_wall_steps_back(
    allowance: RecallAllowance, clock: ManualClock, ledger: MemoryLedger, seen_by: str
) -> None:
    async with allowance.round("r", RoundKind.DELIBERATE, slots=3) as permit:
        clock.step_wall(60.0)  # past the deadline: the permit ends here
        if seen_by == "expired":
            assert permit.expired()
        elif seen_by == "seconds_left":
            assert permit.seconds_left() == 0.0
        else:
            with pytest.raises(RecallBudgetExceeded):
                async with permit.attempt():
                    pass
        clock.step_wall(-60.0)  # the step corrected: it must not revive
        assert permit.expired() and permit.seconds_left() == 0.0
        with pytest.raises(RecallBudgetExceeded) as caught:
            async with permit.attempt():
                pass
        assert caught.value.refusal.reason is RefusalReason.DEADLINE
    assert (await ledger.usage("r")).executed == 0


async def test_second_round_keeps_the_original_deadline(
    allowance: RecallAllowance, clock: ManualClock, ledger: MemoryLedger
) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC):
        pass
    clock.advance(6.0)
    async with allowance.round("r", RoundKind.DELIBERATE, slots=1) as permit:
        assert permit.seconds_left() == 4.0
        assert permit.deadline_wall == 1_000_010.0
    assert (await ledger.usage("r")).deadline_wall == 1_000_010.0


async def test_round_after_the_deadline_is_refused(
    allowance: RecallAllowance, clock: ManualClock, ledger: MemoryLedger
) -> None:
    async with allowance.round("r", RoundKind.DELIBERATE, slots=1):
        pass
    clock.advance(10.0)
    with pytest.raises(RecallBudgetExceeded) as info:
        async with allowance.round("r", RoundKind.DELIBERATE, slots=1):
            pytest.fail("a round ran after the deadline")
    assert info.value.refusal.reason is RefusalReason.DEADLINE
    usage = await ledger.usage("r")
    assert (usage.rounds, usage.refused) == (1, 1)


async def test_wall_step_back_between_rounds_does_not_reopen_the_deadline(
    allowance: RecallAllowance, clock: ManualClock
) -> None:
    async with allowance.round("r", RoundKind.DELIBERATE, slots=1):
        pass
    clock.advance(10.0)
    clock.step_wall(-60.0)  # the wall clock says 50 s are left; the worker clock knows better
    with pytest.raises(RecallBudgetExceeded) as info:
        async with allowance.round("r", RoundKind.DELIBERATE, slots=1):
            pass
    assert info.value.refusal.reason is RefusalReason.DEADLINE


async def test_in_flight_attempt_is_cancelled_at_the_deadline_and_stays_consumed(
    allowance: RecallAllowance, clock: ManualClock, ledger: MemoryLedger
) -> None:
    never = anyio.Event()
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        clock.advance(9.995)  # 5 ms left; on trio the MockClock jumps there at once
        with pytest.raises(RecallBudgetExceeded) as info:
            async with permit.attempt(AttemptKind.BASE) as slot:
                await never.wait()
        assert info.value.refusal.reason is RefusalReason.DEADLINE
        assert slot == 1
        assert permit.remaining == 1
    traces = await ledger.attempts("r")
    assert [(t.slot, t.outcome) for t in traces] == [(1, AttemptOutcome.DEADLINE)]
    assert (await ledger.usage("r")).executed == 1


@pytest.mark.trio
async def test_full_deadline_in_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    clock = ManualClock()
    allowance = RecallAllowance(MemoryLedger(), clock=clock)
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        start = trio.current_time()
        with pytest.raises(RecallBudgetExceeded):
            async with permit.attempt():
                await trio.sleep_forever()
        assert trio.current_time() - start == pytest.approx(10.0)


async def test_attempt_in_a_nursery_outside_the_phase_has_its_own_deadline(
    allowance: RecallAllowance, clock: ManualClock
) -> None:
    # The phase's scope does not cover tasks started in a nursery that outlives it; each
    # attempt's own cancel scope does.
    results: list[object] = []
    started = anyio.Event()

    async def search(permit: Permit) -> None:
        try:
            async with permit.attempt():
                started.set()
                await anyio.Event().wait()
        except RecallBudgetExceeded as exc:
            results.append(exc.refusal.reason)

    async with anyio.create_task_group() as outer:
        async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
            clock.advance(9.99)
            outer.start_soon(search, permit)
            await started.wait()
    assert results == [RefusalReason.DEADLINE]


async def test_outside_cancellation_is_recorded_and_the_slot_stays_consumed(
    allowance: RecallAllowance, ledger: MemoryLedger
) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        with anyio.CancelScope() as scope:
            async with permit.attempt():
                scope.cancel()
                await anyio.sleep(1)
        assert scope.cancelled_caught
        assert permit.remaining == 1
    (trace,) = await ledger.attempts("r")
    assert trace.outcome is AttemptOutcome.CANCELLED


async def test_failed_attempt_stays_consumed(
    allowance: RecallAllowance, ledger: MemoryLedger
) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        with pytest.raises(KeyError):
            async with permit.attempt():
                raise KeyError("boom")
        assert permit.remaining == 1
    (trace,) = await ledger.attempts("r")
    assert trace.outcome is AttemptOutcome.ERROR
    usage = await ledger.usage("r")
    assert (usage.reserved, usage.executed) == (2, 1)


async def test_nested_read_takes_a_slot_and_is_refused_when_none_is_free(
    allowance: RecallAllowance,
) -> None:
    async with allowance.round("r", RoundKind.DELIBERATE, slots=2) as permit:
        async with permit.attempt() as outer:
            async with permit.attempt(AttemptKind.NESTED) as nested:
                assert (outer, nested) == (1, 2)
            with pytest.raises(RecallBudgetExceeded) as info:
                async with permit.attempt(AttemptKind.NESTED):
                    pytest.fail("a nested read ran without a slot")
            assert info.value.refusal.reason is RefusalReason.SLOTS


async def test_source_read_fallbacks_stay_inside_the_attempt(
    allowance: RecallAllowance, clock: ManualClock
) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        async with permit.attempt() as slot:
            assert permit.source_read(slot) == 1
            assert permit.source_read(slot) == 2
            assert permit.remaining == 1  # no new slot
            with pytest.raises(RecallBudgetExceeded) as info:
                permit.source_read(slot)
            assert info.value.refusal.reason is RefusalReason.SOURCE_READS
        refusals: list[RefusalReason] = []
        try:
            async with permit.attempt() as other:
                clock.advance(10.0)
                try:
                    permit.source_read(other)  # same deadline as its attempt
                except RecallBudgetExceeded as exc:
                    refusals.append(exc.reason)
        except RecallBudgetExceeded as exc:  # the body returned past the deadline
            refusals.append(exc.reason)
        assert refusals == [RefusalReason.DEADLINE, RefusalReason.DEADLINE]
        with pytest.raises(ValueError, match="not taken"):
            permit.source_read(99)


async def test_close_is_idempotent_and_final(allowance: RecallAllowance) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        permit.close()
        permit.close()
        assert permit.closed
        with pytest.raises(RecallBudgetExceeded) as info:
            async with permit.attempt():
                pass
        assert info.value.refusal.reason is RefusalReason.CLOSED
    permit.close()
    assert permit.closed and permit.remaining == 2


async def test_a_round_is_entered_once(allowance: RecallAllowance) -> None:
    round_ = allowance.round("r", RoundKind.AUTOMATIC)
    async with round_:
        pass
    with pytest.raises(RuntimeError, match="entered once"):
        async with round_:
            pass


async def test_automatic_round_gets_what_is_left(clock: ManualClock) -> None:
    policy = AllowancePolicy(max_searches=3, max_rounds=3, automatic_slots=2)
    allowance = RecallAllowance(MemoryLedger(), policy=policy, clock=clock)
    async with allowance.round("r", RoundKind.AUTOMATIC) as first:
        assert first.slots == 2
    async with allowance.round("r", RoundKind.AUTOMATIC) as second:
        assert (second.slots, second.first_slot) == (1, 3)
    with pytest.raises(RecallBudgetExceeded) as info:
        async with allowance.round("r", RoundKind.AUTOMATIC):
            pass
    assert info.value.refusal.reason is RefusalReason.SLOTS


async def test_deliberate_round_with_more_calls_than_slots_reserves_what_is_left(
    allowance: RecallAllowance, ledger: MemoryLedger
) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC):
        pass
    async with allowance.round("r", RoundKind.DELIBERATE, slots=6) as permit:
        assert permit.slots == 2
    usage = await ledger.usage("r")
    assert (usage.rounds, usage.reserved) == (2, 4)


async def test_rounds_beyond_the_maximum_are_refused_and_not_counted(
    allowance: RecallAllowance, ledger: MemoryLedger
) -> None:
    for _ in range(2):
        async with allowance.round("r", RoundKind.DELIBERATE, slots=1):
            pass
    with pytest.raises(RecallBudgetExceeded) as info:
        async with allowance.round("r", RoundKind.DELIBERATE, slots=1):
            pass
    refusal = info.value.refusal
    assert (refusal.reason, refusal.reserved, refusal.run_id) == (RefusalReason.ROUNDS, 2, "r")
    usage = await ledger.usage("r")
    assert (usage.rounds, usage.reserved, usage.refused) == (2, 2, 1)


async def test_checkpoint_runs_after_commit_and_before_the_permit(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    seen: list[tuple[str, int, int, object]] = []

    async def checkpoint(run_id: str, round_index: int) -> None:
        seen.append((run_id, round_index, (await ledger.usage(run_id)).reserved,
                     current_permit()))

    allowance = RecallAllowance(ledger, clock=clock, checkpoint=checkpoint)
    async with allowance.round("r", RoundKind.AUTOMATIC):
        pass
    assert seen == [("r", 1, 2, None)]


async def test_failed_checkpoint_issues_no_permit_and_keeps_the_slots(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    async def checkpoint(run_id: str, round_index: int) -> None:
        raise OSError("host checkpoint store is down")

    allowance = RecallAllowance(ledger, clock=clock, checkpoint=checkpoint)
    with pytest.raises(OSError, match="checkpoint store"):
        async with allowance.round("r", RoundKind.AUTOMATIC):
            pytest.fail("a permit was issued without a checkpoint")
    assert current_permit() is None
    assert (await ledger.usage("r")).reserved == 2


async def test_ledger_failure_fails_closed(ledger: MemoryLedger, clock: ManualClock) -> None:
    from plugin.errors import LedgerLockedError

    ledger.fail_reserve = LedgerLockedError("locked")
    allowance = RecallAllowance(ledger, clock=clock)
    with pytest.raises(LedgerLockedError):
        async with allowance.round("r", RoundKind.AUTOMATIC):
            pytest.fail("a permit was issued without a committed reservation")
    assert current_permit() is None


async def test_legacy_mode_is_explicit_unbounded_and_marked(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    allowance = RecallAllowance.legacy(ledger, clock=clock)
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        assert permit.legacy and permit.seconds_left() == float("inf")
        for _ in range(10):
            async with permit.attempt():
                pass
        clock.advance(3600.0)
        async with permit.attempt():
            pass
    traces = await ledger.attempts("r")
    assert len(traces) == 11 and all(t.legacy for t in traces)
    usage = await ledger.usage("r")
    assert (usage.rounds, usage.reserved, usage.executed, usage.legacy_attempts) == (0, 0, 0, 11)


async def test_attempt_trace_carries_strategy_and_fingerprint(
    allowance: RecallAllowance, ledger: MemoryLedger, clock: ManualClock
) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        async with permit.attempt(AttemptKind.BASE, strategy="task_context", fingerprint="ab"):
            clock.advance(0.25)
    (trace,) = await ledger.attempts("r")
    assert (trace.kind, trace.strategy, trace.fingerprint) == ("base", "task_context", "ab")
    assert (trace.round_index, trace.slot, trace.outcome) == (1, 1, AttemptOutcome.OK)
    assert trace.elapsed_s == pytest.approx(0.25)
    assert trace.started_wall == 1_000_000.0


async def test_the_allowance_knows_what_its_own_rounds_left_without_a_read(
    anyio_backend: object,
) -> None:
    from plugin.control.allowance import Room

    from ._fakes import MemoryLedger

    allowance = RecallAllowance(MemoryLedger(), clock=ManualClock(wall=100.0, monotonic=0.0))
    assert allowance.known_room("run") is None
    assert allowance.fresh_room() == Room(slots=4, rounds=2)
    async with allowance.round("run", RoundKind.DELIBERATE, slots=3):
        pass
    assert allowance.known_room("run") == Room(slots=1, rounds=1, deadline_wall=110.0)
    assert await allowance.room("run") == Room(slots=1, rounds=1, deadline_wall=110.0)
    async with allowance.round("run", RoundKind.DELIBERATE, slots=3):
        pass
    assert allowance.known_room("run") == Room(slots=0, rounds=0, deadline_wall=110.0)
    with pytest.raises(RecallBudgetExceeded):
        async with allowance.round("run", RoundKind.DELIBERATE, slots=1):
            pass
    assert allowance.known_room("run") == Room(slots=0, rounds=0)
    assert await allowance.headroom("run") == 0


async def test_one_attempt_object_entered_twice_takes_no_second_slot() -> None:
    """Two tasks entering the same ``permit.attempt()`` object would share its cancel scope
    (a corrupted scope stack): the second entry is refused, typed, before taking a slot."""
    from plugin.errors import RoundReusedError

    clock = ManualClock(wall=1_800_000_000.0, monotonic=10.0)
    allowance = RecallAllowance(MemoryLedger(), clock=clock)
    async with allowance.round("r", RoundKind.DELIBERATE, slots=3) as permit:
        attempt = permit.attempt()
        async with attempt as slot:
            with pytest.raises(RoundReusedError):
                async with attempt:
                    pass
        with pytest.raises(RoundReusedError):
            async with attempt:
                pass
        assert (slot, permit.remaining) == (1, 2)


async def test_a_refusal_counts_the_attempts_of_every_open_round_of_the_run() -> None:
    """Run-wide totals at the moment of refusal: with two rounds of a run open at once, each
    refusal counts the other's attempts too (the ledger learns of them only at round ends)."""
    clock = ManualClock(wall=1_800_000_000.0, monotonic=10.0)
    allowance = RecallAllowance(MemoryLedger(), clock=clock,
                                policy=AllowancePolicy(max_searches=4, max_rounds=2))
    async with allowance.round("r", RoundKind.DELIBERATE, slots=1) as first:
        async with first.attempt():
            pass
        async with allowance.round("r", RoundKind.DELIBERATE, slots=2) as second:
            for _ in range(2):
                async with second.attempt():
                    pass
            with pytest.raises(RecallBudgetExceeded) as refused_round:
                async with allowance.round("r", RoundKind.DELIBERATE, slots=2):
                    pass
        with pytest.raises(RecallBudgetExceeded) as refused_attempt:
            async with first.attempt():
                pass
    round_refusal = refused_round.value.refusal
    assert (round_refusal.reason, round_refusal.reserved, round_refusal.executed) == (
        RefusalReason.ROUNDS, 3, 3)
    refusal = refused_attempt.value.refusal
    assert (refusal.reason, refusal.reserved, refusal.executed) == (RefusalReason.SLOTS, 3, 3)


@pytest.mark.parametrize("field", ["slots", "first_slot", "run_id", "round_index", "kind",
                                   "legacy"])
async def test_a_permits_grant_cannot_be_reassigned(
    allowance: RecallAllowance, ledger: MemoryLedger, field: str
) -> None:
    # One assignment to a public name must not extend the permit past its reservation (50
    # attempts of a one-slot round) nor renumber its slots.
    async with allowance.round("r", RoundKind.DELIBERATE, slots=1) as permit:
        with pytest.raises(AttributeError):
            setattr(permit, field, 50)
        async with permit.attempt() as slot:
            assert slot == 1
        assert await _refusal_of_an_attempt(permit) is RefusalReason.SLOTS
    assert (await ledger.usage("r")).executed == 1


async def test_a_body_running_when_the_wall_clock_steps_past_the_deadline_leaves_as_deadline(
    allowance: RecallAllowance, ledger: MemoryLedger, clock: ManualClock
) -> None:
    # No cancel scope follows the wall clock, so the body runs on; what it returns is late.
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        with pytest.raises(RecallBudgetExceeded) as caught:  # noqa: PT012 (raised at its end)
            async with permit.attempt(AttemptKind.BASE):
                clock.step_wall(60.0)
                await anyio.sleep(0)
        assert caught.value.refusal.reason is RefusalReason.DEADLINE
        assert await _refusal_of_an_attempt(permit) is RefusalReason.DEADLINE
    (trace,) = await ledger.attempts("r")
    assert trace.outcome is AttemptOutcome.DEADLINE


async def test_an_orphan_attempt_after_the_ledger_closed_is_refused_as_closed(
    allowance: RecallAllowance, ledger: MemoryLedger
) -> None:
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        pass
    await ledger.__aexit__(None, None, None)  # the host shut down; a task kept the permit
    assert await _refusal_of_an_attempt(permit) is RefusalReason.CLOSED


async def test_a_refusals_message_says_the_totals_it_carries(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    # The ledger has not yet seen the attempts of a round still open in this process: the
    # refusal counts them, and so must the words the model reads.
    allowance = RecallAllowance(ledger, policy=AllowancePolicy(max_rounds=1), clock=clock)
    async with allowance.round("r", RoundKind.DELIBERATE, slots=3) as permit:
        for _ in range(3):
            async with permit.attempt():
                pass
        with pytest.raises(RecallBudgetExceeded) as caught:
            async with allowance.round("r", RoundKind.DELIBERATE, slots=1):
                pass
    refusal = caught.value.refusal
    assert (refusal.reserved, refusal.executed) == (3, 3)
    assert "(3 searches reserved, 3 executed)" in refusal.message
