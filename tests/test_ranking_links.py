"""What ties a memory to the working state: names, ids and open questions outrank the next
action's common words, a bare "Continue" does not dilute the need in the state, and the fused
ranking is not below its best arm on the repository's hand-written scenarios."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from plugin import (
    Fact,
    Task,
    WorkingState,
    compose_task_context,
)
from plugin.evaluation import Evaluator, stream_scenarios
from plugin.evaluation.analysis import score_row, summarise
from plugin.memory import MemoryRecord
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.ranking import (
    RankingPolicy,
    fragment_weights,
    request_share,
    weighted_score_fuse,
)
from plugin.memory.store import Evidence

from ._ranking_env import RankingEnv, ranked, ranking_env

pytestmark = pytest.mark.anyio

P, S = "noor", "flat"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[RankingEnv]:
    async with ranking_env(tmp_path) as opened:
        yield opened


async def _ranked(env: RankingEnv, state: WorkingState, arms: set[str],
                  policy: RankingPolicy | None = None) -> list[str]:
    return await ranked(env, state, arms, policy, principal=P, scope=S)


# Six notes share the next action's common words ("draft", "booking", "home visit"); the two
# that matter share none of them: one names the referee of a fact by first name, the other
# answers the open question by its invoice id.
_NOTES = {
    "d1": "Draft the booking for the home visit to the Leipzig flat.",
    "d2": "Home visit booking draft: the cleaner comes on Tuesdays.",
    "d3": "Booking draft for a home visit by the insurance assessor.",
    "d4": "The home visit booking draft template lives in the shared drive.",
    "d5": "Home visit draft booking checklist for new tenants.",
    "d6": "Draft: home visit booking reminders go out on Mondays.",
    "name": "Ken prefers WhatsApp first and is free after 6pm.",
    "id": "INV-4471 was paid on 3 March; the landlord has the receipt.",
}
_STATE = WorkingState(
    "weiter",
    next_action="Draft the booking for the home visit",
    open_questions=("Was INV-4471 paid?",),
    facts=(Fact("Referee: Ken Lim", entities=("Ken Lim",)),),
)


@pytest.mark.parametrize("arms", [{"sparse"}, {"sparse", "semantic"}])
async def test_names_and_ids_outrank_the_next_actions_common_words(
    env: RankingEnv, arms: set[str],
) -> None:
    store, _ = env
    await store.add_memories([
        MemoryRecord(id=key, text=text, principal=P, scope=S, created_at=float(i))
        for i, (key, text) in enumerate(_NOTES.items())
    ])
    ranked = await _ranked(env, _STATE, arms)
    # bm25 alone puts both first; fused, the semantic arm may keep the one note that repeats
    # the whole next action among them.
    top = 2 if arms == {"sparse"} else 3
    assert {"name", "id"} <= set(ranked[:top]), ranked
    # Each of the two leads on its own too: the name without the question, the id without
    # the fact.
    alone = await _ranked(env, WorkingState(
        "weiter", next_action=_STATE.next_action, facts=_STATE.facts), arms)
    assert "name" in alone[: top - 1], alone
    alone = await _ranked(env, WorkingState(
        "weiter", next_action=_STATE.next_action, open_questions=_STATE.open_questions), arms)
    assert "id" in alone[: top - 1], alone


def test_named_entities_and_questions_outweigh_the_next_action() -> None:
    policy = RankingPolicy()
    query = compose_task_context(_STATE)
    weights = dict(zip(query.roles, fragment_weights(query, policy, request_share=0.0),
                       strict=True))
    by_role = {role.value: weight for role, weight in weights.items()}
    assert by_role["entity"] > by_role["next_action"]
    assert by_role["question"] > by_role["next_action"]


def test_a_go_on_word_the_scope_knows_does_not_dilute_the_need_in_the_state() -> None:
    # "Continue" occurs in a long conversation's notes, so one of its words is found: it keeps
    # a small share, well below the need in the state (the next action), which still leads.
    policy = RankingPolicy()
    query = compose_task_context(WorkingState(
        "Continue", next_action="When did Caroline go to the LGBTQ support group?"))
    share = request_share(1, policy)
    request, need = fragment_weights(query, policy, request_share=share)
    assert request <= need / 2


@pytest.mark.parametrize("half", ["handwritten_dev.jsonl", "handwritten_test.jsonl"])
async def test_fused_is_not_below_its_best_arm_on_the_hand_written_halves(half: str) -> None:
    # Continuation requests with the task-context query, over the offline hashing embedding.
    scored = []

    def collect(scenario, rows):  # type: ignore[no-untyped-def]
        scored.extend(score_row(row, scenario, (5,)) for row in rows)

    evaluator = Evaluator(embedding=HashingEmbedding(dimensions=512, token_limit=256))
    await evaluator.evaluate(stream_scenarios(EXAMPLES / half), on_scenario=collect)
    results = summarise(scored, (5,), resamples=10)["results"]
    for strategy in ("task_context",):
        fused = results["fused"][strategy]["continuation"]["recall@5"]
        best = max(results[arm][strategy]["continuation"]["recall@5"]
                   for arm in ("sparse", "semantic"))
        assert fused >= best - 1e-9, (strategy, fused, best)


# One note repeats the next action's words; the one that matters shares a word with each of
# three fields (the next action, a task, a constraint) and each field has a note of its own.
_BREADTH = {
    "echo": "Quartz worktop quote from Bauhaus, received and filed.",
    "task": "Undermount sink model: choose the Blanco one.",
    "rule": "Lead time three weeks at most, says the fitter.",
    "needed": "Marek cuts the worktop once he has the sink; lead about ten days.",
    "tiles": "Bathroom tiles arrived cracked.",
    "hob": "Electrician for the hob circuit booked.",
}
_BREADTH_STATE = WorkingState(
    "ok",
    next_action="Get the quote for the quartz worktop",
    tasks=(Task("Choose the undermount sink model"),),
    constraints=("Lead time under three weeks",),
)


async def test_a_note_several_fields_match_in_part_outranks_one_field_repeated(
    env: RankingEnv,
) -> None:
    store, _ = env
    await store.add_memories([
        MemoryRecord(id=key, text=text, principal=P, scope=S, created_at=float(i))
        for i, (key, text) in enumerate(_BREADTH.items())
    ])
    found = await _ranked(env, _BREADTH_STATE, {"sparse"})
    assert found[0] == "needed"
    # Summing the fragments' shares as they are puts the next action's echo and each field's
    # own note first, and the note the work needs last.
    linear = await _ranked(env, _BREADTH_STATE, {"sparse"}, RankingPolicy(fragment_power=1.0))
    assert linear.index("echo") < linear.index("needed")


# -- the measured alternatives stay available and correct ----------------------------------------


def _item(key: str, score: float) -> Evidence:
    return Evidence(id=key, kind="memory", text="t", score=score, arm="sparse",
                    principal=P, scope=S, created_at=0.0)


def test_fragment_lists_summed_by_share_or_by_bm25() -> None:
    # A fragment whose best match scores 10 (rare terms) and one whose best scores 2 (common
    # words): by share both best matches count 1; by bm25 the rare match counts five times more.
    rare = [_item("x", 10.0), _item("z", 9.0)]
    common = [_item("y", 2.0)]
    shares = weighted_score_fuse([(1.0, rare), (1.0, common)])
    assert [e.id for e in shares] == ["x", "y", "z"]
    raw = weighted_score_fuse([(1.0, rare), (1.0, common)], normalise=False)
    assert [(e.id, e.score) for e in raw] == [("x", 10.0), ("z", 9.0), ("y", 2.0)]
    # Raised to a power below 1, two partial matches outweigh one full match.
    half = [_item("x", 10.0), _item("h", 4.0)]
    other = [_item("y", 2.0), _item("h", 0.8)]
    assert [e.id for e in weighted_score_fuse([(1.0, half), (1.0, other)])] == ["x", "y", "h"]
    rooted = weighted_score_fuse([(1.0, half), (1.0, other)], power=0.5)
    assert [e.id for e in rooted] == ["h", "x", "y"]
    assert rooted[0].score == pytest.approx(2 * 0.4 ** 0.5)
    # Lists with no positive or no finite best contribute nothing (Evidence refuses an infinite
    # score when built; one set past its validators still ranks nothing).
    endless = _item("n", 1.0)
    object.__setattr__(endless, "score", float("inf"))
    assert weighted_score_fuse([(1.0, [endless]), (1.0, common)])[0].id == "y"


def test_policy_options_are_checked() -> None:
    with pytest.raises(ValueError):
        RankingPolicy(fragment_scores="tf")
    with pytest.raises(ValueError):
        RankingPolicy(request_power=-1.0)
    for power in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="fragment_power"):
            RankingPolicy(fragment_power=power)
