"""A hypothesis state machine driving the allowance and the call records through the public API.

``test_ledger_model`` drives the ledger's own methods; this machine drives what a host calls:
:meth:`RecallHooks.prepare` (the automatic round), :meth:`RecallHooks.dispatch` (parallel
search calls in one deliberate round, some sent again, some cancelled mid-search), and
:meth:`RecallAllowance.round` with spawned tasks sharing its permit. Between steps it moves
an injected clock (time passing, the wall clock stepped either way, the monotonic reading
stepped back, and time passing *inside* a search), closes and reopens the ledger (a restart:
new hooks, nothing remembered but the ledger), and opens a second handle on the same ledger
(another process dispatching the same run).

The ledger is a SQLite file, or a fresh PostgreSQL schema per example: judged by the injected
clock, directly and through PgBouncer in transaction mode, or by the server's own clock (the
second handle: another ``PostgresLedger``, its own pool). On PostgreSQL two more rules run
(``PgRules``): a turn sent while another connection holds the run's row (a typed ledger error,
nothing searched), and every pooled connection ended by the server between steps.

One retriever stands for the memory backend of every handle: it sees each search's text,
which names its run and call, so it can tell what was searched, when, and how often.

After every step: per run at most ``max_searches`` searches reached the retriever and at most
``max_rounds`` rounds were reserved; no search started at or past the run's original deadline
(on the wall clock, and on the monotonic time since its round was reserved); no call was
searched twice; a call answered once is answered the same way again; and ``usage()`` agrees
with what the retriever saw. ``MACHINE_EXAMPLES`` sets the number of examples (25 by default
on SQLite, a few seconds per loop; 150 runs in about a minute per loop); ``MACHINE_PG_EXAMPLES``
those on PostgreSQL (3 by default, ten seconds or so per loop; the ``stress`` run has 40).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from typing import Any

import anyio
import hypothesis.strategies as st
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from plugin import (
    AllowancePolicy,
    AttemptKind,
    QueryPlanner,
    QueryPreparation,
    RecallAllowance,
    RecallBudgetExceeded,
    RoundKind,
    WorkingState,
    current_permit,
)
from runtime_hooks import RecallHooks, ToolCall

from ._machine_env import (
    PICKS,
    RUNS,
    Handle,
    P,
    PgRules,
    RunModel,
    S,
    SteppedClock,
    World,
    make_store,
    query_of,
)

POLICY = AllowancePolicy()


class AllowanceMachine(PgRules, RuleBasedStateMachine):
    backend = "asyncio"
    store_kind = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self._stack = contextlib.ExitStack()
        self.store = make_store(self.store_kind, self._stack)
        self.portal: BlockingPortal = self._stack.enter_context(start_blocking_portal(self.backend))
        self.clock = SteppedClock()
        self.world = self.portal.call(self._world)
        self.handles: list[Handle] = []
        self._stack.callback(self._close_all)
        self.handles.append(self.portal.call(self._open))
        self.model: dict[str, RunModel] = {}
        self.answers: dict[tuple[str, str, str], tuple[str, int | None, tuple[str, ...]]] = {}
        self.turns = 0

    async def _world(self) -> World:
        return World(self.clock)

    async def _open(self, lock_timeout: float | None = None) -> Handle:
        ledger = self.store.ledger(lock_timeout)
        await ledger.open()
        allowance = RecallAllowance(ledger, policy=POLICY, clock=self.clock)
        hooks = RecallHooks(
            allowance=allowance,
            preparer=QueryPreparation(QueryPlanner()),
            retriever=self.world.retriever,
        )
        return Handle(ledger, hooks)

    def _close_all(self) -> None:
        while self.handles:
            self.portal.call(self.handles.pop().ledger.aclose)

    def teardown(self) -> None:
        self._stack.close()

    # -- the model ---------------------------------------------------------------------------

    def _opened(self, run_id: str, wall: float) -> None:
        """Note a run's first reservation, made with the wall clock at ``wall``; judged by the
        server's clock, by the real time since the step began (the server is on this host)."""
        usage = self.portal.call(self.handles[0].ledger.usage, run_id)
        if run_id not in self.model and usage.rounds:
            deadline = wall + POLICY.deadline_s
            if self.store.server_clock:
                deadline = usage.deadline_wall
                began, now = self.world.real_at + POLICY.deadline_s, time.time()
                assert began - 0.01 <= deadline <= now + POLICY.deadline_s + 0.01, usage
            self.model[run_id] = RunModel(deadline_wall=deadline)

    def _handle(self, which: int) -> Handle:
        return self.handles[min(which, len(self.handles) - 1)]

    def _calls(self, run_id: str, picks: list[tuple[str, str]]) -> list[ToolCall]:
        return [
            ToolCall(call_id=cid, arguments={"query": f"{run_id} {cid} {q}"}) for cid, q in picks
        ]

    def _check_answers(self, run_id: str, calls: list[ToolCall], results: list[Any]) -> None:
        assert len(results) == len(calls)
        for call, result in zip(calls, results, strict=True):
            assert result.call_id == call.call_id
            if result.status == "invalid":
                continue
            key = (run_id, call.call_id, query_of(call))
            answer = (result.status, result.slot, tuple(e.id for e in result.evidence))
            first = self.answers.setdefault(key, answer)
            # the same status and slot; evidence re-read under the run's validation bound
            # (a replay past it shows less, and says so)
            assert answer[:2] == first[:2], (key, first, answer, result)
            assert set(answer[2]) <= set(first[2]), (key, first, answer)
            if len(answer[2]) < len(first[2]):
                assert result.bounded, result

    # -- rules -------------------------------------------------------------------------------

    @rule(
        which=st.integers(0, 1),
        run_id=st.sampled_from(RUNS),
        picks=PICKS,
        slow=st.sampled_from(
            [(0.0, 0.0), (0.0, 0.0), (1.0, 0.0), (4.0, 0.0), (6.0, 0.0), (6.0, -30.0), (0.0, 30.0)]
        ),
    )
    def dispatch(
        self, which: int, run_id: str, picks: list[tuple[str, str]], slow: tuple[float, float]
    ) -> None:
        """Send one turn's search calls (some new, some sent before); each search may let
        time pass, or step the wall clock, before it returns."""
        handle, calls, wall = self._handle(which), self._calls(run_id, picks), self.clock.wall()
        self.world.begin_round(slow=slow)

        async def send() -> list[Any]:
            return await handle.hooks.dispatch(calls, run_id=run_id, scope=S, principal=P)

        results = self.portal.call(send)
        self._opened(run_id, wall)
        self._check_answers(run_id, calls, results)

    @precondition(lambda self: len(self.handles) == 2)
    @rule(run_id=st.sampled_from(RUNS), picks=PICKS, slow=st.sampled_from([0.0, 6.0]))
    def dispatch_from_both(self, run_id: str, picks: list[tuple[str, str]], slow: float) -> None:
        """Both processes send the same turn at once."""
        calls, wall = self._calls(run_id, picks), self.clock.wall()
        self.world.begin_round(slow=(slow, 0.0))

        async def send_both() -> list[list[Any]]:
            answers: list[list[Any]] = [[], []]
            async with anyio.create_task_group() as tg:
                for index, handle in enumerate(self.handles):

                    async def send(index: int = index, handle: Handle = handle) -> None:
                        answers[index] = await handle.hooks.dispatch(
                            calls, run_id=run_id, scope=S, principal=P
                        )

                    tg.start_soon(send)
            return answers

        answered = set(self.answers)
        for results in self.portal.call(send_both):
            self._opened(run_id, wall)
            # the loser of the claim may find the winner still searching: in flight
            done = [
                (c, r)
                for c, r in zip(calls, results, strict=True)
                if (r.status, r.failure) != ("failed", "in_flight")
                or (run_id, c.call_id, query_of(c)) in answered
            ]
            self._check_answers(run_id, [c for c, _ in done], [r for _, r in done])

    @rule(which=st.integers(0, 1), run_id=st.sampled_from(RUNS), picks=PICKS)
    def dispatch_cancelled(self, which: int, run_id: str, picks: list[tuple[str, str]]) -> None:
        """Send a turn whose searches hang, and cancel it once one has begun."""
        handle, calls, wall = self._handle(which), self._calls(run_id, picks), self.clock.wall()
        self.world.begin_round(hold=True)

        async def send_and_cancel() -> bool:
            held = self.world.held = anyio.Event()
            done = anyio.Event()
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:

                    async def send() -> None:
                        await handle.hooks.dispatch(calls, run_id=run_id, scope=S, principal=P)
                        done.set()

                    tg.start_soon(send)
                    async with anyio.create_task_group() as waiting:

                        async def wait_for(event: anyio.Event) -> None:
                            await event.wait()
                            waiting.cancel_scope.cancel()

                        waiting.start_soon(wait_for, held)
                        waiting.start_soon(wait_for, done)
                    tg.cancel_scope.cancel()
            return not done.is_set()

        cancelled = self.portal.call(send_and_cancel)
        self.world.hold = False
        self._opened(run_id, wall)
        if cancelled and run_id in self.model:
            self.model[run_id].cancelled = True

    @rule(which=st.integers(0, 1), run_id=st.sampled_from(RUNS))
    def prepare(self, which: int, run_id: str) -> None:
        """The automatic round of a new turn."""
        handle, wall = self._handle(which), self.clock.wall()
        self.turns += 1
        self.world.begin_round()
        state = WorkingState(current_request=f"{run_id} turn {self.turns}")

        async def prepare() -> Any:
            return await handle.hooks.prepare(state, run_id=run_id, scope=S, principal=P)

        context = self.portal.call(prepare)
        self._opened(run_id, wall)
        assert (context.notice is None) == (len(context.slots) > 0)

    @rule(run_id=st.sampled_from(RUNS), slots=st.integers(1, 3), tasks=st.integers(1, 4))
    def spawn(self, run_id: str, slots: int, tasks: int) -> None:
        """A deliberate round opened directly; tasks spawned inside it share its permit, and
        one spawned outside it outlives it."""
        allowance, wall = self.handles[0].hooks.allowance, self.clock.wall()
        self.world.begin_round()

        async def spawn() -> tuple[int, int]:
            taken, late = 0, 0
            async with anyio.create_task_group() as outer:
                release = anyio.Event()
                with contextlib.suppress(RecallBudgetExceeded):
                    async with allowance.round(run_id, RoundKind.DELIBERATE, slots=slots):
                        permit = current_permit()
                        assert permit is not None and permit.slots <= slots

                        async def take() -> None:
                            nonlocal taken
                            with contextlib.suppress(RecallBudgetExceeded):
                                async with permit.attempt(kind=AttemptKind.DELIBERATE):
                                    taken += 1

                        async def outlive() -> None:
                            nonlocal late
                            await release.wait()
                            with contextlib.suppress(RecallBudgetExceeded):
                                async with permit.attempt(kind=AttemptKind.DELIBERATE):
                                    late += 1

                        outer.start_soon(outlive)
                        async with anyio.create_task_group() as inner:
                            for _ in range(tasks):
                                inner.start_soon(take)
                        assert taken <= permit.slots
                release.set()
            return taken, late

        taken, late = self.portal.call(spawn)
        assert late == 0
        self._opened(run_id, wall)
        if run_id in self.model:
            self.model[run_id].spawned += taken

    @rule(seconds=st.sampled_from([0.5, 2.0, 4.0, 9.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(seconds=st.sampled_from([-30.0, -5.0, 5.0, 30.0]))
    def step_wall(self, seconds: float) -> None:
        self.clock.step_wall(seconds)

    @rule(seconds=st.sampled_from([-5.0, -30.0]))
    def step_monotonic_back(self, seconds: float) -> None:
        self.clock.step_mono(seconds)

    @rule()
    def restart(self) -> None:
        """Close every handle and open the ledger again: new hooks, nothing in memory."""
        self._close_all()
        self.handles.append(self.portal.call(self._open))

    @precondition(lambda self: len(self.handles) == 1)
    @rule()
    def open_second(self) -> None:
        """Another process opens the same ledger file."""
        self.handles.append(self.portal.call(self._open))

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def the_allowance_holds(self) -> None:
        seen = Counter(s.run_id for s in self.world.searches)
        for run_id in RUNS:
            usage = self.portal.call(self.handles[-1].ledger.usage, run_id)
            assert usage.rounds <= POLICY.max_rounds, usage
            assert usage.reserved <= POLICY.max_searches, usage
            run = self.model.get(run_id)
            if run is None:
                assert usage.rounds == 0 and seen[run_id] == 0, usage
                continue
            assert usage.deadline_wall == run.deadline_wall, (usage, run)
            searched = seen[run_id] + run.spawned
            assert searched <= usage.executed <= usage.reserved, (usage, run, seen)
            if not run.cancelled:
                assert searched == usage.executed, (usage, run, seen)

    @invariant()
    def no_search_past_the_original_deadline(self) -> None:
        for search in self.world.searches:
            run = self.model[search.run_id]
            # the round's monotonic window never exceeds what the wall clock left at reserving
            # (judged by the server's clock: at most the policy's deadline, on either clock)
            left = run.deadline_wall - search.round_wall
            if self.store.server_clock:
                left = POLICY.deadline_s
                assert search.wall - search.round_wall < left, search
            else:
                assert search.wall < run.deadline_wall, search
            assert search.mono - search.round_mono < left, search

    @invariant()
    def no_call_is_searched_twice(self) -> None:
        texts = Counter(s.text for s in self.world.searches)
        assert all(n == 1 for n in texts.values()), texts


STORES = [
    pytest.param("sqlite", "25", id="sqlite"),
    pytest.param("postgres", "3", id="postgres"),
    pytest.param("postgres-server", "3", id="postgres-server"),
    pytest.param("pgbouncer", "3", id="postgres-pgbouncer"),
    pytest.param("postgres", "40", id="postgres-stress", marks=pytest.mark.stress),
]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(("store", "examples"), STORES)
def test_the_allowance_and_call_records_hold_under_any_schedule(
    backend: str, store: str, examples: str
) -> None:
    machine = type(f"AllowanceMachine_{backend}_{store}", (AllowanceMachine,),
                   {"backend": backend, "store_kind": store})
    if store != "sqlite":
        examples = os.environ.get("MACHINE_PG_EXAMPLES", examples)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=int(os.environ.get("MACHINE_EXAMPLES", examples)),
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
