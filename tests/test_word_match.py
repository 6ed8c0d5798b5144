"""The semantic arm's word-level match: each query word against the nearest word of a memory,
weighted by its rarity in the cell, mixed with the sentence cosine."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin import Fact, RecallAllowance, SqliteLedger, WorkingState
from plugin.control.clock import ManualClock
from plugin.memory import pipeline as pipeline_module
from plugin.memory.fusion import weighted_fuse
from plugin.memory.ranking import RankingPolicy
from plugin.memory.store import Evidence, MemoryStore, MemoryWrite, WordQuery
from plugin.memory.store import vectors as vectors_module
from plugin.memory.store.words import (
    MAX_WORDS,
    WordIndex,
    WordVectors,
    match_words,
    word_level,
)

from ._ranking_env import RankingEnv, prepare, search

pytestmark = pytest.mark.anyio

ME = {"principal": "u1", "scope": "proj"}
DIMENSIONS = 64
SYNONYMS = {"vegetarian": "dietary", "vegan": "dietary", "pins": "hardware"}
"""Words the test model places next to another (a paraphrase it knows)."""


def _word_vector(word: str) -> npt.NDArray[np.float32]:
    base = SYNONYMS.get(word, word)
    digest = hashlib.blake2b(base.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    seed = int.from_bytes(digest, "little")
    vector = np.random.default_rng(seed).standard_normal(DIMENSIONS).astype(np.float32)
    if base != word:  # close to its synonym, not the same
        noise = np.random.default_rng(seed + 1).standard_normal(DIMENSIONS).astype(np.float32)
        vector = vector + 0.3 * noise
    unit: npt.NDArray[np.float32] = vector / np.linalg.norm(vector)
    return unit


@attrs.frozen
class StaticWords:
    """A model like WordLlama: a text's vector is the mean of its words' static vectors."""

    word_level: ClassVar[bool] = True
    dimensions: int = DIMENSIONS
    token_limit: int = 256
    flat: bool = False
    """Every text of more than one word gets the same vector (the cosine ties everywhere),
    while single words keep theirs: the words decide."""

    @property
    def name(self) -> str:
        return f"static-words-{self.flat}"

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        out = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        for row, text in enumerate(texts):
            words = [w.strip(".,:;!?").lower() for w in text.split()]
            vectors = [_word_vector(w) for w in words if w]
            if self.flat and len(words) > 1:
                vectors = [_word_vector("the same for every text")]
            if vectors:
                mean = np.mean(vectors, axis=0)
                out[row] = mean / np.linalg.norm(mean)
        return out


@pytest.fixture
async def flat_store(tmp_path: Path) -> AsyncIterator[MemoryStore]:
    async with MemoryStore(tmp_path / "m.db", embedding=StaticWords(flat=True),
                           clock=ManualClock(wall=1_000.0)) as store:
        yield store


async def found(store: MemoryStore, query: str, *, share: float | None = 0.5,
                fragments: tuple[tuple[str, float], ...] | None = None) -> list[str]:
    assert store.embedding is not None
    vector = store.embedding.embed([query])[0]
    words = None if share is None else WordQuery(fragments or ((query, 1.0),), share)
    return [item.id for item in await store.semantic_candidates(vector, limit=10, words=words,
                                                                **ME)]


async def seed(store: MemoryStore, notes: dict[str, str]) -> None:
    for id, text in notes.items():
        await store.remember(text, id=id, **ME)


def test_match_words_are_the_distinct_content_words() -> None:
    assert match_words("The Cutover of EXPORT_DBS, the cutover; a b 7 at 06:00") == (
        "cutover", "export_dbs", "06", "00")
    assert match_words("") == ()
    assert match_words("\ud800 lone surrogate") == ("lone", "surrogate")
    many = " ".join(f"w{i}" for i in range(10 * MAX_WORDS))
    assert match_words(many) == tuple(f"w{i}" for i in range(MAX_WORDS))
    assert match_words("x" * 10_000_000 + " tail") == ()  # the first 16 KiB: one blob
    assert match_words("sha " + "f" * 64 + " " + "g" * 101) == ("sha", "f" * 64)


def test_only_adapters_that_say_so_match_words() -> None:
    from plugin.memory.hashing import HashingEmbedding

    assert word_level(StaticWords())
    assert not word_level(HashingEmbedding())
    assert not word_level(object())


def test_policy_share_of_words_is_checked() -> None:
    assert RankingPolicy().words == 0.5
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="words"):
            RankingPolicy(words=bad)
    for share in (0.0, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="share"):
            WordQuery((("x", 1.0),), share)
    for weight in (-1.0, float("inf"), float("nan"), False):
        with pytest.raises(ValueError, match="weight"):
            WordQuery((("x", weight),), 0.5)
    with pytest.raises(TypeError, match="str"):
        WordQuery(((b"x", 1.0),), 0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most 64 fragments"):
        WordQuery((("x", 1.0),) * 65, 0.5)


def test_a_rare_word_outweighs_a_common_one() -> None:
    texts = ["invoice paid", "invoice sent", "invoice late", "zanzibar trip", "invoice due"]
    vectors = WordVectors(StaticWords().embed)
    index = WordIndex.build(texts, vectors)
    scores = index.scores(WordQuery((("zanzibar invoice", 1.0),), 1.0), vectors)
    assert int(np.argmax(scores)) == 3
    assert scores[3] > 1.5 * scores[0]


def test_a_close_word_counts_and_an_unrelated_one_does_not() -> None:
    texts = ["19 vegetarian and 7 vegan guests", "parking at the north gate"]
    vectors = WordVectors(StaticWords().embed)
    scores = WordIndex.build(texts, vectors).scores(
        WordQuery((("dietary requirements", 1.0),), 1.0), vectors)
    assert scores[0] > 0.3 and scores[0] > 3 * scores[1]


def test_no_words_score_nothing() -> None:
    vectors = WordVectors(StaticWords().embed)
    index = WordIndex.build(["alpha", "", "beta"], vectors)
    for query in ((("the a of", 1.0),), (("", 1.0),), (("alpha", 0.0),), ()):
        assert not index.scores(WordQuery(query, 1.0), vectors).any()
    assert index.scores(WordQuery((("alpha", 1.0),), 1.0), vectors).tolist()[1] == 0.0
    assert not WordIndex.build([], vectors).scores(WordQuery((("alpha", 1.0),), 1.0),
                                                   vectors).any()


@settings(max_examples=60, deadline=None)
@given(first=st.lists(st.text(alphabet="abcd efgh", max_size=20), max_size=6),
       then=st.lists(st.text(alphabet="abcd ijkl", max_size=20), max_size=6))
def test_an_extended_index_is_the_index_of_all_the_texts(first: list[str],
                                                         then: list[str]) -> None:
    vectors = WordVectors(StaticWords().embed)
    grown = WordIndex.build(first, vectors).extended(then, vectors)
    whole = WordIndex.build(first + then, vectors)
    assert grown.vocabulary == whole.vocabulary
    for field in ("vectors", "document_frequency", "flat", "starts"):
        np.testing.assert_array_equal(getattr(grown, field), getattr(whole, field))


def test_word_vectors_keep_the_most_recent() -> None:
    calls: list[list[str]] = []

    def embed(words: Sequence[str]) -> npt.NDArray[np.float32]:
        calls.append(list(words))
        return StaticWords().embed(words)

    vectors = WordVectors(embed, capacity=2)
    vectors.of(["a1", "b1"])
    vectors.of(["a1", "c1"])  # b1 is the least recently used: forgotten
    vectors.of(["a1", "b1"])
    assert calls == [["a1", "b1"], ["c1"], ["b1"]]


def test_words_another_thread_evicts_are_embedded_again() -> None:
    model = StaticWords()
    vectors = WordVectors(model.embed, capacity=50)
    words = [f"w{i}" for i in range(200)]
    failures: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                asked = [words[i] for i in rng.integers(0, len(words), size=20)]
                np.testing.assert_allclose(vectors.of(asked), model.embed(asked), atol=1e-6)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


async def test_the_words_decide_where_the_cosine_ties(flat_store: MemoryStore) -> None:
    await seed(flat_store, {"m1": "Invoice paid", "m2": "Invoice sent",
                            "m3": "Trip to Zanzibar booked", "m4": "Invoice due"})
    assert await found(flat_store, "zanzibar invoice", share=None) == ["m1", "m2", "m3", "m4"]
    assert (await found(flat_store, "zanzibar invoice"))[0] == "m3"


async def test_fragments_weigh_by_their_role_weight(flat_store: MemoryStore) -> None:
    await seed(flat_store, {"m1": "Kate moved to ProPublica", "m2": "Pitch the dam story"})
    kate = (("Kate", 3.0), ("pitch", 1.0))
    pitch = (("Kate", 1.0), ("pitch", 3.0))
    assert (await found(flat_store, "Kate pitch", fragments=kate))[0] == "m1"
    assert (await found(flat_store, "Kate pitch", fragments=pitch))[0] == "m2"


async def test_a_memory_written_or_forgotten_after_a_search_is_seen(
    flat_store: MemoryStore,
) -> None:
    await seed(flat_store, {"m1": "Invoice paid", "m2": "Invoice sent"})
    assert len(await found(flat_store, "zanzibar")) == 2  # the cell's word index is built
    await flat_store.remember("Zanzibar trip", id="m3", **ME)
    assert (await found(flat_store, "zanzibar"))[0] == "m3"
    await flat_store.remember("Invoice reminder", id="m3", **ME)  # replaced: its words too
    assert (await found(flat_store, "zanzibar"))[0] != "m3"
    assert (await found(flat_store, "reminder"))[0] == "m3"
    await flat_store.remember("Zanzibar, once more", id="m2", **ME)
    assert (await found(flat_store, "zanzibar"))[0] == "m2"
    assert await flat_store.forget("m2", **ME)
    assert "m2" not in await found(flat_store, "zanzibar")


async def test_a_warm_index_extended_by_writes_ranks_as_a_fresh_one(tmp_path: Path) -> None:
    notes = [f"note {i} about {word}" for i, word in enumerate(
        ["invoice", "zanzibar", "vegetarian", "pins", "invoice", "dam", "kate", "invoice"])]
    path = tmp_path / "m.db"
    async with MemoryStore(path, embedding=StaticWords(flat=True),
                           clock=ManualClock(wall=1_000.0)) as warm:
        await seed(warm, {"m0": notes[0]})
        for i, text in enumerate(notes[1:], start=1):
            await found(warm, "zanzibar dietary hardware")  # the index is kept, then extended
            await warm.remember(text, id=f"m{i}", **ME)
        after_writes = await found(warm, "zanzibar dietary hardware")
    async with MemoryStore(path, embedding=StaticWords(flat=True),
                           clock=ManualClock(wall=1_000.0)) as fresh:
        assert await found(fresh, "zanzibar dietary hardware") == after_writes
    assert set(after_writes[:3]) == {"m1", "m2", "m3"}


async def test_another_cell_is_never_matched(flat_store: MemoryStore) -> None:
    await seed(flat_store, {"m1": "Invoice paid"})
    await flat_store.remember("Zanzibar trip", id="x1", principal="u2", scope="proj")
    await flat_store.remember("Zanzibar trip", id="x2", principal="u1", scope="other")
    assert await found(flat_store, "zanzibar") == ["m1"]


async def test_a_cell_too_big_for_words_is_ranked_by_cosine(
    flat_store: MemoryStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    await seed(flat_store, {"m1": "Invoice paid", "m2": "Zanzibar trip"})
    monkeypatch.setattr(vectors_module, "MAX_WORD_MEMORIES", 1)
    assert await found(flat_store, "zanzibar") == ["m1", "m2"]  # the cosine ties: by id


async def test_keeping_a_word_index_costs_the_same_however_many_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    sized: list[WordIndex] = []
    real = WordIndex.nbytes

    def counted(index: WordIndex) -> int:
        sized.append(index)
        return real.fget(index)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setattr(WordIndex, "nbytes", property(counted))
    async with MemoryStore(tmp_path / "m.db", embedding=StaticWords(flat=True),
                           clock=ManualClock(wall=1_000.0)) as store:
        cells = [{"principal": f"u{c}", "scope": "proj"} for c in range(60)]
        await store.remember_many(MemoryWrite(text=f"Invoice {c} paid", **cell)
                                  for c, cell in enumerate(cells))
        assert store.embedding is not None
        vector = store.embedding.embed(["zanzibar invoice"])[0]
        words = WordQuery((("zanzibar invoice", 1.0),), 0.5)
        sizings = []
        for cell in cells:  # each cell's first search builds and keeps its word index
            sized.clear()
            await store.semantic_candidates(vector, limit=5, words=words, **cell)
            sizings.append(len(sized))
        assert sizings == [1] * len(cells)  # never the indexes kept before it


async def test_the_word_indexes_kept_are_counted_exactly_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cap = 6_000
    monkeypatch.setattr(vectors_module, "WORD_CACHE_BYTES", cap)
    rng = np.random.default_rng(7)
    cells = [{"principal": f"u{c}", "scope": "proj"} for c in range(12)]
    texts = ["Invoice paid", "Zanzibar trip booked", "Kate moved to ProPublica",
             "Pitch the dam story", "vegan lunch with pins"]
    async with MemoryStore(tmp_path / "m.db", embedding=StaticWords(flat=True),
                           clock=ManualClock(wall=1_000.0), vector_cache_bytes=30_000) as store:
        assert store.embedding is not None
        vector = store.embedding.embed(["zanzibar invoice"])[0]
        words = WordQuery((("zanzibar invoice", 1.0),), 0.5)
        cache = store._vectors
        searched: set[str] = set()
        most = 0
        for step in range(300):
            cell = cells[int(rng.integers(len(cells)))]
            action = int(rng.integers(4))
            if action == 0:  # a new memory: the cell's matrix and word index are extended
                await store.remember(str(rng.choice(texts)), id=f"m{step}", **cell)
            elif action == 1:  # a memory replaced or forgotten: both are rebuilt
                for newest in await store.recent_candidates(limit=1, **cell):
                    if step % 2:
                        await store.remember(str(rng.choice(texts)), id=newest.id, **cell)
                    else:
                        await store.forget(newest.id, **cell)
            else:
                await store.semantic_candidates(vector, limit=5, words=words, **cell)
            kept = [entry[1].nbytes for entry in cache._words.values()]
            assert cache.held_word_bytes == sum(kept) <= cap
            most = max(most, len(kept))
            if action > 1:
                searched.add(cell["principal"])
        assert 1 < most < len(searched)  # indexes were kept, and some evicted on the way
    assert cache.held_word_bytes == 0


async def test_hostile_query_words_rank_without_error(flat_store: MemoryStore) -> None:
    await seed(flat_store, {"m1": "Invoice paid", "m2": "Zanzibar trip"})
    for text in ('"a" NEAR(b) OR * ^c', "'; DROP TABLE memories; --", "\ud800\udfff\x00",
                 "zanzibar " * 100_000):
        assert set(await found(flat_store, text)) == {"m1", "m2"}


def test_a_word_several_fragments_hold_counts_once_at_its_largest() -> None:
    # "pump" in the next action, a task and the question must not outweigh the one name the
    # facts give: a word counts once, at its largest weighted share.
    vectors = WordVectors(StaticWords().embed)
    index = WordIndex.build(["pump receipt", "reijo books"], vectors)
    once = index.scores(WordQuery((("pump", 2.0), ("reijo", 2.0)), 0.5), vectors)
    repeated = index.scores(WordQuery((("pump", 1.0), ("pump", 2.0), ("pump", 1.5),
                                       ("reijo", 2.0)), 0.5), vectors)
    np.testing.assert_allclose(repeated, once)
    lighter = index.scores(WordQuery((("pump", 1.0), ("reijo", 2.0)), 0.5), vectors)
    assert lighter[0] < once[0]


@settings(max_examples=50, deadline=None)
@given(texts=st.lists(st.text(max_size=40), max_size=8), query=st.text(max_size=40),
       share=st.floats(min_value=0.01, max_value=1.0))
def test_scores_are_finite_and_bounded(texts: list[str], query: str, share: float) -> None:
    vectors = WordVectors(StaticWords().embed)
    scores = WordIndex.build(texts, vectors).scores(WordQuery(((query, 2.0),), share), vectors)
    assert scores.shape == (len(texts),)
    assert np.isfinite(scores).all() and (scores >= 0).all() and (scores <= 2.0 + 1e-6).all()


# -- through the reference retriever: the policy's share and the arm's fusion weight ---------


@contextlib.asynccontextmanager
async def words_env(folder: Path, *, flat: bool = True,
                    adapter: type[StaticWords] = StaticWords) -> AsyncIterator[RankingEnv]:
    clock = ManualClock()
    async with SqliteLedger(folder / "l.db") as ledger, MemoryStore(
        folder / "m.db", embedding=adapter(flat=flat), clock=clock,
    ) as store:
        yield store, RecallAllowance(ledger, clock=clock)


_NOTES = {
    # The link is a paraphrase of the state's entity, which bm25 cannot see; the other notes
    # share the next action's words.
    "gold": "Guests: vegetarian menu list",
    "d1": "Draft the booking, draft the booking again.",
    "d2": "Booking draft notes.",
}
_STATE = WorkingState("Continue", next_action="Draft the booking",
                      facts=(Fact("Guests with dietary needs", ("dietary",)),))


async def _words_ranked(env: RankingEnv, arms: set[str], **retriever: object) -> list[str]:
    store = env[0]
    for memory_id, text in _NOTES.items():
        if await store.get_memories([memory_id], **ME) == []:
            await store.remember(text, id=memory_id, **ME)
    prepared = await prepare(store, _STATE, principal=ME["principal"], scope=ME["scope"])
    return (await search(env, prepared, arms, **retriever))[0]


async def test_the_policy_share_and_floor_decide_whether_words_count(tmp_path: Path) -> None:
    async with words_env(tmp_path) as env:
        # Sentence vectors that carry nothing: the cosine ties, so the words decide.
        assert (await _words_ranked(env, {"semantic"}))[0] == "gold"
        assert (await _words_ranked(env, {"semantic"},
                                    ranking=RankingPolicy(words=0.0)))[0] != "gold"
        # A similarity floor is on cosines: the arm then ranks by the cosine alone.
        assert (await _words_ranked(env, {"semantic"}, min_similarity=-1.0))[0] != "gold"


async def test_the_semantic_arm_weighs_semantic_words_when_it_matches_words(
    tmp_path: Path,
) -> None:
    async with words_env(tmp_path) as env:
        sparse = await _words_ranked(env, {"sparse"})
        semantic = await _words_ranked(env, {"semantic"})
        assert "gold" not in sparse and semantic[0] == "gold"
        both = {"sparse", "semantic"}
        # The weight of a semantic arm that matches words is semantic_words, not semantic.
        assert (await _words_ranked(env, both, ranking=RankingPolicy(
            semantic=100.0, semantic_words=0.0))) == sparse
        assert (await _words_ranked(env, both, ranking=RankingPolicy(
            semantic=0.0, semantic_words=100.0)))[0] == "gold"
        # Without the word match, semantic is its weight again.
        assert (await _words_ranked(env, both, ranking=RankingPolicy(
            words=0.0, semantic=0.0, semantic_words=100.0))) == sparse


async def test_an_arm_that_matches_words_is_fused_with_its_own_rank_constant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    constants: list[int] = []
    fuse = pipeline_module.weighted_fuse

    def recording(*args: object, k: int, **kwargs: object) -> object:
        constants.append(k)
        return fuse(*args, k=k, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline_module, "weighted_fuse", recording)
    both = {"sparse", "semantic"}
    async with words_env(tmp_path) as env:
        await _words_ranked(env, both)
        await _words_ranked(env, both, ranking=RankingPolicy(rrf_k_words=7, rrf_k=3))
        # Without the word match (share 0, or a similarity floor), rrf_k again.
        await _words_ranked(env, both, ranking=RankingPolicy(words=0.0, rrf_k=3))
        await _words_ranked(env, both, ranking=RankingPolicy(rrf_k=3), min_similarity=-1.0)
    assert constants == [0, 7, 3, 3]


@attrs.frozen
class BorrowedWords(StaticWords):
    """Sentence vectors of one model beside the word vectors of another (``embed_words``),
    as MiniLM with WordLlama's words."""

    def embed_words(self, words: Sequence[str]) -> npt.NDArray[np.float32]:
        return self.embed(words)


async def test_an_arm_matching_borrowed_words_weighs_semantic_contextual(
    tmp_path: Path,
) -> None:
    assert RankingPolicy().semantic_contextual == 40.0
    both = {"sparse", "semantic"}
    async with words_env(tmp_path, adapter=BorrowedWords) as env:
        sparse = await _words_ranked(env, {"sparse"})
        assert "gold" not in sparse and (await _words_ranked(env, {"semantic"}))[0] == "gold"
        # Its weight is semantic_contextual, neither semantic_words nor semantic.
        assert (await _words_ranked(env, both, ranking=RankingPolicy(
            semantic=100.0, semantic_words=100.0, semantic_contextual=0.0))) == sparse
        assert (await _words_ranked(env, both, ranking=RankingPolicy(
            semantic=0.0, semantic_words=0.0, semantic_contextual=100.0)))[0] == "gold"


async def test_per_fragment_gives_each_fragments_best_memory_its_whole_weight(
    tmp_path: Path,
) -> None:
    async with MemoryStore(tmp_path / "m.db", embedding=StaticWords(flat=True),
                           clock=ManualClock(wall=1_000.0)) as store:
        # The heavy fragment's four words are spread over three notes (the best holds two);
        # the light fragment's one word is in one note.
        await seed(store, {"pair": "quarterly ledger", "third": "reconcile",
                           "fourth": "accruals", "name": "Zanele"})
        fragments = (("quarterly ledger reconcile accruals", 1.0), ("Zanele", 0.8))

        async def ranked(per_fragment: bool) -> list[str]:
            vector = StaticWords(flat=True).embed(["x y"])[0]  # every cosine ties
            words = WordQuery(fragments, 1.0, per_fragment=per_fragment)
            found = await store.semantic_candidates(vector, limit=10, words=words, **ME)
            return [item.id for item in found]

        # Summed over the query: the pair holds half the heavy fragment (1.0 * 0.5), the name
        # all of the light one (0.8). Per fragment: the pair is the heavy fragment's best.
        assert (await ranked(False))[0] == "name"
        assert (await ranked(True))[:2] == ["pair", "name"]


async def test_only_an_arm_that_borrows_its_words_scores_them_per_fragment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[bool] = []
    shipped = MemoryStore.semantic_candidates

    async def spy(self: MemoryStore, vector: Any, **kwargs: Any) -> Any:
        words = kwargs.get("words")
        if words is not None:
            sent.append(words.per_fragment)
        return await shipped(self, vector, **kwargs)

    monkeypatch.setattr(MemoryStore, "semantic_candidates", spy)
    for adapter, expected in ((StaticWords, False), (BorrowedWords, True)):
        sent.clear()
        folder = tmp_path / adapter.__name__
        folder.mkdir()
        async with words_env(folder, adapter=adapter) as env:
            await _words_ranked(env, {"semantic"})
        assert sent and set(sent) == {expected}


def test_rank_constant_zero_ranks_by_weight_over_rank() -> None:
    a, b, c = (Evidence(id=i, text=i, score=1.0, arm="x") for i in "abc")
    # k = 0: a list's first place counts its whole weight, its second half of it, its third a
    # third, so the strong list's second place (2/2 + 1/3) still beats the weak list's first.
    fused = weighted_fuse([(2.0, [a, b]), (1.0, [c, a, b])], k=0)
    assert [item.id for item in fused] == ["a", "b", "c"]
    assert fused[0].score == pytest.approx(2.0 + 0.5)
    assert fused[1].score == pytest.approx(1.0 + 1 / 3)
    assert fused[2].score == pytest.approx(1.0)
    with pytest.raises(ValueError, match="rrf_k_words"):
        RankingPolicy(rrf_k_words=-1)



@attrs.frozen
class JunkWords(StaticWords):
    """Sentence vectors as StaticWords gives them; single words come back NaN or infinite."""

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        out = super().embed(texts)
        for row, text in enumerate(texts):
            if len(text.split()) == 1:
                out[row] = np.nan if row % 2 else np.inf
        return out


async def test_junk_word_vectors_match_nothing(tmp_path: Path) -> None:
    async with MemoryStore(tmp_path / "m.db", embedding=JunkWords(flat=True),
                           clock=ManualClock(wall=1_000.0)) as store:
        await seed(store, {"m1": "Invoice paid", "m2": "Trip to Zanzibar booked"})
        assert await found(store, "zanzibar invoice") == await found(store, "zanzibar invoice",
                                                                    share=None)
        vectors = WordVectors(JunkWords().embed)
        assert np.isfinite(vectors.of(["alpha", "beta"])).all()


@attrs.frozen
class WideningWords(BorrowedWords):
    """Borrowed word vectors that come back one column wider after the first call."""

    calls: list[int] = attrs.field(factory=list)

    def embed_words(self, words: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(len(words))
        out = super().embed_words(words)
        return out if len(self.calls) == 1 else np.pad(out, ((0, 0), (0, 1)))


@pytest.mark.parametrize("per_fragment", [False, True])
async def test_word_vectors_whose_width_changes_match_nothing(
    tmp_path: Path, per_fragment: bool,
) -> None:
    adapter = WideningWords(flat=True)
    async with MemoryStore(tmp_path / "m.db", embedding=adapter,
                           clock=ManualClock(wall=1_000.0)) as store:
        await seed(store, {"m1": "Invoice paid", "m2": "Trip to Zanzibar booked"})
        vector = adapter.embed(["x y"])[0]
        for query in ("invoice", "holiday voyage"):  # the second's words come back wider
            words = WordQuery(((query, 1.0),), 0.5, per_fragment=per_fragment)
            found = await store.semantic_candidates(vector, limit=10, words=words, **ME)
            assert {item.id for item in found} == {"m1", "m2"}
        assert len(adapter.calls) >= 2
