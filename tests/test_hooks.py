"""The hooks end to end, on both loops: an agent loop's two phases over the real store."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from plugin import (
    AllowancePolicy,
    AttemptKind,
    BudgetRefusal,
    InvalidArgumentError,
    ManualClock,
    QueryStrategy,
    RecallBudgetExceeded,
    RefusalReason,
    RoundKind,
    WorkingState,
    current_permit,
)
from plugin.control import AttemptOutcome
from plugin.errors import InvalidArgumentTypeError
from plugin.memory.enforce import AttemptHandle, search_attempt
from plugin.memory.pipeline import MemoryRetriever
from runtime_hooks import RecallHooks
from runtime_hooks.bootstrap import RecallConfig, Semantic, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed
from runtime_hooks.hooks import ToolCall
from runtime_hooks.loop import AgentLoop, Dispatch, ModelStep, Preparation, ScriptedModel

from ._hooks_env import search_calls as _calls
from ._hooks_env import store_of as _store
from ._hooks_env import usage_counts as _usage
from ._hostile import HOSTILE_TEXT

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]



async def _admit(experiment: str) -> bool:
    return experiment == "task_context"


def _config(tmp_path: Path, **changes: Any) -> RecallConfig:
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db",
                          admission=_admit)
    return attrs.evolve(config, **changes)


@pytest.fixture
async def hooks(tmp_path: Path, clock: ManualClock) -> AsyncIterator[RecallHooks]:
    async with open_hooks(_config(tmp_path), clock=clock) as hooks:
        await seed(_store(hooks))
        yield hooks


async def test_continuation_finds_the_next_action_only_with_task_context(
    tmp_path: Path, clock: ManualClock
) -> None:
    found = {}
    for strategy in QueryStrategy:
        async with open_hooks(_config(tmp_path, query_planning=strategy), clock=clock) as hooks:
            if strategy is QueryStrategy.BASELINE:
                await seed(_store(hooks))
            with hooks.bind_run():
                context = await hooks.prepare(STATE, run_id=f"run-{strategy.value}",
                                              scope=SCOPE, principal=PRINCIPAL)
            assert context.query.strategy is strategy
            assert context.query.fragments[0] == "Continue" or strategy is QueryStrategy.BASELINE
            found[strategy] = {item.id for item in context.evidence}
    assert "m-backfill" in found[QueryStrategy.TASK_CONTEXT]
    assert "m-backfill" not in found[QueryStrategy.BASELINE]


async def test_automatic_round_runs_base_then_delta_for_people(hooks: RecallHooks) -> None:
    with hooks.bind_run():
        context = await hooks.prepare(attrs.evolve(STATE, current_request="What did Priya say?"),
                                      run_id="r", scope=SCOPE, principal=PRINCIPAL)
    assert context.slots == (1, 2)  # base, then the belief read as the delta
    assert "b-priya" in {item.id for item in context.evidence}
    traces = await hooks.allowance.ledger.attempts("r")
    assert [t.kind for t in traces] == ["base", "delta"]
    assert traces[0].fingerprint == context.query.fingerprint  # one former, one fingerprint


async def test_no_delta_without_unmet_need(hooks: RecallHooks) -> None:
    state = WorkingState("deploy window")
    context = await hooks.prepare(state, run_id="r", scope=SCOPE, principal=PRINCIPAL)
    assert context.slots == (1,)
    assert await _usage(hooks, "r") == (1, 2, 1, 0)  # reserved 2, executed 1: no refund


async def test_six_parallel_calls_take_four_distinct_slots(hooks: RecallHooks) -> None:
    calls = _calls("invoice backfill", "rounding rule", "cutover date", "deploy window",
                   "rollback runbook", "kickoff notes")
    with hooks.bind_run():
        results = await hooks.dispatch(calls, run_id="r", scope=SCOPE, principal=PRINCIPAL)
    assert [r.call_id for r in results] == [c.call_id for c in calls]
    ok = [r for r in results if r.status == "ok"]
    refused = [r for r in results if r.status == "refused"]
    assert sorted(r.slot for r in ok if r.slot is not None) == [1, 2, 3, 4]
    assert len(refused) == 2
    for result in refused:
        assert result.refusal is not None
        assert result.refusal.reason is RefusalReason.SLOTS
        assert "bounded" in result.content and "not evidence" in result.content
        assert result.as_dict()["refusal"]["reason"] == "slots"  # type: ignore[index]
    assert await _usage(hooks, "r") == (1, 4, 4, 2)


async def test_nested_belief_read_takes_its_own_slot(hooks: RecallHooks) -> None:
    prepared = await hooks.preparer.prepare_search("what does Priya believe", scope=SCOPE,
                                                   principal=PRINCIPAL)
    async with hooks.allowance.round("r", RoundKind.DELIBERATE, slots=2) as permit:
        attempted = await search_attempt(permit, hooks.retriever, prepared,
                                         kind=AttemptKind.DELIBERATE, caps=hooks.caps,
                                         nested_beliefs=True)
        assert (attempted.slot, attempted.belief_slot, permit.remaining) == (1, 2, 0)
    assert "b-priya" in {item.id for item in attempted.found.evidence}
    traces = await hooks.allowance.ledger.attempts("r")
    assert [(t.slot, t.kind) for t in traces] == [(1, "deliberate"), (2, "nested")]


async def test_nested_read_never_takes_a_sibling_calls_slot(hooks: RecallHooks) -> None:
    results = await hooks.dispatch(
        _calls("what does Priya believe", "deploy window", "cutover date"),
        run_id="r", scope=SCOPE, principal=PRINCIPAL,
    )
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    assert [r.slot for r in results] == [1, 2, 3]  # the calls first, in order
    assert "b-priya" in {item.id for item in results[0].evidence}  # its reserved 4th slot
    traces = await hooks.allowance.ledger.attempts("r")
    assert [(t.slot, t.kind) for t in traces][-1] == (4, "nested")


async def test_nested_read_is_refused_not_queued_when_no_slot_is_free(
    hooks: RecallHooks,
) -> None:
    await hooks.dispatch(_calls("cutover", "deploy", "rounding"), run_id="r", scope=SCOPE,
                         principal=PRINCIPAL)
    (result,) = await hooks.dispatch(_calls("what does Priya believe"), run_id="r",
                                     scope=SCOPE, principal=PRINCIPAL)
    assert result.status == "ok"  # the search degrades, it does not fail
    assert "belief read refused: slots" in result.notes
    assert [b.part for b in result.bounded] == ["nested_read"]
    assert "b-priya" not in {item.id for item in result.evidence}
    assert await _usage(hooks, "r") == (2, 4, 4, 1)


async def test_permit_is_closed_after_each_phase_even_for_a_task_that_outlives_it(
    hooks: RecallHooks,
) -> None:
    captured: list[AttemptHandle] = []
    late: list[object] = []
    retriever = hooks.retriever
    assert isinstance(retriever, MemoryRetriever)
    released = anyio.Event()

    async def linger(handle: AttemptHandle) -> None:
        await released.wait()
        assert current_permit() is None
        try:
            handle.source_read()
        except RecallBudgetExceeded as exc:
            late.append(exc.refusal.reason)

    async with anyio.create_task_group() as outer:

        @attrs.define
        class Spy:
            inner: MemoryRetriever

            def __getattr__(self, name: str) -> Any:
                return getattr(self.inner, name)

            async def search(self, prepared: Any, handle: AttemptHandle, **kw: Any) -> Any:
                captured.append(handle)
                assert current_permit() is None  # the retriever never sees the permit
                outer.start_soon(linger, handle)  # a task that outlives the phase
                return await self.inner.search(prepared, handle, **kw)

        hooks.retriever = Spy(retriever)  # type: ignore[assignment]
        with hooks.bind_run() as holder:
            await hooks.prepare(STATE, run_id="r", scope=SCOPE, principal=PRINCIPAL)
            assert captured[0].ended
            assert current_permit() is None and holder.permit is None
            await hooks.dispatch(_calls("cutover"), run_id="r", scope=SCOPE,
                                 principal=PRINCIPAL)
            assert captured[1].ended
            assert current_permit() is None
        released.set()
    assert late == [RefusalReason.CLOSED, RefusalReason.CLOSED]


async def test_deadline_cancels_a_slow_stage_and_the_slot_stays_consumed(
    hooks: RecallHooks, clock: ManualClock
) -> None:
    store = _store(hooks)

    class SlowStore:
        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        async def sparse_candidates(self, *args: Any, **kwargs: Any) -> Any:
            await anyio.Event().wait()  # a stage that never finishes on its own

    hooks.retriever = MemoryRetriever(SlowStore())  # type: ignore[arg-type]
    await hooks.prepare(WorkingState(""), run_id="r", scope=SCOPE, principal=PRINCIPAL)
    clock.advance(9.99)  # 10 ms of the run's original deadline are left
    (result,) = await hooks.dispatch(_calls("cutover date"), run_id="r", scope=SCOPE,
                                     principal=PRINCIPAL)
    assert result.status == "refused"
    assert result.refusal is not None and result.refusal.reason is RefusalReason.DEADLINE
    traces = await hooks.allowance.ledger.attempts("r")
    assert [t.outcome for t in traces] == [AttemptOutcome.DEADLINE]
    assert (await hooks.allowance.ledger.usage("r")).executed == 1


async def test_no_stale_automatic_evidence_after_exhaustion_but_corrections_stay(
    hooks: RecallHooks,
) -> None:
    first = await hooks.prepare(STATE, run_id="r", scope=SCOPE, principal=PRINCIPAL)
    assert first.evidence and first.notice is None
    await hooks.dispatch(_calls("cutover", "deploy"), run_id="r", scope=SCOPE,
                         principal=PRINCIPAL)
    again = await hooks.prepare(STATE, run_id="r", scope=SCOPE, principal=PRINCIPAL)
    assert again.evidence == ()
    assert again.rendered == ""
    assert again.notice is not None
    assert again.notice.reason in (RefusalReason.ROUNDS, RefusalReason.SLOTS)
    assert "bounded" in again.render() and "not evidence" in again.render()
    assert [c.id for c in again.corrections] == ["c-snapshot"]
    assert "c-snapshot" in again.render()
    (later,) = await hooks.dispatch(_calls("cutover"), run_id="r", scope=SCOPE,
                                    principal=PRINCIPAL)
    assert later.status == "refused" and later.evidence == ()


async def test_retained_evidence_validation_has_its_own_bound(hooks: RecallHooks) -> None:
    hooks.validation_limit = 2
    results = await hooks.dispatch(_calls("invoice backfill dry-run", "rounding", "cutover"),
                                   run_id="r", scope=SCOPE, principal=PRINCIPAL)
    await hooks.dispatch(_calls("deploy"), run_id="r", scope=SCOPE, principal=PRINCIPAL)
    retained = [item.id for r in results for item in r.evidence]
    assert {"m-backfill", "m-rounding", "m-cutover"} <= set(retained)
    checks = await hooks.validate_retained(
        ["m-backfill", "m-rounding", "m-cutover", "m-foreign"], run_id="r", scope=SCOPE,
        principal=PRINCIPAL,
    )
    assert [(c.evidence_id, c.status) for c in checks] == [
        ("m-backfill", "valid"), ("m-rounding", "valid"), ("m-cutover", "bounded"),
        ("m-foreign", "not_retained"),
    ]
    assert await _usage(hooks, "r") == (2, 4, 4, 0)  # validation took no slot


@pytest.mark.parametrize(
    "arguments",
    [
        {"query": 42}, {"query": ""}, {"query": "?!"}, {}, {"text": "cutover"},
        {"query": "cutover", "scope": "personal"}, {"query": "cutover", "principal": "bo"},
        "not json", '["query"]', {"query": "x" * 5000}, {"query": "bad \ud800 text"},
    ],
)
async def test_invalid_calls_get_no_slot(hooks: RecallHooks, arguments: Any) -> None:
    calls = [ToolCall(call_id="bad", arguments=arguments), *_calls("cutover")]
    results = await hooks.dispatch(calls, run_id="r", scope=SCOPE, principal=PRINCIPAL)
    assert results[0].status == "invalid"
    assert "No search was run" in results[0].content
    assert results[1].status == "ok"
    assert await _usage(hooks, "r") == (1, 1, 1, 0)


@pytest.mark.parametrize("arguments", ['{"query": "cutover", "scope": "atlas"}',
                                       # strict tool calling sends null for a left-out option
                                       '{"query": "cutover", "scope": null}'])
async def test_valid_call_may_name_its_own_scope_or_none(
    hooks: RecallHooks, arguments: str
) -> None:
    (result,) = await hooks.dispatch(
        [ToolCall(call_id="a", arguments=arguments)],
        run_id="r", scope=SCOPE, principal=PRINCIPAL,
    )
    assert result.status == "ok" and result.slot == 1


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def test_hostile_text_never_raises(tmp_path: Path, clock: ManualClock) -> None:
    policy = AllowancePolicy(max_searches=200, max_rounds=200, automatic_slots=2)
    async with open_hooks(_config(tmp_path, policy=policy, query_planning="task_context"),
                          clock=clock) as hooks:
        await seed(_store(hooks))
        results = await hooks.dispatch(_calls(*HOSTILE_TEXT), run_id="r", scope=SCOPE,
                                       principal=PRINCIPAL)
        assert {r.status for r in results} <= {"ok", "invalid"}
        for index, text in enumerate(HOSTILE_TEXT):
            try:
                state = WorkingState(text, next_action=text, open_questions=(text,))
            except InvalidArgumentError:  # lone surrogates: refused, typed, field named
                assert not _encodable(text)
                continue
            context = await hooks.prepare(state, run_id=f"p{index}", scope=SCOPE,
                                          principal=PRINCIPAL)
            assert context.notice is None
        counts = await _store(hooks).sparse_candidates("backfill", principal=PRINCIPAL,
                                                       scope=SCOPE, limit=5)
        assert counts  # nothing was dropped or damaged


async def test_no_foreign_memory_leaks_whatever_the_text_says(hooks: RecallHooks) -> None:
    foreign = {"m-foreign", "m-personal"}
    queries = ["Bo's private note on the backfill dry-run budget",
               "Ana's dentist appointment is before the backfill",
               "principal: bo scope: personal backfill", "bo personal dentist private"]
    policy_hooks = hooks
    results = await policy_hooks.dispatch(_calls(*queries[:2]), run_id="r1", scope=SCOPE,
                                          principal=PRINCIPAL)
    results += await policy_hooks.dispatch(_calls(*queries[2:]), run_id="r2", scope=SCOPE,
                                           principal=PRINCIPAL)
    seen = {item.id for r in results for item in r.evidence}
    assert seen and not (seen & foreign)
    state = WorkingState(queries[0], objective=queries[1], next_action=queries[2])
    context = await hooks.prepare(state, run_id="r3", scope=SCOPE, principal=PRINCIPAL)
    assert not ({item.id for item in context.evidence} & foreign)
    # the other principal, in the same scope, sees only its own memory
    (theirs,) = await hooks.dispatch(_calls("backfill dry-run"), run_id="r4", scope=SCOPE,
                                     principal="bo")
    assert {item.id for item in theirs.evidence} == {"m-foreign"}


async def test_refused_round_refuses_every_call(hooks: RecallHooks) -> None:
    for run_round in range(2):
        await hooks.dispatch(_calls("cutover"), run_id="r", scope=SCOPE, principal=PRINCIPAL)
        assert run_round in (0, 1)
    results = await hooks.dispatch(_calls("cutover", "deploy"), run_id="r", scope=SCOPE,
                                   principal=PRINCIPAL)
    assert [r.refusal.reason for r in results if r.refusal] == [RefusalReason.ROUNDS] * 2


async def test_legacy_hooks_are_explicit_unbounded_and_marked(
    tmp_path: Path, clock: ManualClock
) -> None:
    async with open_hooks(_config(tmp_path, legacy=True), clock=clock) as hooks:
        assert hooks.legacy
        await seed(_store(hooks))
        results = await hooks.dispatch(_calls(*["cutover"] * 7), run_id="r", scope=SCOPE,
                                       principal=PRINCIPAL)
        assert {r.status for r in results} == {"ok"}
        traces = await hooks.allowance.ledger.attempts("r")
        assert len(traces) == 7 and all(t.legacy for t in traces)
        usage = await hooks.allowance.ledger.usage("r")
        assert (usage.reserved, usage.executed, usage.legacy_attempts) == (0, 0, 7)
    async with open_hooks(_config(tmp_path), clock=clock) as hooks:
        assert not hooks.legacy  # the default is enforced, never legacy by accident


async def test_reference_loop_puts_the_hooks_in_both_phases(hooks: RecallHooks) -> None:
    model = ScriptedModel([
        ModelStep(tool_calls=tuple(_calls("currency rounding rule"))),
        ModelStep(answer="done"),
    ])
    loop = AgentLoop(hooks, model)
    transcript = await loop.run(STATE, run_id="r", scope=SCOPE, principal=PRINCIPAL)
    assert transcript.answer == "done"
    kinds = [type(e) for e in transcript.events]
    assert kinds == [Preparation, Dispatch, Preparation]
    first_call = model.shown[0]
    assert first_call[0].role == "system" and "m-kickoff" in first_call[0].content
    second_call = model.shown[1]
    tool_messages = [m for m in second_call if m.role == "tool"]
    assert len(tool_messages) == 1 and "m-rounding" in tool_messages[0].content
    assert "bounded" in second_call[0].content  # the spent allowance is said, not hidden


async def test_semantic_arm_with_the_packaged_model(tmp_path: Path, clock: ManualClock) -> None:
    async with open_hooks(_config(tmp_path, semantic=Semantic.WORDLLAMA), clock=clock) as hooks:
        await seed(_store(hooks))
        (result,) = await hooks.dispatch(_calls("when do we switch over to the new system"),
                                         run_id="r", scope=SCOPE, principal=PRINCIPAL)
        assert result.status == "ok"
        assert "semantic" not in " ".join(result.notes)
        traces = await hooks.allowance.ledger.attempts("r")
        assert traces[0].kind == AttemptKind.DELIBERATE.value


def test_only_the_bootstrap_picks_concrete_classes() -> None:
    concrete = {"SqliteLedger", "SystemClock", "MemoryStore", "MemoryRetriever",
                "QueryPreparation", "WordLlamaAdapter", "HashingEmbedding"}
    for path in sorted((ROOT / "runtime_hooks").glob("*.py")):
        # ledgers.py is the composition root's ledger picker (a location -> a ledger class);
        # memory_cli.py manages the reference store itself (its whole job is that store).
        if path.name in {"bootstrap.py", "ledgers.py", "demo.py", "__main__.py", "memory_cli.py"}:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = {alias.name for alias in node.names}
                assert not (names & concrete), (path.name, names & concrete)


async def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    lines: list[str] = []
    from runtime_hooks.demo import run_demo

    await run_demo(lines.append, data_dir=tmp_path, semantic=Semantic.NONE)
    text = "\n".join(lines)
    # Sparse arm only: the baseline query ("Continue" and the objective) misses the next
    # action's memory; the task-context query brings it into the context, within the first
    # four (the open question's answer and the named person's belief weigh more, and the
    # kickoff note matches the objective and a task's "new schema": "backfill", which the next
    # action and that task share, counts once).
    assert "-> next-action memory (m-backfill): NOT retrieved" in text
    placed = [line for line in lines if "-> next-action memory (m-backfill): retrieved" in line]
    assert placed and any(f"retrieved, item {n} of" in placed[-1] for n in (1, 2, 3, 4))
    assert text.count("refused (slots)") >= 2
    assert "not evidence" in text


async def test_a_paid_belief_read_is_not_crowded_out_by_the_cap(hooks: RecallHooks) -> None:
    store = _store(hooks)
    for i in range(12):
        await store.add_memory(f"r{i}", f"rounding note {i}: half-even rounding per line",
                               principal=PRINCIPAL, scope=SCOPE)
    context = await hooks.prepare(WorkingState("What did Priya say about rounding?"),
                                  run_id="r", scope=SCOPE, principal=PRINCIPAL)
    assert context.slots == (1, 2)
    assert len(context.evidence) + len(context.corrections) == hooks.caps.max_items
    assert "b-priya" in {item.id for item in context.evidence}


@pytest.mark.parametrize(("scope", "error"), [("", ValueError), ("  ", ValueError),
                                              (None, TypeError), (3, TypeError)])
async def test_trusted_arguments_are_checked_before_anything_is_reserved(
    hooks: RecallHooks, scope: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="scope"):
        await hooks.prepare(STATE, run_id="r", scope=scope, principal=PRINCIPAL)  # type: ignore[arg-type]
    with pytest.raises(error, match="scope"):
        await hooks.dispatch(_calls("cutover"), run_id="r", scope=scope,  # type: ignore[arg-type]
                             principal=PRINCIPAL)
    with pytest.raises(TypeError, match="WorkingState"):
        await hooks.prepare({"current_request": "x"}, run_id="r", scope=SCOPE,  # type: ignore[arg-type]
                            principal=PRINCIPAL)
    assert await _usage(hooks, "r") == (0, 0, 0, 0)


def test_the_hashing_stand_in_reads_as_many_tokens_as_the_model() -> None:
    from plugin.memory.wordllama_adapter import WORDLLAMA_TOKEN_LIMIT
    from runtime_hooks.bootstrap import load_embedding

    adapter = load_embedding(Semantic.HASHING)
    assert adapter is not None
    assert adapter.token_limit == WORDLLAMA_TOKEN_LIMIT
    assert adapter.dimensions == 256


async def test_a_context_refused_before_its_round_shows_the_corrections_and_binds_nothing(
    hooks: RecallHooks,
) -> None:
    refusal = BudgetRefusal(reason=RefusalReason.RUN_RATE, run_id="r-late", reserved=0,
                            executed=0)
    context = await hooks.refused_context(STATE, refusal, scope=SCOPE, principal=PRINCIPAL)
    assert context.corrections and context.notice is not None and not context.evidence
    assert context.render().index(context.corrections[0].text) < context.render().index(
        "bounded")
    assert await _usage(hooks, "r-late") == (0, 0, 0, 0)
    # nothing bound: the run is still whoever's first uses it
    await hooks.prepare(STATE, run_id="r-late", scope=SCOPE, principal="someone-else")


@pytest.mark.parametrize("refusal", [None, "run_rate", {"reason": "run_rate"},
                                     RefusalReason.RUN_RATE])
async def test_a_refused_context_takes_a_budget_refusal_only(
    hooks: RecallHooks, refusal: Any
) -> None:
    with pytest.raises(InvalidArgumentTypeError):
        await hooks.refused_context(STATE, refusal, scope=SCOPE, principal=PRINCIPAL)
