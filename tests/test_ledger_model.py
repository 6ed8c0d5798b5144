"""A hypothesis state machine comparing the SQL ledgers with a tiny pure-Python model.

The machine reserves rounds for a few runs, moves a :class:`ManualClock` (time passing, and
the wall clock stepped either way), and records attempt traces (some of them repeated, some
legacy). After every step the ledger's usage and history must equal the model's, and the
allowance's invariants must hold. The async ledger is driven from the synchronous machine
through an anyio blocking portal, on asyncio and on trio, for :class:`SqliteLedger` and for
:class:`PostgresLedger` (a fresh schema per example, judged by the machine's explicit times).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs
import hypothesis.strategies as st
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from plugin.control import (
    AllowancePolicy,
    AttemptOutcome,
    AttemptTrace,
    ManualClock,
    PostgresLedger,
    RefusalReason,
    Reservation,
    RoundKind,
    SqliteLedger,
    Usage,
)
from plugin.control.refusal import BudgetRefusal

from ._pg import DSN, fresh_schema

RUNS = ("run-a", "run-b", "run-c")
WALL = 1_700_000_000.0

policies = st.builds(
    AllowancePolicy,
    max_searches=st.integers(1, 8),
    max_rounds=st.integers(1, 4),
    deadline_s=st.sampled_from([1.0, 5.0, 10.0, 12.5]),
    automatic_slots=st.just(1),
)
advances = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.5, 5.0]), st.floats(0.0, 6.0))
steps = st.one_of(st.sampled_from([-20.0, -5.0, 5.0, 20.0]), st.floats(-20.0, 20.0))


@attrs.define
class RunModel:
    opened_wall: float
    deadline_wall: float
    max_searches: int
    max_rounds: int
    spans: list[tuple[int, int]] = attrs.field(factory=list)
    """(first_slot, slots) of each granted round, oldest first."""
    refused: int = 0
    judged: float = -math.inf
    """The latest time the run was judged at: a later round is never judged before it."""
    attempts: dict[str, tuple[int, int, bool]] = attrs.field(factory=dict)
    """attempt_id -> (round_index, slot, legacy) as first recorded."""
    ends: dict[str, float] = attrs.field(factory=dict)
    """attempt_id -> when it ended as recorded (its first trace's start: these run 0 s)."""

    def floor(self) -> float:
        """The latest time the ledger saw the run at: a judgement or a recorded attempt's end."""
        return max([self.judged, *self.ends.values()])

    @property
    def rounds(self) -> int:
        return len(self.spans)

    @property
    def reserved(self) -> int:
        return sum(n for _, n in self.spans)

    @property
    def executed(self) -> int:
        return sum(1 for _, _, legacy in self.attempts.values() if not legacy)

    @property
    def legacy_attempts(self) -> int:
        return sum(1 for _, _, legacy in self.attempts.values() if legacy)


class LedgerMachine(RuleBasedStateMachine):
    backend = "asyncio"
    kind = "sqlite"

    granted = Bundle("granted")

    def __init__(self) -> None:
        super().__init__()
        self._stack = contextlib.ExitStack()
        self.folder = Path(tempfile.mkdtemp(prefix="ledger-model-"))
        self._stack.callback(shutil.rmtree, self.folder, ignore_errors=True)
        self.portal: BlockingPortal = self._stack.enter_context(
            start_blocking_portal(self.backend)
        )
        self.ledger: SqliteLedger | PostgresLedger = (
            SqliteLedger(self.folder / "ledger.sqlite3") if self.kind == "sqlite" else
            PostgresLedger(DSN, schema=self._stack.enter_context(fresh_schema("model")),
                           time_source="caller")
        )
        self.portal.call(self.ledger.open)
        self._stack.callback(self.portal.call, self.ledger.aclose)
        self.clock = ManualClock(wall=WALL)
        self.policy = AllowancePolicy()
        self.model: dict[str, RunModel] = {}
        self.next_attempt = 0

    def teardown(self) -> None:
        self._stack.close()

    def call(self, fn: Any, *args: Any) -> Any:
        return self.portal.call(fn, *args)

    @initialize(policy=policies)
    def choose_policy(self, policy: AllowancePolicy) -> None:
        self.policy = policy

    # -- rules -----------------------------------------------------------------------------

    @rule(target=granted, run_id=st.sampled_from(RUNS), kind=st.sampled_from(RoundKind),
          requested=st.integers(1, 5))
    def reserve(self, run_id: str, kind: RoundKind, requested: int) -> Any:
        run = self.model.get(run_id)
        # a wall clock stepped back is judged at the run's latest judgement
        now = max(self.clock.wall(), run.floor() if run is not None else -math.inf)
        result = self.call(self.ledger.reserve, run_id, kind, requested, self.policy,
                           self.clock.wall())
        if run is None:
            run = RunModel(
                opened_wall=now,
                deadline_wall=now + self.policy.deadline_s,
                max_searches=self.policy.max_searches,
                max_rounds=self.policy.max_rounds,
            )
            self.model[run_id] = run
            reason = None
        elif run.rounds >= run.max_rounds:
            reason = RefusalReason.ROUNDS
        elif run.reserved >= run.max_searches:
            reason = RefusalReason.SLOTS
        elif not now < run.deadline_wall:
            reason = RefusalReason.DEADLINE
        else:
            reason = None
        run.judged = now
        if reason is not None:
            run.refused += 1
            assert isinstance(result, BudgetRefusal), result
            assert (result.reason, result.run_id, result.reserved, result.executed) == (
                reason, run_id, run.reserved, run.executed
            )
            return multiple()
        grant = min(requested, run.max_searches - run.reserved)
        executed = run.executed
        run.spans.append((run.reserved + 1, grant))
        assert result == Reservation(
            run_id=run_id, round_index=run.rounds, kind=kind, requested=requested,
            first_slot=run.reserved - grant + 1, slots=grant, reserved=run.reserved,
            executed=executed, deadline_wall=run.deadline_wall, opened_wall=run.opened_wall,
            reserved_wall=now,
        )
        return result

    @rule(seconds=advances)
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(seconds=steps)
    def step_wall(self, seconds: float) -> None:
        self.clock.step_wall(seconds)

    @rule(run_id=st.sampled_from(RUNS), offset=st.sampled_from([-0.25, 0.0, 0.25]))
    def step_wall_to_a_deadline(self, run_id: str, offset: float) -> None:
        """Step the wall clock onto (or just around) a run's deadline: the boundary case."""
        run = self.model.get(run_id)
        if run is not None:
            self.clock.step_wall(run.deadline_wall + offset - self.clock.wall())

    @rule(reservation=granted, data=st.data())
    def record(self, reservation: Reservation, data: st.DataObject) -> None:
        run = self.model[reservation.run_id]
        own = [
            (attempt_id, where)
            for attempt_id, where in run.attempts.items()
            if where[0] == reservation.round_index and not where[2]
        ]
        traces = []
        for _ in range(data.draw(st.integers(1, 3), label="traces")):
            choice = data.draw(st.sampled_from(["new", "again", "legacy"]), label="which")
            if choice == "again" and own:
                attempt_id, (round_index, slot, legacy) = data.draw(st.sampled_from(own))
            else:
                self.next_attempt += 1
                attempt_id = f"{reservation.run_id}/{self.next_attempt}"
                legacy = choice == "legacy"
                round_index = 0 if legacy else reservation.round_index
                slot = data.draw(
                    st.integers(reservation.first_slot,
                                reservation.first_slot + reservation.slots - 1),
                    label="slot",
                )
            run.attempts.setdefault(attempt_id, (round_index, slot, legacy))
            run.ends.setdefault(attempt_id, self.clock.wall())
            traces.append(
                AttemptTrace(
                    attempt_id=attempt_id, run_id=reservation.run_id, round_index=round_index,
                    slot=slot, kind="deliberate",
                    outcome=data.draw(st.sampled_from(AttemptOutcome), label="outcome"),
                    started_wall=self.clock.wall(), elapsed_s=None, legacy=legacy,
                )
            )
        self.call(self.ledger.record, traces, [])

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def usage_equals_the_model(self) -> None:
        for run_id in RUNS:
            usage = self.call(self.ledger.usage, run_id)
            run = self.model.get(run_id)
            if run is None:
                assert usage == Usage(run_id=run_id)
                continue
            assert usage == Usage(
                run_id=run_id, rounds=run.rounds, reserved=run.reserved,
                executed=run.executed, refused=run.refused, deadline_wall=run.deadline_wall,
                legacy_attempts=run.legacy_attempts,
            )
            assert usage.reserved <= self.policy.max_searches
            assert usage.rounds <= self.policy.max_rounds

    @invariant()
    def slot_ranges_are_disjoint_and_contiguous(self) -> None:
        for run_id in RUNS:
            history = self.call(self.ledger.reservations, run_id)
            run = self.model.get(run_id)
            assert [(r.first_slot, r.slots) for r in history] == (run.spans if run else [])
            end = 0
            for index, reservation in enumerate(history, start=1):
                assert reservation.round_index == index
                assert reservation.slots >= 1
                assert reservation.first_slot == end + 1
                end = reservation.first_slot + reservation.slots - 1
                assert reservation.reserved == end


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_ledger_behaves_like_the_model(backend: str, kind: str) -> None:
    machine = type(f"LedgerMachine_{backend}_{kind}", (LedgerMachine,),
                   {"backend": backend, "kind": kind})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=40,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
