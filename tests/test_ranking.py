"""Ranking: content-free requests, fragment-weighted arms, weighted fusion, no lost terms."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt
import pytest

from plugin import (
    AttemptKind,
    ManualClock,
    QueryPlanner,
    QueryPreparation,
    QueryStrategy,
    RecallAllowance,
    RoundKind,
    SqliteLedger,
    Task,
    WorkingState,
    compose_task_context,
)
from plugin.memory import ContextCaps, MemoryRecord, MemoryRetriever, MemoryStore
from plugin.memory.enforce import search_attempt
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.preparation import PreparedRecall
from plugin.memory.ranking import (
    FTS_TERM_CAP,
    MAX_TERM_CHUNKS,
    RankingPolicy,
    combined_vector,
    fragment_weights,
    is_content_free,
    term_chunks,
    weighted_fuse,
    with_beliefs,
)
from plugin.memory.store import Evidence

pytestmark = pytest.mark.anyio

P, S = "ana", "atlas"
_RUNS = itertools.count()


async def _admit(experiment: str) -> bool:
    return True


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[MemoryStore, RecallAllowance]]:
    clock = ManualClock()
    async with SqliteLedger(tmp_path / "l.db") as ledger, MemoryStore(
        tmp_path / "m.db", embedding=HashingEmbedding(dimensions=512, token_limit=256),
        clock=clock,
    ) as store:
        yield store, RecallAllowance(ledger, clock=clock)


async def _prepare(store: MemoryStore, state: WorkingState,
                   strategy: QueryStrategy = QueryStrategy.TASK_CONTEXT) -> PreparedRecall:
    preparation = QueryPreparation(QueryPlanner(strategy, admission=_admit), store.embedding)
    return await preparation.prepare(state, scope=S, principal=P)


async def _ranked(env: tuple[MemoryStore, RecallAllowance], prepared: PreparedRecall,
                  arms: set[str], **retriever: object) -> tuple[list[str], tuple[str, ...]]:
    store, allowance = env
    caps = ContextCaps(max_items=20, max_bytes=100_000)
    async with allowance.round(f"r{next(_RUNS)}", RoundKind.DELIBERATE, slots=1) as permit:
        attempted = await search_attempt(
            permit, MemoryRetriever(store, arms=arms, **retriever),  # type: ignore[arg-type]
            prepared, kind=AttemptKind.BASE, caps=caps, nested_beliefs=False)
    return [item.id for item in attempted.found.evidence], attempted.found.notes


async def _add(store: MemoryStore, memories: dict[str, str]) -> None:
    await store.add_memories([
        MemoryRecord(id=memory_id, text=text, principal=P, scope=S, created_at=float(i))
        for i, (memory_id, text) in enumerate(memories.items())
    ])


# -- 1. a content-free request carries no ranking weight ----------------------------------------


@pytest.mark.parametrize("request_text", ["Continue", "go on", "do that", "yes", "ok, next",
                                          "  OK  ", "Continue, please", "sounds good, go ahead"])
def test_content_free_requests(request_text: str) -> None:
    assert is_content_free(request_text)


@pytest.mark.parametrize("request_text", ["Continue the billing migration", "do the backfill",
                                          "yes, rotate the keys", "Priya"])
def test_requests_with_content(request_text: str) -> None:
    assert not is_content_free(request_text)


def test_a_content_free_request_stays_in_the_query_but_weighs_nothing() -> None:
    state = WorkingState("Continue", next_action="Run the invoice backfill",
                         tasks=(Task("Rotate the keys"), Task("Write the runbook")))
    query = compose_task_context(state, scope=S, principal=P)
    assert query.fragments[0] == "Continue"  # fragment order, in the query text
    weights = fragment_weights(query, RankingPolicy(lead=4.0, decay=0.5))
    assert weights == (0.0, 4.0, 1.0, 0.5)  # the next action leads
    content = compose_task_context(attrs.evolve(state, current_request="Rotate the keys now"))
    assert fragment_weights(content, RankingPolicy(lead=4.0, decay=0.5))[:2] == (4.0, 1.0)


async def test_continue_does_not_rank_memories_that_say_continue(
    env: tuple[MemoryStore, RecallAllowance],
) -> None:
    store, _ = env
    await _add(store, {
        "c1": "Continue the standup notes tomorrow.", "c2": "We continue to use tabs.",
        "c3": "Continue reading the onboarding doc.", "c4": "Continue: the lunch poll.",
        "gold": "Invoice backfill trial: replay the archive on the staging copy.",
        "other": "Rotate the vault keys quarterly.",
    })
    state = WorkingState("Continue", next_action="Run the invoice backfill on staging",
                         tasks=(Task("Rotate the keys"),))
    silent = attrs.evolve(state, current_request="")
    for arms in ({"sparse"}, {"semantic"}, {"sparse", "semantic", "recent"}):
        ranked, _ = await _ranked(env, await _prepare(store, state), arms)
        assert ranked[0] == "gold", arms
        if "recent" not in arms:  # (the frozen control's baseline query does say "Continue")
            # "Continue" weighs exactly nothing: the ranking is the one without a request.
            assert ranked == (await _ranked(env, await _prepare(store, silent), arms))[0]
    sparse, _ = await _ranked(env, await _prepare(store, state), {"sparse"})
    assert not {"c1", "c2", "c3", "c4"} & set(sparse)  # not even searched


# -- 2. the semantic arm keeps the fragment structure -------------------------------------------


@attrs.define
class _Spy:
    """An adapter that records every embed call."""

    inner: HashingEmbedding
    calls: list[list[str]] = attrs.field(factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def token_limit(self) -> int:
        return self.inner.token_limit

    @property
    def dimensions(self) -> int:
        return self.inner.dimensions

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(list(texts))
        return self.inner.embed(texts)


_IN_FLIGHT = WorkingState(
    "How do we roll over the billing secrets?",
    next_action="Load-test the search index at peak traffic",
    tasks=(Task("Load-test the search index crawler"), Task("Tune the search index shards")),
    objective="Finish the search index hardening milestone",
)


async def test_fragment_vectors_are_prepared_once_with_the_query() -> None:
    spy = _Spy(HashingEmbedding(dimensions=256, token_limit=256))
    prepared = await QueryPreparation(
        QueryPlanner(QueryStrategy.TASK_CONTEXT, admission=_admit), spy
    ).prepare(_IN_FLIGHT, scope=S, principal=P)
    query = prepared.query
    assert spy.calls == [[query.text, *query.fragments]]  # one call, one query
    assert prepared.semantic.fingerprint == query.fingerprint
    assert len(prepared.semantic.fragment_vectors) == len(query.fragments)
    # Over the token limit: no vector, no fragment vectors (the fragments are in the text).
    tight = _Spy(HashingEmbedding(dimensions=256, token_limit=5))
    withheld = await QueryPreparation(
        QueryPlanner(QueryStrategy.TASK_CONTEXT, admission=_admit), tight
    ).prepare(_IN_FLIGHT, scope=S, principal=P)
    assert withheld.semantic.vector is None and withheld.semantic.fragment_vectors == ()
    assert tight.calls == []
    # The baseline (the frozen control) is ranked as a whole: its text alone is embedded.
    plain = _Spy(HashingEmbedding(dimensions=256, token_limit=256))
    baseline = await QueryPreparation(QueryPlanner(QueryStrategy.BASELINE), plain).prepare(
        _IN_FLIGHT, scope=S, principal=P)
    assert len(baseline.query.fragments) > 1 and baseline.semantic.fragment_vectors == ()
    assert plain.calls == [[baseline.query.text]]


async def test_a_self_contained_request_leads_the_semantic_arm_despite_work_in_flight(
    env: tuple[MemoryStore, RecallAllowance],
) -> None:
    store, _ = env
    await _add(store, {
        "gold": "Billing secrets roll over: issue new keys, then revoke the old pair.",
        "d1": "Search index load test at peak traffic: ramp with k6 from the perf box.",
        "d2": "Search index crawler crashed under load last quarter.",
        "d3": "Search index shards were tuned for the hardening milestone.",
    })
    ranked, _ = await _ranked(env, await _prepare(store, _IN_FLIGHT), {"semantic"})
    assert ranked[0] == "gold"
    # The same request without the in-flight task finds it too (a sanity check of the setup).
    alone, _ = await _ranked(env, await _prepare(store, WorkingState(
        _IN_FLIGHT.current_request)), {"semantic"})
    assert alone[0] == "gold"


def test_the_combined_vector_ranks_by_the_weighted_sum_of_cosines() -> None:
    rng = np.random.default_rng(3)
    fragments = rng.normal(size=(3, 16)).astype(np.float32)
    fragments /= np.linalg.norm(fragments, axis=1, keepdims=True)
    memories = rng.normal(size=(20, 16)).astype(np.float32)
    memories /= np.linalg.norm(memories, axis=1, keepdims=True)
    weights = (3.0, 1.0, 0.0)
    combined = combined_vector(list(fragments), weights)
    assert combined is not None and abs(float(np.linalg.norm(combined)) - 1.0) < 1e-5
    direct = (memories @ fragments.T) @ np.asarray(weights, dtype=np.float32)
    assert list(np.argsort(-(memories @ combined))) == list(np.argsort(-direct))
    assert combined_vector(list(fragments), (0.0, 0.0, 0.0)) is None


# -- 3. fusion: weighted arms, recency only breaks ties -----------------------------------------


def _ev(i: int, created: float = 0.0) -> Evidence:
    return Evidence(id=f"e{i}", kind="memory", text=f"t{i}", score=1.0, arm="sparse",
                    principal=P, scope=S, created_at=created)


def test_weighted_fusion_and_the_recent_tie_breaker() -> None:
    a, b, c, d = _ev(1), _ev(2), _ev(3), _ev(4)
    # b is first on the heavier arm; a first on the lighter one.
    assert [e.id for e in weighted_fuse([(1.0, [a, b]), (2.0, [b, a])])] == ["e2", "e1"]
    # Equal scores: the recent order breaks the tie (not the id).
    tied = weighted_fuse([(1.0, [a]), (1.0, [b])], tie_breaker=[b, a])
    assert [e.id for e in tied] == ["e2", "e1"]
    # Recency never outvotes: an item only the recent arm has comes after everything found.
    fused = weighted_fuse([(1.0, [a, b, c])], tie_breaker=[d, c])
    assert [e.id for e in fused] == ["e1", "e2", "e3", "e4"]
    # A weight of 0 contributes nothing.
    assert [e.id for e in weighted_fuse([(0.0, [a]), (1.0, [b])])] == ["e2"]


# -- 4. no silent loss under the FTS term cap --------------------------------------------------


def test_terms_are_split_into_fts_sized_chunks() -> None:
    terms = [f"w{i}" for i in range(FTS_TERM_CAP + 8)]
    chunks, lost = term_chunks(terms)
    assert [len(c.split()) for c in chunks] == [FTS_TERM_CAP, 8] and lost == 0
    many = [f"w{i}" for i in range(FTS_TERM_CAP * MAX_TERM_CHUNKS + 5)]
    chunks, lost = term_chunks(many)
    assert len(chunks) == MAX_TERM_CHUNKS and lost == 5


async def test_a_late_fragment_is_searched_even_after_32_terms(
    env: tuple[MemoryStore, RecallAllowance],
) -> None:
    store, _ = env
    await _add(store, {"gold": "Zorblax owns the quarterly audit.",
                       "other": "Lunch is at noon."})
    words = [f"alpha{i}" for i in range(40)]
    state = WorkingState(" ".join(words[:20]), next_action=" ".join(words[20:]),
                         facts=())
    state = attrs.evolve(state, objective="Zorblax audit")
    query = (await _prepare(store, state)).query
    assert query.fragments[-1] == "Zorblax audit" and len(query.text.split()) > FTS_TERM_CAP
    ranked, notes = await _ranked(env, await _prepare(store, state), {"sparse"})
    assert ranked == ["gold"] and not notes


async def test_terms_beyond_the_chunks_are_reported_not_lost_silently(
    env: tuple[MemoryStore, RecallAllowance],
) -> None:
    store, _ = env
    await _add(store, {"gold": "w140 is the word."})
    text = " ".join(f"w{i}" for i in range(FTS_TERM_CAP * MAX_TERM_CHUNKS + 20))
    prepared = await _prepare(store, WorkingState(text), QueryStrategy.BASELINE)
    ranked, notes = await _ranked(env, prepared, {"sparse"})
    assert ranked == []  # w140 is past the four chunks...
    assert any("20 query terms beyond the FTS term cap left out" in n for n in notes)  # ...said


# -- the floor ----------------------------------------------------------------------------------


async def test_the_relative_floor_keeps_a_combined_vector_from_running_short(
    env: tuple[MemoryStore, RecallAllowance],
) -> None:
    store, _ = env
    await _add(store, {f"m{i}": f"invoice note {i} about the staging backfill"
                       for i in range(6)})
    state = WorkingState("Continue", next_action="Run the invoice backfill on staging",
                         tasks=(Task("Rotate the vault keys"), Task("Write the runbook")),
                         objective="Ship the quarterly audit for the regional office")
    prepared = await _prepare(store, state)
    strict, _ = await _ranked(env, prepared, {"semantic"}, min_similarity=0.9,
                              ranking=RankingPolicy(relative_floor=0.0))
    relative, _ = await _ranked(env, prepared, {"semantic"}, min_similarity=0.9)
    assert strict == [] and len(relative) == 6  # the default keeps half the best score


# -- pointers and beliefs ----------------------------------------------------------------------


@pytest.mark.parametrize("request_text", ["Do the next one", "Can you pick that up again?",
                                          "Let's do that now, the one Priya raised"])
def test_a_request_that_points_back_keeps_a_weight_but_does_not_lead(request_text: str) -> None:
    state = WorkingState(request_text, next_action="Run the invoice backfill",
                         tasks=(Task("Rotate the keys"),))
    weights = fragment_weights(compose_task_context(state), RankingPolicy(lead=4.0, decay=0.5))
    assert weights == (1.0, 4.0, 1.0)


def test_beliefs_join_after_the_best_evidence_and_alternate() -> None:
    memories = [_ev(i) for i in range(1, 9)]
    beliefs = [attrs.evolve(_ev(90 + i), kind="belief") for i in range(3)]
    merged = with_beliefs(memories, beliefs, after=5)
    assert [e.id for e in merged[:5]] == ["e1", "e2", "e3", "e4", "e5"]
    assert [e.id for e in merged[5:]] == ["e90", "e6", "e91", "e7", "e92", "e8"]
    assert [e.id for e in with_beliefs(memories[:2], beliefs, after=5)] == [
        "e1", "e2", "e90", "e91", "e92"]
    assert with_beliefs(memories, [], after=5) == memories
