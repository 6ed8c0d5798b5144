"""Attacks on the enforcement boundary's control half.

Each test is an attack a hostile tool author, a stepped clock or a busy database would make:
a copied or forged permit, a round entered twice, a wall clock stepped at the worst moment, a
lock held past the deadline, a trace write that fails, and values that used to escape as
builtin errors. The ledger is the in-memory double (virtual time on both loops) unless the
attack needs a real SQLite lock.
"""

from __future__ import annotations

import copy
import math
import pickle
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
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
    SqliteLedger,
)
from plugin.control import AttemptTrace, RefusalRecord, _sqlite
from plugin.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LedgerClosedError,
    LedgerFullError,
    LedgerLockedError,
    LedgerUnavailableError,
    RecallboundError,
    RoundReusedError,
)

from ._fakes import MemoryLedger
from ._loops import VIRTUAL_TIME_LOOPS

pytestmark = pytest.mark.anyio

WALL = 1_000_000.0
DELIB = RoundKind.DELIBERATE


@pytest.fixture(params=VIRTUAL_TIME_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall=WALL, monotonic=50.0)


@pytest.fixture
def ledger() -> MemoryLedger:
    return MemoryLedger()


@pytest.fixture
def allowance(ledger: MemoryLedger, clock: ManualClock) -> RecallAllowance:
    return RecallAllowance(ledger, clock=clock)


# -- a permit is one object --------------------------------------------------------------------

COPIES: list[tuple[str, Callable[[Permit], object]]] = [
    ("copy", copy.copy),
    ("deepcopy", copy.deepcopy),
    ("pickle", pickle.dumps),
    ("reduce_ex", lambda p: p.__reduce_ex__(2)),
    ("reduce", lambda p: p.__reduce__()),
    ("evolve", attrs.evolve),
    ("evolve_more_slots", lambda p: attrs.evolve(p, slots=50)),
]


@pytest.mark.parametrize(("name", "make_copy"), COPIES, ids=[name for name, _ in COPIES])
async def test_a_permit_cannot_be_copied(
    allowance: RecallAllowance,
    ledger: MemoryLedger,
    name: str,
    make_copy: Callable[[Permit], object],
) -> None:
    async with allowance.round("r", DELIB, slots=2) as permit:
        with pytest.raises(TypeError):  # no public constructor; no copy, no pickle
            make_copy(permit)
        async with permit.attempt():
            pass
        async with permit.attempt():
            pass
        with pytest.raises(RecallBudgetExceeded):
            async with permit.attempt():
                pass
    usage = await ledger.usage("r")
    assert (usage.reserved, usage.executed) == (2, 2)


async def test_a_permit_built_by_hand_is_refused(clock: ManualClock) -> None:
    with pytest.raises(TypeError):
        Permit(
            run_id="r", round_index=1, kind=DELIB, slots=9, first_slot=1, legacy=False,
            clock=clock, ledger=MemoryLedger(), deadline_wall=math.inf, expires_wall=math.inf,
            issued_mono=0.0, left_at_issue=math.inf, source_reads_limit=2, reserved_total=9,
            executed_before=0,
        )


async def test_one_round_entered_by_two_tasks_reserves_once(
    allowance: RecallAllowance, ledger: MemoryLedger
) -> None:
    shared = allowance.round("r", DELIB, slots=1)
    outcomes: list[str] = []
    permits: list[Permit] = []

    async def enter() -> None:
        try:
            async with shared as permit:
                permits.append(permit)
                await anyio.sleep(0)
                outcomes.append("entered")
        except RoundReusedError:
            outcomes.append("refused")

    async with anyio.create_task_group() as tg:
        tg.start_soon(enter)
        tg.start_soon(enter)
    assert sorted(outcomes) == ["entered", "refused"]
    assert (await ledger.usage("r")).rounds == 1
    assert all(permit.closed for permit in permits)
    with pytest.raises(RoundReusedError):
        copy.copy(allowance.round("r", DELIB, slots=1))


# -- deadlines that must not move ----------------------------------------------------------------


async def test_a_wall_step_back_in_the_checkpoint_gives_no_extra_time(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    async def checkpoint(run_id: str, round_index: int) -> None:
        clock.step_wall(-1000.0)

    allowance = RecallAllowance(ledger, clock=clock, checkpoint=checkpoint)
    async with allowance.round("r", DELIB, slots=2) as permit:
        assert permit.seconds_left() == pytest.approx(10.0)
        clock.advance(10.0)
        assert permit.expired()
        with pytest.raises(RecallBudgetExceeded) as info:
            async with permit.attempt():
                pass
        assert info.value.refusal.reason is RefusalReason.DEADLINE


async def test_the_wall_step_guard_holds_when_the_first_checkpoint_failed(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    async def failing(run_id: str, round_index: int) -> None:
        raise RuntimeError("host could not checkpoint")

    with pytest.raises(RuntimeError):
        async with RecallAllowance(ledger, clock=clock, checkpoint=failing).round("r", DELIB,
                                                                                  slots=1):
            pass
    clock.advance(11.0)
    clock.step_wall(-60.0)  # the wall now reads before the deadline again
    with pytest.raises(RecallBudgetExceeded) as info:
        async with RecallAllowance(ledger, clock=clock).round("r", DELIB, slots=1):
            pass
    assert info.value.refusal.reason is RefusalReason.DEADLINE


async def test_the_wall_step_guard_is_shared_by_every_allowance_in_the_process(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    async with RecallAllowance(ledger, clock=clock).round("r", DELIB, slots=1):
        pass
    clock.advance(70.0)  # 60 s past the deadline ...
    clock.step_wall(-65.0)  # ... and the wall clock stepped back to before it
    other = RecallAllowance(ledger, clock=clock)
    with pytest.raises(RecallBudgetExceeded) as info:
        async with other.round("r", DELIB, slots=1):
            pass
    assert info.value.refusal.reason is RefusalReason.DEADLINE
    assert (await ledger.usage("r")).rounds == 1


@attrs.define
class _SlowLedger:
    """A ledger whose write lock is held by someone else until ``release`` is set."""

    inner: MemoryLedger
    release: anyio.Event = attrs.Factory(anyio.Event)
    waiting: anyio.Event = attrs.Factory(anyio.Event)

    async def reserve(self, *args: Any, **options: Any) -> Any:
        self.waiting.set()
        await self.release.wait()
        return await self.inner.reserve(*args, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_round_that_waits_for_the_lock_past_the_deadline_is_refused(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    async with RecallAllowance(ledger, clock=clock).round("r", DELIB, slots=1):
        pass
    slow = _SlowLedger(ledger)
    outcome: list[object] = []

    async def second_round() -> None:
        try:
            async with RecallAllowance(slow, clock=clock).round("r", DELIB, slots=1) as p:
                outcome.append(p)
        except RecallBudgetExceeded as exc:
            outcome.append(exc.refusal.reason)

    async with anyio.create_task_group() as tg:
        tg.start_soon(second_round)
        await slow.waiting.wait()
        clock.advance(10.5)  # the deadline passes while the round waits for the lock
        slow.release.set()
    assert outcome == [RefusalReason.DEADLINE]
    assert (await ledger.usage("r")).reserved == 1


# -- typed errors at the boundary -----------------------------------------------------------------


async def test_out_of_range_counts_are_typed_errors(allowance: RecallAllowance) -> None:
    for huge in (2**31, 2**63, 10**30):
        with pytest.raises(InvalidArgumentError):
            allowance.round("r", DELIB, slots=huge)
        with pytest.raises(InvalidArgumentError):
            AllowancePolicy(max_searches=huge)
    with pytest.raises(InvalidArgumentError):
        AllowancePolicy(deadline_s=1e300)
    with pytest.raises(InvalidArgumentError):
        allowance.round("r", DELIB, slots=0)


@pytest.mark.parametrize("slots", [0.5, 1.0, 2.0, True, float("nan")])
async def test_slots_that_are_no_count_are_a_value_error_like_the_policys(
    allowance: RecallAllowance, slots: object
) -> None:
    """A number below 1, or one that is not a whole count, is a bad value (``ValueError``), as
    it is in :class:`AllowancePolicy`; a value that is not a number is a ``TypeError``."""
    with pytest.raises(InvalidArgumentError, match="slots must be an int"):
        allowance.round("r", DELIB, slots=slots)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        AllowancePolicy(max_searches=slots)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        allowance.round("r", DELIB, slots="2")  # type: ignore[arg-type]
    assert (await allowance.ledger.usage("r")).reserved == 0


@pytest.mark.parametrize("value", ["false", "0", "no", 0, 1, None])
def test_legacy_needs_a_real_bool(value: object) -> None:
    with pytest.raises(RecallboundError):
        RecallAllowance(MemoryLedger(), is_legacy=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("given", [{"clock": None}, {"clock": object()}, {"clock": "system"},
                                   {"checkpoint": "x"}, {"checkpoint": 42}])
async def test_a_bad_clock_or_checkpoint_is_refused_before_anything_is_reserved(
    given: dict[str, object],
) -> None:
    ledger = MemoryLedger()
    with pytest.raises(InvalidArgumentTypeError):
        RecallAllowance(ledger, **given)  # type: ignore[arg-type]
    assert (await ledger.usage("r")).reserved == 0


@pytest.mark.parametrize("timeout", [-1.0, math.nan, math.inf, 1e9, "5", True, None])
def test_invalid_ledger_timeouts_are_typed_errors(tmp_path: Path, timeout: object) -> None:
    expected = InvalidArgumentError if isinstance(timeout, float) else TypeError
    with pytest.raises(expected) as info:
        SqliteLedger(tmp_path / "l.db", timeout=timeout)  # type: ignore[arg-type]
    assert isinstance(info.value, RecallboundError)


# -- traces: kept until they commit, and never in place of the body's error ----------------------


@attrs.define
class _FlakyRecords:
    """A ledger whose trace writes fail ``failures`` times with ``error`` before they work."""

    inner: MemoryLedger
    failures: int
    error: Callable[[], BaseException] = lambda: LedgerLockedError("busy")
    calls: int = 0

    async def record(
        self, attempts: Sequence[AttemptTrace], refusals: Sequence[RefusalRecord]
    ) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise self.error()
        await self.inner.record(attempts, refusals)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize(("late", "tries"), [(False, 3), (True, 1)])
async def test_a_transient_trace_write_failure_loses_no_trace(
    ledger: MemoryLedger, clock: ManualClock, late: bool, tries: int
) -> None:
    # A write that found the ledger locked is tried twice more, never past the run's deadline:
    # each try may wait lock_timeout, and the round's work is done. What is not written then
    # is owed, not lost.
    flaky = _FlakyRecords(ledger, failures=2)
    allowance = RecallAllowance(flaky, clock=clock)
    async with allowance.round("r", DELIB, slots=3) as permit:
        for _ in range(3):
            async with permit.attempt():
                pass
        if late:
            clock.advance(11.0)  # the round ends past the run's 10 s
    assert flaky.calls == tries
    flaky.failures = 0
    await allowance.flush()
    usage = await ledger.usage("r")
    assert (usage.reserved, usage.executed) == (3, 3)


@attrs.define
class _LostAcknowledgements(_FlakyRecords):
    """A ledger whose trace writes commit, then fail ``failures`` times as if the connection
    was lost before the commit's acknowledgement came back."""

    async def record(
        self, attempts: Sequence[AttemptTrace], refusals: Sequence[RefusalRecord]
    ) -> None:
        self.calls += 1
        await self.inner.record(attempts, refusals)
        if self.failures > 0:
            self.failures -= 1
            raise self.error()


async def test_a_refusal_whose_write_was_not_acknowledged_counts_once(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    lost = _LostAcknowledgements(ledger, failures=5,
                                 error=lambda: LedgerUnavailableError("connection lost"))
    allowance = RecallAllowance(lost, clock=clock)
    async with allowance.round("r", DELIB, slots=1) as permit:
        async with permit.attempt():
            pass
        for _ in range(2):
            with pytest.raises(RecallBudgetExceeded):
                async with permit.attempt():
                    pass
    lost.failures = 0
    await allowance.flush()  # the owed records, written again
    usage = await ledger.usage("r")
    assert (usage.executed, usage.refused) == (1, 2)
    assert len({refusal.key for refusal in await ledger.refusals("r")}) == 2


async def test_traces_stay_buffered_until_a_later_write_commits(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    flaky = _FlakyRecords(ledger, failures=10)
    allowance = RecallAllowance(flaky, clock=clock)
    async with allowance.round("r", DELIB, slots=2) as permit:
        async with permit.attempt():
            pass
        async with permit.attempt():
            pass
    # the round answered; its traces are owed, not lost
    assert (await ledger.usage("r")).executed == 0
    with pytest.raises(LedgerLockedError):
        await allowance.flush()
    flaky.failures = 0
    await permit.flush()
    assert (await ledger.usage("r")).executed == 2
    await allowance.flush()  # what the permit wrote is not written again
    assert len(await ledger.attempts("r")) == 2


async def test_a_closed_ledger_does_not_replace_the_bodys_exception(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    flaky = _FlakyRecords(ledger, failures=1, error=lambda: LedgerClosedError("closed"))

    async def failing_body() -> None:
        async with RecallAllowance(flaky, clock=clock).round("r", DELIB, slots=1) as permit:
            async with permit.attempt(AttemptKind.DELIBERATE):
                pass
            raise ValueError("the body's own failure")

    with pytest.raises(ValueError, match="the body's own failure") as info:
        await failing_body()
    assert any("LedgerClosedError" in note for note in getattr(info.value, "__notes__", []))


# -- SQLite: a real lock, a real journal-mode switch, a full disk ----------------------------------


class TestSqlite:
    """Attacks that need a real SQLite file (worker threads: real time, a ManualClock)."""

    @pytest.fixture(params=["asyncio", "trio"])
    def anyio_backend(self, request: pytest.FixtureRequest) -> object:
        return request.param

    async def test_a_round_that_waits_for_the_write_lock_is_judged_after_the_wait(
        self, tmp_path: Path, clock: ManualClock
    ) -> None:
        path = tmp_path / "ledger.db"
        async with SqliteLedger(path, timeout=10.0) as ledger:
            allowance = RecallAllowance(ledger, clock=clock)
            async with allowance.round("r", DELIB, slots=1):
                pass
            holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            holder.execute("BEGIN IMMEDIATE")
            outcome: list[object] = []

            async def second_round() -> None:
                try:
                    async with allowance.round("r", DELIB, slots=1) as permit:
                        outcome.append(permit)
                except RecallBudgetExceeded as exc:
                    outcome.append(exc.refusal.reason)

            async with anyio.create_task_group() as tg:
                tg.start_soon(second_round)
                await anyio.sleep(0.3)  # a sync point, not a timing: the round is waiting
                assert outcome == []
                clock.advance(11.0)
                holder.execute("COMMIT")
            holder.close()
            assert outcome == [RefusalReason.DEADLINE]
            assert (await ledger.usage("r")).reserved == 1

    async def test_a_journal_mode_switch_blocked_by_a_reader_is_a_locked_ledger(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "ledger.db"
        reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        reader.execute("CREATE TABLE keep_rollback_mode (x)")
        reader.execute("DROP TABLE keep_rollback_mode")
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM sqlite_schema").fetchall()  # holds a read lock
        try:
            with pytest.raises(LedgerLockedError, match="locked"):
                async with SqliteLedger(path, timeout=0.2):
                    pass
        finally:
            reader.execute("COMMIT")
            reader.close()

    async def test_a_full_disk_says_so(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        connect = _sqlite.connect

        async def tiny(path: Any, *, timeout: float) -> _sqlite.Connection:
            conn = await connect(path, timeout=timeout)
            await conn.fetchall("PRAGMA max_page_count = 2")  # as good as a full disk
            return conn

        monkeypatch.setattr(_sqlite, "connect", tiny)
        with pytest.raises(LedgerFullError, match="full"):
            async with SqliteLedger(tmp_path / "ledger.db"):
                pass


def test_the_process_wide_anchors_stay_within_their_cap() -> None:
    from plugin.control.allowance import _Anchors

    anchors = _Anchors()
    anchors.limit = 100
    clock = ManualClock(wall=WALL, monotonic=0.0)
    for i in range(1000):
        anchors.observe(clock, f"run-{i}", WALL + i, 0.0)
    assert len(anchors._offsets) == 100
    assert anchors.floor(clock, "run-0") == -math.inf  # the oldest are forgotten first
    assert anchors.floor(clock, "run-999") == WALL + 999
    clock.advance(5.0)
    assert anchors.floor(clock, "run-999") == WALL + 1004  # the monotonic time that passed
    anchors.observe(clock, "run-999", WALL + 900, 5.0)  # an older judgement never lowers it
    assert anchors.floor(clock, "run-999") == WALL + 1004


@attrs.define
class _SlowRecords:
    """A ledger whose trace writes yield to other tasks before they commit."""

    inner: MemoryLedger

    async def record(
        self, attempts: Sequence[AttemptTrace], refusals: Sequence[RefusalRecord]
    ) -> None:
        await anyio.sleep(0)
        await anyio.sleep(0)
        await self.inner.record(attempts, refusals)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_concurrent_flushes_write_each_record_once_and_lose_none(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    allowance = RecallAllowance(_SlowRecords(ledger), clock=clock)
    async with allowance.round("r", DELIB, slots=1) as permit:
        async with permit.attempt():
            pass
        with pytest.raises(RecallBudgetExceeded):
            async with permit.attempt():  # a refused attempt: one refusal record
                pass

        async def refuse_then_flush() -> None:
            with pytest.raises(RecallBudgetExceeded):
                async with permit.attempt():
                    pass
            await permit.flush()

        async with anyio.create_task_group() as tg:
            tg.start_soon(permit.flush)
            tg.start_soon(permit.flush)
            tg.start_soon(refuse_then_flush)
    refused = [r for r in await ledger.refusals("r") if r.what == "attempt"]
    assert len(refused) == 2  # each refusal written exactly once, none dropped
    assert (await ledger.usage("r")).executed == 1


# -- clock and cancellation edges -----------------------------------------------------------------


@attrs.define(eq=False)
class _GlitchingClock:
    """A clock whose ``glitch`` reading returns ``value`` once (then the inner clock again)."""

    inner: ManualClock
    glitch: str
    value: float
    after: int = 0
    """How many good readings of that kind come before the bad one."""

    def wall(self) -> float:
        return self._read("wall", self.inner.wall())

    def monotonic(self) -> float:
        return self._read("monotonic", self.inner.monotonic())

    def _read(self, name: str, good: float) -> float:
        if name != self.glitch:
            return good
        if self.after == 0:
            self.after = -1
            return self.value
        self.after -= 1
        return good


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize(("glitch", "after", "committed"), [
    ("wall", 0, False),  # before the reservation
    ("wall", 1, False),  # the reading the round is judged on, inside the reservation
    ("monotonic", 0, False),  # before the reservation
    ("monotonic", 1, True),  # after the reservation committed (with finite times)
])
async def test_a_non_finite_clock_reading_is_a_typed_error_and_nothing_is_stored(
    ledger: MemoryLedger, clock: ManualClock, glitch: str, after: int, committed: bool,
    value: float,
) -> None:
    bad = _GlitchingClock(clock, glitch, value, after)
    with pytest.raises(InvalidArgumentError, match=glitch):
        async with RecallAllowance(ledger, clock=bad).round("r", DELIB, slots=1):
            pytest.fail("a round judged on a non-finite reading must not run")
    usage = await ledger.usage("r")
    assert (usage.reserved, usage.rounds, usage.executed) == ((1, 1, 0) if committed else
                                                              (0, 0, 0))
    assert usage.deadline_wall is None or math.isfinite(usage.deadline_wall)
    # The next round, on a sane clock, gets the finite deadline of the policy's length.
    async with RecallAllowance(ledger, clock=clock).round("r", DELIB, slots=1) as permit:
        assert permit.deadline_wall == WALL + AllowancePolicy().deadline_s


async def test_a_non_finite_clock_reading_in_legacy_mode_is_a_typed_error(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    bad = _GlitchingClock(clock, "monotonic", math.nan)
    with pytest.raises(InvalidArgumentError):
        async with RecallAllowance.legacy(ledger, clock=bad).round("r", DELIB, slots=1):
            pytest.fail("no permit on a non-finite reading")


@attrs.define
class _CancellingLedger:
    """Reserves shielded (as a shared batch does) while the caller's scope is cancelled."""

    inner: MemoryLedger
    scope: anyio.CancelScope | None = None

    async def reserve(self, *args: Any, **options: Any) -> Any:
        with anyio.CancelScope(shield=True):
            assert self.scope is not None
            self.scope.cancel()  # the caller is cancelled while its reservation commits
            return await self.inner.reserve(*args, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_caller_cancelled_while_waiting_for_the_ledger_gets_no_permit(
    ledger: MemoryLedger, clock: ManualClock
) -> None:
    cancelling = _CancellingLedger(ledger)
    entered: list[Permit] = []
    with anyio.CancelScope() as scope:
        cancelling.scope = scope
        async with RecallAllowance(cancelling, clock=clock).round("r", DELIB, slots=1) as p:
            entered.append(p)
            with p.attempt_sync():
                pass
    assert scope.cancelled_caught
    assert entered == []
    usage = await ledger.usage("r")
    assert usage.reserved == 1  # the reservation committed: its slot stays consumed
    assert usage.executed == 0


async def test_an_admission_that_swallows_its_timeout_and_answers_true_is_not_admitted() -> None:
    from plugin.memory.planning import BaselineReason, QueryPlanner, QueryStrategy
    from plugin.memory.state import WorkingState

    async def stubborn(experiment: str) -> bool:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            pass  # swallows its cancellation, then answers late
        return True

    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, stubborn, admission_timeout_s=0.001)
    query = await planner.plan(WorkingState("find the invoice", objective="close the books"))
    assert query.strategy is QueryStrategy.BASELINE
    assert query.baseline_reason is BaselineReason.ADMISSION_TIMEOUT


HUGE = 10**400  # past a float's range: math.isfinite raises OverflowError on it


def test_an_int_past_a_floats_range_is_a_typed_error_never_an_overflow() -> None:
    from plugin import AllowancePolicy, ManualClock, QueryPlanner
    from plugin.control.validate import seconds

    builds = [
        lambda: AllowancePolicy(deadline_s=HUGE),
        lambda: ManualClock(wall=HUGE, monotonic=0.0),
        lambda: ManualClock(wall=0.0, monotonic=-HUGE),
        lambda: ManualClock(wall=0.0, monotonic=0.0).advance(HUGE),
        lambda: ManualClock(wall=0.0, monotonic=0.0).step_wall(-HUGE),
        lambda: QueryPlanner(admission_timeout_s=HUGE),
        lambda: seconds(10**5000, field="x"),  # its decimal text is past what Python converts
    ]
    for build in builds:  # InvalidArgumentError is a ValueError; the planner's is a ValueError
        with pytest.raises(ValueError, match="integer of"):
            build()


@pytest.mark.anyio
async def test_a_clock_reading_past_a_floats_range_is_refused_before_anything_is_stored(
    tmp_path: Path,
) -> None:
    from plugin import RecallAllowance, RoundKind, SqliteLedger
    from plugin.errors import InvalidArgumentError

    class Wild:
        def wall(self) -> float:
            return HUGE  # type: ignore[return-value]

        def monotonic(self) -> float:
            return 1.0

    async with SqliteLedger(tmp_path / "ledger.db") as ledger:
        with pytest.raises(InvalidArgumentError, match="not a finite number"):
            async with RecallAllowance(ledger, clock=Wild()).round("r", RoundKind.AUTOMATIC):
                pass
        assert (await ledger.usage("r")).rounds == 0
