"""The query composers and the per-call admission of the task-context experiment."""

from __future__ import annotations

import copy
import re
import sys

import anyio
import attrs
import pytest

from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError
from plugin.memory.planning import (
    BaselineReason,
    FragmentRole,
    QueryPlanner,
    QueryStrategy,
    RecallQuery,
    compose_baseline,
    compose_search_call,
    compose_task_context,
)
from plugin.memory.state import Fact, Task, WorkingState

from ._loops import VIRTUAL_TIME_LOOPS

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

pytestmark = pytest.mark.anyio


@pytest.fixture(params=VIRTUAL_TIME_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    """Both loops; trio on an autojumping MockClock (no worker threads here)."""
    return request.param


CONTINUATION = WorkingState(
    "Continue",
    objective="Migrate the billing service to the new ledger",
    next_action="Write the rollback script for invoice tables",
    tasks=(
        Task("Inventory the invoice tables", done=True),
        Task("Write the rollback script"),
        Task("Schedule the cutover window with Dana"),
        Task("Update the runbook"),
    ),
    open_questions=("Is the March freeze still on?",),
    constraints=("No downtime during business hours",),
    facts=(Fact("Dana owns the cutover calendar", ("Dana",)),),
)


# --- the continuation regression -------------------------------------------------------------


def test_continuation_baseline_omits_next_action_and_pending_work() -> None:
    query = compose_baseline(CONTINUATION)
    assert query.fragments == (
        "Migrate the billing service to the new ledger",
        "Is the March freeze still on?",
        "Continue",
    )
    assert "rollback" not in query.text
    assert "cutover" not in query.text
    assert query.strategy is QueryStrategy.BASELINE
    assert query.baseline_reason is BaselineReason.DEFAULT


def test_continuation_task_context_keeps_them_request_first() -> None:
    query = compose_task_context(CONTINUATION)
    assert query.fragments == (
        "Continue",
        "Write the rollback script for invoice tables",
        "Write the rollback script",
        "Schedule the cutover window with Dana",
        "Is the March freeze still on?",
        "Migrate the billing service to the new ledger",
        "No downtime during business hours",
        "Dana",
    )
    assert query.text == "\n".join(query.fragments)
    assert "Inventory the invoice tables" not in query.fragments  # completed
    assert "Dana owns" not in query.text  # fact texts never used
    assert query.strategy is QueryStrategy.TASK_CONTEXT
    assert query.baseline_reason is None


# --- bounds and windows ----------------------------------------------------------------------


def test_at_most_two_unfinished_tasks_completed_excluded() -> None:
    state = WorkingState(
        "r",
        tasks=[Task("done 1", True), Task("t1"), Task("done 2", True), Task("t2"), Task("t3")],
    )
    assert compose_task_context(state).fragments == ("r", "t1", "t2")


def test_ninth_task_is_never_read() -> None:
    tasks = [Task(f"done {i}", True) for i in range(8)] + [Task("ninth, unfinished")]
    query = compose_task_context(WorkingState("r", tasks=tasks))
    assert query.fragments == ("r",)
    tasks = [Task(f"done {i}", True) for i in range(7)] + [Task("eighth"), Task("ninth")]
    assert compose_task_context(WorkingState("r", tasks=tasks)).fragments == ("r", "eighth")


def test_duplicate_or_blank_task_does_not_pull_in_a_third() -> None:
    state = WorkingState("r", tasks=[Task("A  task"), Task("a task"), Task("third")])
    assert compose_task_context(state).fragments == ("r", "A  task")
    state = WorkingState("r", tasks=[Task("   "), Task("second"), Task("third")])
    assert compose_task_context(state).fragments == ("r", "second")


def test_at_most_two_questions_and_two_constraints() -> None:
    state = WorkingState("r", open_questions=["q1", "q2", "q3"], constraints=["c1", "c2", "c3"])
    assert compose_task_context(state).fragments == ("r", "q1", "q2", "c1", "c2")


def test_entities_one_fragment_each_at_most_eight_from_first_eight_facts() -> None:
    facts = [Fact(f"fact text {i}", [f"E{i}a", f"E{i}b"]) for i in range(9)]
    query = compose_task_context(WorkingState("r", facts=facts))
    assert query.fragments == ("r", "E0a", "E0b", "E1a", "E1b", "E2a", "E2b", "E3a", "E3b")
    assert "fact text" not in query.text


def test_ninth_fact_entities_never_appear() -> None:
    facts = [Fact(f"f{i}") for i in range(8)] + [Fact("f9", ["Ninth"])]
    assert compose_task_context(WorkingState("r", facts=facts)).fragments == ("r",)
    facts = [Fact("f", ["One"])] + [Fact(f"f{i}") for i in range(7)] + [Fact("f9", ["Ninth"])]
    assert compose_task_context(WorkingState("r", facts=facts)).fragments == ("r", "One")


def test_a_name_given_in_every_fact_is_one_entity_reference() -> None:
    # Real facts name one person again and again: each name counts once toward the eight,
    # whatever its case or spacing, and a blank name not at all.
    facts = [Fact(f"f{i}", ["Alice", f"Bob{i}", " alice ", ""]) for i in range(8)]
    query = compose_task_context(WorkingState("r", facts=facts))
    assert query.fragments == ("r", "Alice", *(f"Bob{i}" for i in range(7)))


def test_only_the_first_64_entity_names_are_read() -> None:
    # Two million repeats of one name cost no more than 64: the names past them are not read.
    facts = [Fact("f", ["Ana"] * 2_000_000 + ["Bob"]), Fact("g", ["Cy"])]
    assert compose_task_context(WorkingState("r", facts=facts)).fragments == ("r", "Ana")
    facts = [Fact("f", ["Ana"] * 63 + ["Bob"])]
    assert compose_task_context(WorkingState("r", facts=facts)).fragments == ("r", "Ana", "Bob")


def test_many_entities_in_one_fact_are_capped() -> None:
    state = WorkingState("r", facts=[Fact("f", [f"N{i}" for i in range(1000)])])
    assert compose_task_context(state).fragments == ("r", *(f"N{i}" for i in range(8)))


def test_full_order() -> None:
    state = WorkingState(
        "request",
        objective="objective",
        next_action="next",
        tasks=[Task("task")],
        open_questions=["question"],
        constraints=["constraint"],
        facts=[Fact("fact", ["Entity"])],
    )
    assert compose_task_context(state).fragments == (
        "request",
        "next",
        "task",
        "question",
        "objective",
        "constraint",
        "Entity",
    )


# --- fragments: whole, stripped, deduplicated ------------------------------------------------


def test_fragments_are_stripped_but_otherwise_unchanged() -> None:
    state = WorkingState(
        "  Café\u0301  \n",
        next_action="\t\uff26\uff55\uff4c\uff4c  width\t",
        open_questions=[" \u3000 "],
    )
    assert compose_task_context(state).fragments == (
        "Café\u0301",
        "\uff26\uff55\uff4c\uff4c  width",
    )


def test_dedup_case_and_whitespace_first_stands() -> None:
    state = WorkingState(
        "Fix the  Build",
        next_action="fix the build",
        tasks=[Task("FIX\tTHE\nbuild"), Task("Ship it")],
        open_questions=["ship IT"],
        objective="Straße",
        constraints=["STRASSE"],  # casefold("Straße") == "strasse"
        facts=[Fact("f", ["Ship it", "New"])],
    )
    assert compose_task_context(state).fragments == ("Fix the  Build", "Ship it", "Straße", "New")


def test_empty_request_is_skipped() -> None:
    assert compose_task_context(WorkingState("  ", next_action="n")).fragments == ("n",)
    assert compose_task_context(WorkingState("")).fragments == ()
    assert compose_task_context(WorkingState("")).text == ""


# --- the byte bound --------------------------------------------------------------------------


def test_joined_text_is_at_most_512_bytes() -> None:
    state = WorkingState(
        "r" * 100,
        next_action="n" * 100,
        tasks=[Task("t" * 100), Task("u" * 100)],
        open_questions=["q" * 100, "p" * 100],
    )
    query = compose_task_context(state)
    assert len(query.text.encode()) <= 512
    # 100 + 5 * (1 + 100) = 605 would be too much: the fifth fragment is left out.
    assert query.fragments == ("r" * 100, "n" * 100, "t" * 100, "u" * 100, "q" * 100)
    assert len(query.text.encode()) == 100 + 4 * 101


def test_too_large_fragment_is_skipped_not_truncated_later_ones_fit() -> None:
    state = WorkingState(
        "r" * 400,
        next_action="n" * 200,
        tasks=[Task("t" * 120)],
        open_questions=["q" * 10],
        objective="o" * 90,
    )
    query = compose_task_context(state)
    assert query.fragments == ("r" * 400, "q" * 10, "o" * 90)
    assert len(query.text.encode()) == 400 + 11 + 91 == 502


def test_separator_counts_toward_the_bound() -> None:
    # 500 + 1 + 11 = 512 fits; 500 + 1 + 12 = 513 does not.
    state = WorkingState("r" * 500, next_action="n" * 12, open_questions=["q" * 11])
    assert compose_task_context(state).fragments == ("r" * 500, "q" * 11)


def test_multibyte_characters_are_counted_in_bytes() -> None:
    # "漢" is 3 bytes; 170 of them are 510 bytes, leaving room for "\n" plus one byte.
    state = WorkingState("漢" * 170, next_action="é", open_questions=["x"])
    assert compose_task_context(state).fragments == ("漢" * 170, "x")


def test_request_of_exactly_max_bytes_takes_task_context_alone() -> None:
    request = "🦀" * 128  # 4 bytes each: 512
    state = WorkingState(request, next_action="n", tasks=[Task("t")])
    query = compose_task_context(state)
    assert query.strategy is QueryStrategy.TASK_CONTEXT
    assert query.fragments == (request,)
    assert len(query.text.encode()) == 512


def test_request_one_byte_over_takes_the_unchanged_baseline() -> None:
    request = "a" * 513
    state = WorkingState(request, objective="obj", next_action="n", open_questions=["q"])
    query = compose_task_context(state)
    assert query.strategy is QueryStrategy.BASELINE
    assert query.baseline_reason is BaselineReason.REQUEST_TOO_LARGE
    assert query.fragments == ("obj", "q", request)  # kept whole, unenriched
    assert query.fragments == compose_baseline(state).fragments
    assert query.fingerprint == compose_baseline(state).fingerprint


def test_request_is_measured_after_stripping() -> None:
    query = compose_task_context(WorkingState("  " + "a" * 512 + "\n"))
    assert query.strategy is QueryStrategy.TASK_CONTEXT
    assert query.fragments == ("a" * 512,)


def test_custom_max_bytes() -> None:
    state = WorkingState("abc", next_action="de", open_questions=["f"])
    assert compose_task_context(state, max_bytes=6).fragments == ("abc", "de")
    assert compose_task_context(state, max_bytes=3).fragments == ("abc",)
    assert compose_task_context(state, max_bytes=2).baseline_reason is (
        BaselineReason.REQUEST_TOO_LARGE
    )


@pytest.mark.parametrize(
    ("max_bytes", "error"), [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_max_bytes_is_validated(max_bytes: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_bytes"):
        compose_task_context(WorkingState("r"), max_bytes=max_bytes)  # type: ignore[arg-type]


@pytest.mark.parametrize("compose", [compose_baseline, compose_task_context])
def test_state_must_be_a_working_state(compose: object) -> None:
    with pytest.raises(InvalidArgumentTypeError, match="state must be WorkingState, got dict"):
        compose({"current_request": "r"})  # type: ignore[operator]
    with pytest.raises(TypeError, match="scope must be str or None, got int"):
        compose(WorkingState("r"), scope=1)  # type: ignore[operator]
    with pytest.raises(TypeError, match="principal must be str or None, got bytes"):
        compose(WorkingState("r"), principal=b"u")  # type: ignore[operator]


# --- the baseline ----------------------------------------------------------------------------


def test_baseline_order_every_question_dedup_and_no_bound() -> None:
    questions = [f"question {i} " + "x" * 100 for i in range(10)]
    state = WorkingState(
        " Request ",
        objective="request",
        next_action="n",
        tasks=[Task("t")],
        open_questions=[*questions, "", "QUESTION 0 " + "X" * 100],
        constraints=["c"],
        facts=[Fact("f", ["E"])],
    )
    query = compose_baseline(state)
    assert query.fragments == ("request", *questions)  # the request duplicates the objective
    assert len(query.text.encode()) > 512


# --- the query value -------------------------------------------------------------------------


def test_query_has_no_date_or_belief_filter() -> None:
    state = WorkingState(
        "What did Alice decide on 2024-03-01? as_of: 2020-01-01 known_at=yesterday",
        facts=[Fact("Alice believes X since 2023", ["Alice"])],
    )
    for query in (compose_baseline(state), compose_task_context(state)):
        names = {field.name for field in attrs.fields(RecallQuery)}
        assert names == {
            "fragments",
            "strategy",
            "baseline_reason",
            "scope",
            "principal",
            "roles",
            "text",
            "fingerprint",
        }
        for attribute in ("as_of", "known_at", "belief", "date", "since", "until"):
            assert not hasattr(query, attribute)


def test_scope_and_principal_come_from_arguments_only() -> None:
    state = WorkingState(
        "Continue. scope: other / principal: admin",
        next_action="switch to scope=other as principal=admin",
        tasks=[Task("principal: root")],
        facts=[Fact("scope: secret", ["admin"])],
    )
    for query in (
        compose_baseline(state, scope="proj", principal="u1"),
        compose_task_context(state, scope="proj", principal="u1"),
    ):
        assert (query.scope, query.principal) == ("proj", "u1")
    query = compose_task_context(state)
    assert (query.scope, query.principal) == (None, None)


def test_fingerprint_is_hex_sha256_and_covers_every_part() -> None:
    base = compose_task_context(CONTINUATION, scope="s", principal="p")
    assert re.fullmatch(r"[0-9a-f]{64}", base.fingerprint)
    assert (
        base.fingerprint == compose_task_context(CONTINUATION, scope="s", principal="p").fingerprint
    )
    others = {
        compose_baseline(CONTINUATION, scope="s", principal="p").fingerprint,
        compose_task_context(CONTINUATION, scope="t", principal="p").fingerprint,
        compose_task_context(CONTINUATION, scope="s", principal="q").fingerprint,
        compose_task_context(CONTINUATION, scope=None, principal="p").fingerprint,
        compose_task_context(CONTINUATION, scope="s", principal=None).fingerprint,
        compose_task_context(CONTINUATION, scope="", principal="p").fingerprint,
        compose_task_context(attrs.evolve(CONTINUATION, current_request="Go on")).fingerprint,
    }
    assert base.fingerprint not in others
    assert len(others) == 7


def test_fingerprint_encoding_is_unambiguous() -> None:
    def query(*fragments: str, scope: str | None = None) -> RecallQuery:
        return RecallQuery(
            fragments=fragments,
            strategy=QueryStrategy.TASK_CONTEXT,
            baseline_reason=None,
            scope=scope,
        )

    assert query("a\nb").text == query("a", "b").text
    assert query("a\nb").fingerprint != query("a", "b").fingerprint
    assert query("ab").fingerprint != query("a", "b").fingerprint
    assert query("a", scope="b").fingerprint != query("a", "b").fingerprint
    assert query(scope="null").fingerprint != query().fingerprint


def test_fingerprint_ignores_the_baseline_reason() -> None:
    planner = QueryPlanner()
    assert (
        planner.plan_recent(CONTINUATION, scope="s").fingerprint
        == compose_baseline(CONTINUATION, scope="s").fingerprint
    )


def test_recall_query_validates_reason_against_strategy() -> None:
    with pytest.raises(ValueError, match="baseline_reason"):
        RecallQuery(fragments=(), strategy=QueryStrategy.BASELINE, baseline_reason=None)
    with pytest.raises(ValueError, match="baseline_reason"):
        RecallQuery(
            fragments=(),
            strategy=QueryStrategy.TASK_CONTEXT,
            baseline_reason=BaselineReason.DEFAULT,
        )
    with pytest.raises(TypeError, match=r"RecallQuery\.fragments\[0\] must be str"):
        RecallQuery(
            fragments=(1,),  # type: ignore[arg-type]
            strategy=QueryStrategy.TASK_CONTEXT,
            baseline_reason=None,
        )


def test_composing_does_not_mutate_state() -> None:
    snapshot = copy.deepcopy(CONTINUATION)
    tasks = CONTINUATION.tasks
    compose_task_context(CONTINUATION)
    compose_baseline(CONTINUATION)
    assert snapshot == CONTINUATION
    assert CONTINUATION.tasks is tasks


# --- the planner -----------------------------------------------------------------------------


class CountingAdmission:
    """An admission that answers from a script and counts its calls."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls: list[str] = []

    async def __call__(self, experiment: str) -> bool:
        self.calls.append(experiment)
        answer = self.answers[(len(self.calls) - 1) % len(self.answers)]
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]


def test_planner_validation() -> None:
    assert QueryPlanner().strategy is QueryStrategy.BASELINE
    assert QueryPlanner().admission is None
    assert QueryPlanner(strategy="task_context").strategy is QueryStrategy.TASK_CONTEXT
    with pytest.raises(ValueError, match=r"QueryPlanner\.strategy must be one of"):
        QueryPlanner(strategy="fancy")
    with pytest.raises(TypeError, match=r"QueryPlanner\.strategy"):
        QueryPlanner(strategy=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"QueryPlanner\.admission"):
        QueryPlanner(admission=True)  # type: ignore[arg-type]
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"QueryPlanner\.admission_timeout_s"):
            QueryPlanner(admission_timeout_s=bad)
    with pytest.raises(TypeError, match=r"QueryPlanner\.admission_timeout_s"):
        QueryPlanner(admission_timeout_s="1")  # type: ignore[arg-type]


async def test_baseline_strategy_never_asks_admission() -> None:
    admission = CountingAdmission(True)
    planner = QueryPlanner(admission=admission)
    query = await planner.plan(CONTINUATION, scope="s", principal="p")
    assert query == compose_baseline(CONTINUATION, scope="s", principal="p")
    assert query.baseline_reason is BaselineReason.DEFAULT
    assert admission.calls == []


async def test_admitted_experiment_composes_task_context_every_call_asks() -> None:
    admission = CountingAdmission(True)
    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, admission)
    for n in range(1, 6):
        query = await planner.plan(CONTINUATION, scope="s", principal="p")
        assert query == compose_task_context(CONTINUATION, scope="s", principal="p")
        assert admission.calls == ["task_context"] * n


async def test_withdrawn_admission_gives_baseline_at_once() -> None:
    admission = CountingAdmission(False)
    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, admission)
    query = await planner.plan(CONTINUATION)
    assert query.strategy is QueryStrategy.BASELINE
    assert query.baseline_reason is BaselineReason.ADMISSION_WITHDRAWN
    assert query.fragments == compose_baseline(CONTINUATION).fragments
    assert admission.calls == ["task_context"]


async def test_unavailable_admission_gives_baseline() -> None:
    query = await QueryPlanner(QueryStrategy.TASK_CONTEXT).plan(CONTINUATION)
    assert query.baseline_reason is BaselineReason.ADMISSION_UNAVAILABLE
    assert query.fragments == compose_baseline(CONTINUATION).fragments


@pytest.mark.parametrize("answer", [RuntimeError("down: password=hunter2"), KeyError("x"), 1,
                                    None, "yes"])
async def test_failing_or_non_bool_admission_gives_baseline(
    answer: object, caplog: pytest.LogCaptureFixture
) -> None:
    admission = CountingAdmission(answer)
    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, admission)
    query = await planner.plan(CONTINUATION)
    assert query.baseline_reason is BaselineReason.ADMISSION_FAILED
    assert query.strategy is QueryStrategy.BASELINE
    assert admission.calls == ["task_context"]
    (record,) = caplog.records
    assert record.getMessage().startswith("planning.admission_failed error=")
    assert record.exc_info is None and "hunter2" not in caplog.text  # its message is the host's


@pytest.mark.parametrize("error", [GeneratorExit, type("Stop", (BaseException,), {})])
async def test_an_admission_raising_a_base_exception_is_a_failure(
    error: type[BaseException],
) -> None:
    # Only a stop (KeyboardInterrupt, SystemExit: below) reaches the caller; anything else the
    # admission raises, a leaked GeneratorExit included, is its own failure: the baseline.
    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, CountingAdmission(error()))
    query = await planner.plan(CONTINUATION)
    assert query.baseline_reason is BaselineReason.ADMISSION_FAILED


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
async def test_a_stop_in_a_group_from_the_admission_reaches_the_caller(
    stop: type[BaseException],
) -> None:
    # A stop raised in a task of the admission's own task group arrives wrapped in a group.
    group = BaseExceptionGroup("admission's tasks", [ValueError("x"), stop()])
    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, CountingAdmission(group))
    with pytest.raises(BaseExceptionGroup):
        await planner.plan(CONTINUATION)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_an_admissions_stop_signal_reaches_the_caller_and_the_loop_runs_on(
    backend: str, stop: type[BaseException]
) -> None:
    # The admission runs as a task of its own: on asyncio a stop raised there would stop the
    # loop itself, past the caller's ``except``.
    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, CountingAdmission(stop()))

    async def main() -> str:
        try:
            await planner.plan(CONTINUATION)
        except stop:
            await anyio.sleep(0)  # the loop still runs
            return "caught"
        return "not raised"

    assert anyio.run(main, backend=backend) == "caught"


async def test_hanging_admission_times_out_to_baseline() -> None:
    calls = 0

    async def hang(experiment: str) -> bool:
        nonlocal calls
        calls += 1
        await anyio.Event().wait()
        raise AssertionError("unreachable")

    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, hang, admission_timeout_s=0.01)
    start = anyio.current_time()
    query = await planner.plan(CONTINUATION)
    assert query.baseline_reason is BaselineReason.ADMISSION_TIMEOUT
    assert query.fragments == compose_baseline(CONTINUATION).fragments
    assert anyio.current_time() - start >= 0.01 - 1e-9  # float sums of the mock clock
    assert calls == 1
    await planner.plan(CONTINUATION)
    assert calls == 2  # a timeout is not remembered either


async def test_admission_that_turns_the_timeout_into_an_error_counts_as_timeout() -> None:
    async def hang(experiment: str) -> bool:
        try:
            await anyio.Event().wait()
        except anyio.get_cancelled_exc_class():
            raise RuntimeError("shutting down") from None
        raise AssertionError("unreachable")

    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, hang, admission_timeout_s=0.01)
    query = await planner.plan(CONTINUATION)
    assert query.baseline_reason is BaselineReason.ADMISSION_TIMEOUT


async def test_an_answer_that_blocked_past_the_timeout_is_no_answer(
    anyio_backend: object, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An admission that blocks the loop (sync I/O inside async def) cannot be cancelled while
    # it blocks; its answer, however it comes, is late. The loop's clock is made to move as a
    # blocking call's real time would, without sleeping.
    shift = 0.0
    real_time = anyio.current_time
    monkeypatch.setattr(anyio, "current_time", lambda: real_time() + shift)

    async def blocking_then_true(experiment: str) -> bool:
        nonlocal shift
        shift += 1.0  # a second spent blocked, with no checkpoint
        return True

    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, blocking_then_true,
                           admission_timeout_s=0.25)
    query = await planner.plan(CONTINUATION)
    assert query.baseline_reason is BaselineReason.ADMISSION_TIMEOUT


async def test_a_cancellation_the_admission_raises_itself_is_its_failure(
    anyio_backend: object,
) -> None:
    """On every Python: the admission runs in a task of its own, whose own cancellation is
    told from the planner's."""

    async def cancelled(experiment: str) -> bool:
        import asyncio

        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future  # raises CancelledError; nobody cancelled the planner
        raise AssertionError("unreachable")

    if "asyncio" in str(anyio_backend):  # trio's Cancelled cannot be raised by user code
        query = await QueryPlanner(QueryStrategy.TASK_CONTEXT, cancelled).plan(CONTINUATION)
        assert query.baseline_reason is BaselineReason.ADMISSION_FAILED
    with anyio.move_on_after(5) as outer:  # a real cancellation still propagates
        async def hang(experiment: str) -> bool:
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

        outer.cancel()
        await QueryPlanner(QueryStrategy.TASK_CONTEXT, hang).plan(CONTINUATION)
    assert outer.cancelled_caught


async def test_slow_but_timely_admission_is_accepted() -> None:
    async def slow(experiment: str) -> bool:
        await anyio.sleep(0.001)
        return True

    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, slow, admission_timeout_s=5.0)
    assert (await planner.plan(CONTINUATION)).strategy is QueryStrategy.TASK_CONTEXT


async def test_outer_cancellation_is_not_swallowed() -> None:
    async def hang(experiment: str) -> bool:
        await anyio.Event().wait()
        raise AssertionError("unreachable")

    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, hang, admission_timeout_s=5.0)
    finished = False
    with anyio.move_on_after(0.01) as outer:
        await planner.plan(CONTINUATION)
        finished = True
    assert outer.cancelled_caught
    assert not finished


async def test_flipping_admission_is_followed_call_by_call() -> None:
    admission = CountingAdmission(True, False, RuntimeError("flaky"), True, False)
    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, admission)
    results = [await planner.plan(CONTINUATION) for _ in range(10)]
    assert [q.baseline_reason for q in results] == [
        None,
        BaselineReason.ADMISSION_WITHDRAWN,
        BaselineReason.ADMISSION_FAILED,
        None,
        BaselineReason.ADMISSION_WITHDRAWN,
    ] * 2
    assert len(admission.calls) == 10


async def test_plan_recent_is_the_frozen_control_whatever_the_strategy() -> None:
    admission = CountingAdmission(True)
    for strategy in QueryStrategy:
        planner = QueryPlanner(strategy, admission)
        recent = planner.plan_recent(CONTINUATION, scope="s", principal="p")
        assert recent.strategy is QueryStrategy.BASELINE
        assert recent.baseline_reason is BaselineReason.FROZEN_CONTROL
        assert recent.fragments == compose_baseline(CONTINUATION).fragments
        assert (recent.scope, recent.principal) == ("s", "p")
    assert admission.calls == []


async def test_planner_scope_from_arguments_and_state_untouched() -> None:
    state = WorkingState("Continue as principal: admin in scope: other", tasks=[Task("t")])
    snapshot = copy.deepcopy(state)
    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, CountingAdmission(True))
    query = await planner.plan(state, scope="proj", principal="u1")
    assert (query.scope, query.principal) == ("proj", "u1")
    assert state == snapshot


async def test_planner_rejects_a_non_state_before_asking_admission() -> None:
    admission = CountingAdmission(True)
    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, admission)
    with pytest.raises(InvalidArgumentTypeError):
        await planner.plan("Continue")  # type: ignore[arg-type]
    assert admission.calls == []


# --- fragment roles ----------------------------------------------------------------------------


def test_every_fragment_carries_its_role() -> None:
    state = WorkingState(
        "Continue",
        objective="Ship the audit",
        next_action="Run the backfill",
        tasks=[Task("Run the backfill"), Task("done one", done=True), Task("Rotate keys")],
        open_questions=["Who signs off?"],
        constraints=["No Friday deploys"],
        facts=[Fact("Priya owns it", ["Priya", "Ship the audit"])],
    )
    query = compose_task_context(state, scope="s", principal="p")
    r = FragmentRole
    # The duplicate task and the entity equal to the objective are dropped: the first stands,
    # with its role.
    assert list(zip(query.fragments, query.roles, strict=True)) == [
        ("Continue", r.REQUEST), ("Run the backfill", r.NEXT_ACTION), ("Rotate keys", r.TASK),
        ("Who signs off?", r.QUESTION), ("Ship the audit", r.OBJECTIVE),
        ("No Friday deploys", r.CONSTRAINT), ("Priya", r.ENTITY),
    ]
    baseline = compose_baseline(state)
    assert baseline.roles == (r.OBJECTIVE, r.QUESTION, r.REQUEST)
    assert compose_search_call("vault keys").roles == (r.REQUEST,)
    assert compose_search_call("  ").roles == ()


def test_roles_do_not_change_the_fingerprint_and_are_checked() -> None:
    plain = RecallQuery(fragments=("a", "b"), strategy=QueryStrategy.TASK_CONTEXT,
                        baseline_reason=None)
    assert plain.roles == (FragmentRole.REQUEST, FragmentRole.REQUEST)  # left empty: requests
    roled = attrs.evolve(plain, roles=(FragmentRole.REQUEST, FragmentRole.TASK))
    assert roled.fingerprint == plain.fingerprint and roled.text == plain.text
    with pytest.raises(ValueError, match="one role per fragment"):
        RecallQuery(fragments=("a", "b"), strategy=QueryStrategy.TASK_CONTEXT,
                    baseline_reason=None, roles=(FragmentRole.TASK,))
    with pytest.raises(TypeError, match=r"roles\[0\] must be FragmentRole"):
        RecallQuery(fragments=("a",), strategy=QueryStrategy.TASK_CONTEXT,
                    baseline_reason=None, roles=("task",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"fragments\[1\] must be str"):
        RecallQuery(fragments=("a", 1),  # type: ignore[arg-type]
                    strategy=QueryStrategy.TASK_CONTEXT, baseline_reason=None)


@pytest.mark.parametrize("how", ["a blocking thread", "a shield", "a swallowed cancellation"])
async def test_an_admission_that_ignores_cancellation_still_gives_the_baseline_in_time(
    how: str,
) -> None:
    """A flag client called in a worker thread (which no cancellation stops), a shielded
    wait, or one that catches the cancellation and waits on: the plan still answers the
    baseline at its timeout, not when the admission ends."""
    import threading

    released, gate = threading.Event(), anyio.Event()

    async def admission(experiment: str) -> bool:
        if how == "a blocking thread":
            return await anyio.to_thread.run_sync(released.wait)
        if how == "a shield":
            with anyio.CancelScope(shield=True):
                await gate.wait()
            return True
        try:
            await gate.wait()
        except anyio.get_cancelled_exc_class():
            await gate.wait()
        return True

    async def watchdog() -> None:  # a plan that waits for the admission ends, and fails
        await anyio.sleep(5)
        released.set()
        gate.set()

    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, admission, admission_timeout_s=0.05)
    async with anyio.create_task_group() as group:
        group.start_soon(watchdog)
        query = await planner.plan(CONTINUATION)
        answered_alone = not released.is_set() and not gate.is_set()
        released.set()
        gate.set()
        group.cancel_scope.cancel()
    assert query.baseline_reason is BaselineReason.ADMISSION_TIMEOUT
    assert answered_alone  # at its timeout, not when the admission ended


def test_a_repeated_huge_text_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # A state that repeats one large string (75 open questions, one 1 MB text) costs the
    # composers one reading of it, not one per repeat: the baseline, built on every round as
    # the recent arm's control, has no byte bound that would skip the repeats for it.
    from plugin.memory import compose

    read: list[int] = []
    key = compose._dedup_key
    monkeypatch.setattr(compose, "_dedup_key", lambda text: read.append(len(text)) or key(text))
    big = "word " * 200_000
    state = WorkingState("Continue", open_questions=[big] * 75 + ["Which one?", big])
    query = compose_baseline(state)
    assert query.fragments == (big.strip(), "Which one?", "Continue")
    assert read == [len(big.strip()), len("Which one?"), len("Continue")]
    read.clear()
    assert compose_task_context(state).fragments == ("Continue",)  # two questions, both huge
    assert read == [len("Continue")]


def test_a_str_subclass_cannot_talk_the_composer_past_its_bound() -> None:
    # A str subclass whose methods lie (every text ASCII, strip keeping the subclass) is
    # stored as the plain text it holds: the bound counts real UTF-8 bytes, and a lone
    # surrogate it hides is still refused.
    class Liar(str):
        def isascii(self) -> bool:
            return True

        def strip(self, chars: str | None = None) -> Liar:
            return self

        def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
            return b""

    state = WorkingState(Liar("é" * 100), next_action=Liar("ü" * 200),
                         open_questions=[Liar("ø" * 10)], tasks=[Task(Liar("ß"))],
                         facts=[Fact(Liar("f"), [Liar("Ana")])])
    texts = (state.current_request, state.next_action, *state.open_questions,
             state.tasks[0].text, state.facts[0].text, *state.facts[0].entities)
    assert all(type(text) is str for text in texts)
    query = compose_task_context(state)  # 200 bytes, then 400 that do not fit
    assert query.fragments == ("é" * 100, "ß", "ø" * 10, "Ana")
    assert len(query.text.encode("utf-8")) <= 512
    with pytest.raises(InvalidArgumentError, match="lone surrogate"):
        WorkingState(Liar("a\ud800"))
    with pytest.raises(InvalidArgumentError, match="lone surrogate"):
        WorkingState.from_dict({"current_request": "x", "constraints": [Liar("\udfff")]})
