"""Ranking: role weights, content-free requests measured on the scope, fusion by confidence,
no semantic floor, beliefs by relevance, no lost terms."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin import (
    Fact,
    QueryPlanner,
    QueryPreparation,
    QueryStrategy,
    Task,
    WorkingState,
    compose_task_context,
)
from plugin.memory import MemoryRecord, MemoryStore
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.planning import FragmentRole
from plugin.memory.preparation import PreparedRecall
from plugin.memory.ranking import (
    FTS_TERM_CAP,
    MAX_TERM_CHUNKS,
    RankingPolicy,
    combined_vector,
    fragment_terms,
    fragment_weights,
    peakedness,
    request_share,
    request_terms,
    score_fuse,
    search_terms,
    term_chunks,
    weighted_fuse,
    with_beliefs,
)
from plugin.memory.store import Evidence
from plugin.memory.terms import ACKNOWLEDGEMENTS, STOPWORDS, request_content, word_terms

from ._ranking_env import RankingEnv, admit, prepare, ranking_env, search

pytestmark = pytest.mark.anyio

P, S = "ana", "atlas"


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[RankingEnv]:
    async with ranking_env(tmp_path) as opened:
        yield opened


async def _prepare(store: MemoryStore, state: WorkingState,
                   strategy: QueryStrategy = QueryStrategy.TASK_CONTEXT) -> PreparedRecall:
    return await prepare(store, state, principal=P, scope=S, strategy=strategy)


async def _ranked(env: RankingEnv, prepared: PreparedRecall, arms: set[str],
                  **retriever: object) -> tuple[list[str], tuple[str, ...]]:
    return await search(env, prepared, arms, **retriever)


async def _add(store: MemoryStore, memories: dict[str, str]) -> None:
    await store.add_memories([
        MemoryRecord(id=memory_id, text=text, principal=P, scope=S, created_at=float(i))
        for i, (memory_id, text) in enumerate(memories.items())
    ])


# -- 1. weights by role; a content-free request is measured on the scope ----------------------


_WORK = {
    "gold": "Invoice backfill trial: replay the archive on the staging copy.",
    "other": "Rotate the vault keys quarterly.",
    "d1": "Lunch poll for the offsite.",
    "d2": "The staging copy is refreshed nightly.",
}


# Notes that hold the words people say when they only mean "go on".
_CHATTY = {
    **_WORK,
    "gym": "Keep going to the gym next week; it looks good and works great, thanks.",
    "move": "Carry on with the move on Friday; sure, sounds fine.",
}


@pytest.mark.parametrize(("notes", "request_text"), [
    # None of the request's words occurs in the scope's memories, in any language.
    *((_WORK, text) for text in ("weiter", "Weiter bitte", "ok, next step please", "vas-y",
                                 "continúa, por favor", "dale", "jatka", "  OK  ",
                                 "sounds good, go ahead")),
    # Acknowledgements and go-on words the scope's notes do use, short and long.
    *((_CHATTY, text) for text in ("ok next", "sounds good, go ahead", "yeah that works, next",
                                   "ok so, um, keep going I guess",
                                   "alright, that all looks good to me, please carry on",
                                   "d'accord, on y va, continue comme prévu")),
    (_CHATTY, "fnord wibble blorp quux zarg"),  # long, and not one word the scope holds
    (_CHATTY, 'NEAR("zq" "xv") OR * AND NOT ^col: "fnord" -- \'; DROP TABLE memories'),
])
async def test_a_go_on_request_weighs_nothing(
    env: RankingEnv, notes: dict[str, str], request_text: str,
) -> None:
    # Acknowledgements carry no content even where the notes use them, and a request of any
    # length none of whose other words occurs in the scope carries none either: the ranking
    # is exactly the one without a request, on every arm.
    store, _ = env
    await _add(store, notes)
    state = WorkingState(request_text, next_action="Run the invoice backfill on staging",
                         tasks=(Task("Rotate the keys"),))
    silent = attrs.evolve(state, current_request="")
    for arms in ({"sparse"}, {"semantic"}, {"sparse", "semantic"}):
        ranked, _ = await _ranked(env, await _prepare(store, state), arms)
        assert ranked[0] == "gold", arms
        assert ranked == (await _ranked(env, await _prepare(store, silent), arms))[0], arms


async def test_a_short_request_the_scope_knows_leads(
    env: RankingEnv,
) -> None:
    store, _ = env
    await _add(store, {**_WORK, "vault": "Vault audit: the quarterly vault report is due."})
    state = WorkingState("vault audit?", next_action="Run the invoice backfill on staging",
                         tasks=(Task("Write the runbook"),))
    for arms in ({"sparse"}, {"sparse", "semantic"}):
        ranked, _ = await _ranked(env, await _prepare(store, state), arms)
        assert ranked[0] == "vault", arms


@pytest.mark.parametrize("request_text", [
    "ok great, next: when is the quarterly vault audit due?",
    "Totally unrelated, sorry: who signs the vault audit report this quarter?",
])
async def test_a_long_request_with_a_word_the_scope_knows_leads(
    env: RankingEnv, request_text: str,
) -> None:
    store, _ = env
    await _add(store, {**_CHATTY, "vault": "Vault audit: the quarterly vault report is due."})
    state = WorkingState(request_text, next_action="Run the invoice backfill on staging",
                         tasks=(Task("Write the runbook"),))
    for arms in ({"sparse"}, {"semantic"}, {"sparse", "semantic"}):
        ranked, _ = await _ranked(env, await _prepare(store, state), arms)
        assert ranked[0] == "vault", arms


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(ACKNOWLEDGEMENTS | STOPWORDS)),
                          st.sampled_from(["", ",", "!", " -", "..."]), st.booleans()),
                min_size=1, max_size=12))
def test_acknowledgements_and_function_words_are_never_content(
    words: list[tuple[str, str, bool]],
) -> None:
    request = " ".join((word.upper() if loud else word) + mark for word, mark, loud in words)
    assert request_content(word_terms(request, limit=64)) == ()
    assert request_terms(request)[0] == ()


def test_request_terms() -> None:
    assert request_terms("Vault audit, bitte!") == (("vault", "audit"), True)
    # Acknowledgements, go-on words and single letters are not content, in any language.
    assert request_terms("Weiter, bitte!") == ((), True)
    assert request_terms("ok, go on") == ((), True)
    assert request_terms("let's go") == ((), True)
    assert request_terms("kyllä, jatka") == ((), True)
    assert request_terms("please rotate the billing keys before the audit") == (
        ("rotate", "billing", "keys", "audit"), False)
    policy = RankingPolicy(request_terms=2)
    assert [request_share(n, policy) for n in (0, 1, 2, 5)] == [0.0, 0.25, 1.0, 1.0]


def test_weights_follow_roles_not_positions() -> None:
    state = WorkingState("Continue", next_action="Run the invoice backfill",
                         tasks=(Task("Rotate the keys"), Task("Write the runbook")),
                         open_questions=("Who signs off?",), objective="Ship the audit")
    query = compose_task_context(state, scope=S, principal=P)
    assert query.fragments[0] == "Continue"  # the contract's order, in the query text
    assert query.roles == (FragmentRole.REQUEST, FragmentRole.NEXT_ACTION, FragmentRole.TASK,
                           FragmentRole.TASK, FragmentRole.QUESTION, FragmentRole.OBJECTIVE)
    policy = RankingPolicy(request=4.0, next_action=1.0, task=1.0, question=0.8,
                           objective=0.5, context=0.25)
    # No content in the request: every other field keeps its whole weight, none decays.
    free = fragment_weights(query, policy, request_share=0.0)
    assert free == pytest.approx((0.0, 1.0, 2**-0.5, 2**-0.5, 0.8, 0.5))
    # A task's weight does not depend on where it stands: a question first does not lead.
    moved = attrs.evolve(state, tasks=(), open_questions=("Who signs off?",))
    moved_query = compose_task_context(moved)
    assert fragment_weights(moved_query, policy, request_share=0.0)[2] == pytest.approx(0.8)
    # A request with content leads; the other fields keep the context share.
    full = fragment_weights(query, policy, request_share=1.0)
    assert full == pytest.approx((4.0, 0.25, 0.25 * 2**-0.5, 0.25 * 2**-0.5, 0.2, 0.125))


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
        QueryPlanner(QueryStrategy.TASK_CONTEXT, admission=admit), spy
    ).prepare(_IN_FLIGHT, scope=S, principal=P)
    query = prepared.query
    assert spy.calls == [[query.text, *query.fragments]]  # one call, one query
    assert prepared.semantic.fingerprint == query.fingerprint
    assert len(prepared.semantic.fragment_vectors) == len(query.fragments)
    # Over the token limit: no vector, no fragment vectors (the fragments are in the text).
    tight = _Spy(HashingEmbedding(dimensions=256, token_limit=5))
    withheld = await QueryPreparation(
        QueryPlanner(QueryStrategy.TASK_CONTEXT, admission=admit), tight
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
    env: RankingEnv,
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


async def test_a_word_the_fields_repeat_counts_once_in_the_sparse_arm(
    env: RankingEnv,
) -> None:
    # "pump" is in the objective, the next action, a task and the question; the note that
    # names the serviceman's firm shares only the name with the state. Counted once per
    # fragment, the common word lifted the heat pump at home above the firm.
    store, _ = env
    await _add(store, {
        "gold": "Pumppuhuolto: Reijo books Saturdays if you call a week ahead.",
        "home": "The heat pump at home was serviced in September.",
        "warranty": "Pump receipt: three-year warranty, ran out in June.",
        "f1": "Birch pollen allergy, so May is rough.",
        "f2": "Firewood delivered on 12 May.",
        "f3": "Midsummer guests: Mikko's sister and kids.",
    })
    state = WorkingState(
        "jatka", objective="Get the cottage pump ready for the season",
        next_action="Call the pump serviceman before the water goes back on",
        tasks=(Task("Pump service"), Task("Launch the rowing boat")),
        open_questions=("Is the pump still under warranty?",),
        facts=(Fact("Pump maintenance: Pumppuhuolto", ("Pumppuhuolto",)),
               Fact("Cottage at Längelmävesi, Kangasala", ("Längelmävesi", "Kangasala"))),
    )
    ranked, _ = await _ranked(env, await _prepare(store, state), {"sparse"})
    assert ranked.index("gold") < ranked.index("home")


def test_fragment_terms_give_each_term_to_its_heaviest_fragment() -> None:
    parts = fragment_terms(["pump service", "call the pump man", "Pump warranty?", "Reijo"],
                           [1.0, 1.0, 2.0, 1.0])
    assert parts == [(2.0, ("pump", "warranty")), (1.0, ("service",)),
                     (1.0, ("call", "man")), (1.0, ("reijo",))]
    # A fragment whose every term a heavier one holds is left out; weight 0 is never searched.
    assert fragment_terms(["pump", "the pump", "x y"], [1.0, 2.0, 0.0]) == [(2.0, ("pump",))]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet="abc dé,Ω", max_size=12),
                          st.sampled_from([0.0, 0.5, 1.0, 2.0])), max_size=6))
def test_fragment_terms_searches_every_term_once_in_a_heaviest_fragment(
    pairs: list[tuple[str, float]],
) -> None:
    fragments = [text for text, _ in pairs]
    weights = [weight for _, weight in pairs]
    parts = fragment_terms(fragments, weights)
    searched = [term for _, terms in parts for term in terms]
    assert len(searched) == len(set(searched))
    assert [w for w, _ in parts] == sorted((w for w, _ in parts), reverse=True)
    held = {term for text, weight in pairs if weight > 0 for term in search_terms(text)}
    assert set(searched) == held
    for weight, terms in parts:
        for term in terms:
            assert weight == max(w for text, w in pairs if term in search_terms(text))


def test_terms_are_split_into_fts_sized_chunks() -> None:
    terms = [f"w{i}" for i in range(FTS_TERM_CAP + 8)]
    chunks, lost = term_chunks(terms)
    assert [len(c.split()) for c in chunks] == [FTS_TERM_CAP, 8] and lost == 0
    many = [f"w{i}" for i in range(FTS_TERM_CAP * MAX_TERM_CHUNKS + 5)]
    chunks, lost = term_chunks(many)
    assert len(chunks) == MAX_TERM_CHUNKS and lost == 5


async def test_a_late_fragment_is_searched_even_after_32_terms(
    env: RankingEnv,
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
    env: RankingEnv,
) -> None:
    store, _ = env
    await _add(store, {"gold": "w140 is the word."})
    text = " ".join(f"w{i}" for i in range(FTS_TERM_CAP * MAX_TERM_CHUNKS + 20))
    prepared = await _prepare(store, WorkingState(text), QueryStrategy.BASELINE)
    ranked, notes = await _ranked(env, prepared, {"sparse"})
    assert ranked == []  # w140 is past the four chunks...
    assert any("20 query terms beyond the FTS term cap left out" in n for n in notes)  # ...said


# -- no semantic floor ---------------------------------------------------------------------------


async def test_the_semantic_arm_keeps_its_candidates_for_a_composed_query(
    env: RankingEnv,
) -> None:
    store, _ = env
    await _add(store, {
        **{f"m{i}": f"invoice note {i} about the staging backfill" for i in range(6)},
        **{f"x{i}": f"lunch poll {i} for the offsite picnic" for i in range(4)},
    })
    state = WorkingState("Continue", next_action="Run the invoice backfill on staging",
                         tasks=(Task("Rotate the vault keys"), Task("Write the runbook")),
                         objective="Ship the quarterly audit for the regional office")
    prepared = await _prepare(store, state)
    ranked, _ = await _ranked(env, prepared, {"semantic"})
    # No floor: the arm ranks every candidate, even those far below its best (an absolute or
    # relative floor dropped the unrelated ones, and with them a composed query's long tail).
    assert len(ranked) == 10 and set(ranked[:6]) == {f"m{i}" for i in range(6)}
    floored, _ = await _ranked(env, prepared, {"semantic"}, min_similarity=0.99)
    assert floored == []  # an explicit absolute floor still applies


# -- fusion by confidence -----------------------------------------------------------------------


def _scored(prefix: str, scores: Sequence[float]) -> list[Evidence]:
    return [Evidence(id=f"{prefix}{i}", kind="memory", text="t", score=score, arm="sparse",
                     principal=P, scope=S, created_at=0.0) for i, score in enumerate(scores)]


def test_peakedness() -> None:
    assert peakedness([]) == 0.0
    flat = _scored("f", [0.63, 0.62, 0.6, 0.58, 0.55, 0.52, 0.5, 0.48, 0.46, 0.45])
    peaked = _scored("p", [12.0, 5.0, 4.0, 3.5, 3.0, 2.9, 2.8, 2.7, 2.6, 2.5])
    assert peakedness(flat) == pytest.approx((0.63 - 0.45) / 0.63)
    assert peakedness(peaked) == pytest.approx((12.0 - 2.5) / 12.0)
    assert peakedness(_scored("s", [3.0, 1.0])) == 1.0  # a short list is confident
    assert peakedness(_scored("n", [-1.0, -2.0])) == 0.0


def test_the_confident_arm_outvotes_a_compressed_one() -> None:
    # bm25 is sure of "gold"; the semantic arm's cosines are compressed (0.63 .. 0.45) and it
    # ranks "a" and "b" (sparse's runners-up) high, "gold" not at all. Reciprocal-rank fusion,
    # equal or peakedness-weighted, lets the items both arms rank second win; fusion by the
    # arms' own score shares keeps sparse's first place first.
    sparse = _scored("s", [12.0, 5.0, 4.5, 4.0])
    gold, a, b = sparse[0], sparse[1], sparse[2]
    semantic = [attrs.evolve(b, score=0.63), attrs.evolve(a, score=0.62),
                *_scored("c", [0.6, 0.58, 0.55, 0.52, 0.5, 0.48, 0.45])]
    arms = [(1.0, sparse), (1.0, semantic)]
    assert weighted_fuse(arms)[0].id != gold.id
    confident = [(peakedness(sparse), sparse), (peakedness(semantic), semantic)]
    assert weighted_fuse(confident)[0].id != gold.id
    fused = score_fuse(arms)
    assert [e.id for e in fused[:3]] == [gold.id, a.id, b.id]
    # The default fusion (k = 10, semantic weight 0.5 times peakedness): an item both arms
    # rank fifth does not beat sparse's first place, as it does at k = 60 with equal weights.
    policy = RankingPolicy()
    middle = _scored("m", [3.9])[0]
    sparse5 = [*sparse, attrs.evolve(middle, score=3.9)]
    flat = [*_scored("f", [0.64, 0.63, 0.62, 0.61]), attrs.evolve(middle, score=0.6),
            *_scored("g", [0.55, 0.52, 0.5, 0.48, 0.45])]
    assert weighted_fuse([(1.0, sparse5), (1.0, flat)])[0].id == middle.id
    lists = [(policy.sparse * peakedness(sparse5), sparse5),
             (policy.semantic * peakedness(flat), flat)]
    assert weighted_fuse(lists, k=policy.rrf_k)[0].id == gold.id
    # A semantic arm that is sure of something still moves it up.
    sure = [attrs.evolve(b, score=0.9), *_scored("d", [0.3, 0.2, 0.1])]
    assert score_fuse([(1.0, sparse), (1.0, sure)])[0].id == b.id
    # The recent arm only breaks ties and never outvotes.
    late = _scored("r", [1.0])
    assert score_fuse(arms, tie_breaker=late)[-1].id == "r0"


# -- pointers and beliefs ----------------------------------------------------------------------


def test_beliefs_join_by_relevance() -> None:
    query = compose_task_context(WorkingState(
        "What does Priya think about the vendor contract renewal?"))
    memories = [attrs.evolve(_ev(i), text=text) for i, text in enumerate([
        "Vendor contract renewal is due in March.", "Lunch on Friday.", "Parking rules.",
        "Printer on floor 3.", "Holiday calendar.", "Badge access.", "Coffee machine."], 1)]
    relevant = attrs.evolve(_ev(90), kind="belief",
                            text="Priya thinks the vendor contract renewal is overpriced.")
    named = attrs.evolve(_ev(91), kind="belief", text="Priya prefers tea.")
    unrelated = attrs.evolve(_ev(92), kind="belief", text="Likes hiking.")
    merged = [e.id for e in with_beliefs(memories, [unrelated, named, relevant], query=query)]
    # Ranked among the evidence by how much of the query they cover: the belief about the
    # renewal right after the one memory about it, the one that only names Priya next; the
    # one that shares nothing after five items.
    assert merged == ["e1", "e90", "e91", "e2", "e3", "e92", "e4", "e5", "e6", "e7"]
    # Without a query the old merge stands: after five items, alternating.
    plain = [e.id for e in with_beliefs(memories, [relevant, named], after=5)]
    assert plain == ["e1", "e2", "e3", "e4", "e5", "e90", "e6", "e91", "e7"]
    assert with_beliefs(memories, [], query=query) == memories


def test_beliefs_that_share_nothing_with_the_query_come_after_five() -> None:
    memories = [_ev(i) for i in range(1, 9)]
    beliefs = [attrs.evolve(_ev(90 + i), kind="belief") for i in range(3)]
    merged = with_beliefs(memories, beliefs, after=5)
    assert [e.id for e in merged[:5]] == ["e1", "e2", "e3", "e4", "e5"]
    assert [e.id for e in merged[5:]] == ["e90", "e6", "e91", "e7", "e92", "e8"]
    assert [e.id for e in with_beliefs(memories[:2], beliefs, after=5)] == [
        "e1", "e2", "e90", "e91", "e92"]
    assert with_beliefs(memories, [], after=5) == memories
