"""The MiniLM ONNX adapter (the ``minilm`` extra, installed by the ``test`` extra, so CI runs
these): offline loading from the installed packages, the pinned model, the token limit."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugin import QueryPlanner, QueryPreparation, QueryStrategy, WorkingState
from plugin.memory import minilm_adapter
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.minilm_adapter import MINILM_TOKEN_LIMIT, MiniLMAdapter
from plugin.memory.preparation import WithheldReason
from plugin.memory.store.words import word_embed, word_level

_ADAPTER: list[MiniLMAdapter] = []


def _adapter() -> MiniLMAdapter:
    if not _ADAPTER:
        _ADAPTER.append(MiniLMAdapter.load())
    return _ADAPTER[0]


def test_it_loads_offline_from_the_installed_packages() -> None:
    assert minilm_adapter.available()
    model, tokenizer = minilm_adapter.model_files()
    assert model.name == "model.onnx" and tokenizer.name == "tokenizer.json"
    adapter = _adapter()
    assert isinstance(adapter, EmbeddingAdapter)
    assert (adapter.dimensions, adapter.token_limit) == (384, MINILM_TOKEN_LIMIT)
    assert adapter.name == "all-minilm-l6-v2-onnx-int8"


def test_vectors_are_unit_deterministic_and_mean_something() -> None:
    adapter = _adapter()
    texts = ["How do we roll over the secrets of the billing service?",
             "Secret rollover for the billing service: issue new keys, revoke the old pair.",
             "The team lunch is on Thursday at the noodle place."]
    vectors = adapter.embed(texts)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # The same text gives the same vector alone or in a batch (a fresh adapter: no memo).
    np.testing.assert_array_equal(attrs.evolve(adapter).embed(texts[:1])[0], vectors[0])
    cos = vectors @ vectors.T
    assert cos[0, 1] > 0.5 > cos[0, 2] + 0.3  # the paraphrase is close, lunch is not
    assert adapter.embed([]).shape == (0, 384)
    assert np.isfinite(adapter.embed(["\ud800 lone surrogate", ""])).all()


def test_a_text_already_read_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = attrs.evolve(_adapter())  # its own, empty memo
    read: list[int] = []
    run = MiniLMAdapter._run

    def counting(self: MiniLMAdapter, pieces: list[list[int]]) -> np.ndarray:
        read.append(len(pieces))
        return run(self, pieces)

    monkeypatch.setattr(MiniLMAdapter, "_run", counting)
    long = "The quarterly report for the Lisbon office is due on Friday, " * 6
    first = adapter.embed(["Continue", long])
    assert sum(read) == 2
    again = adapter.embed(["Continue", "next step: ask Priya", "Continue", long])
    assert sum(read) == 3  # only the new text went through the model, once
    np.testing.assert_array_equal(again[0], first[0])
    np.testing.assert_array_equal(again[2], first[0])
    np.testing.assert_array_equal(again[3], first[1])
    # Kept vectors, and texts batched by length, are what the model gives each text alone.
    for text, vector in zip(["Continue", "next step: ask Priya", long], again[[0, 1, 3]],
                            strict=True):
        np.testing.assert_array_equal(attrs.evolve(adapter).embed([text])[0], vector)
    again[0] = 0.0  # the caller's array is its own
    np.testing.assert_array_equal(adapter.embed(["Continue"])[0], first[0])


def _positions(lengths: list[int], spans: list[tuple[int, int]]) -> int:
    return sum(minilm_adapter.CALL_COST + (end - start) * lengths[end - 1] for start, end in spans)


def test_a_short_fragment_is_not_padded_to_a_long_query() -> None:
    batches = minilm_adapter.batches
    # A working state's fragments and the query that joins them: the query runs alone.
    assert batches([5, 6, 9, 12, 14, 69])[-1] == (5, 6)
    assert batches([16] * 40) in ([(0, 8), (8, 40)], [(0, 32), (32, 40)])  # like lengths share
    assert batches([]) == []


@given(st.lists(st.integers(min_value=1, max_value=MINILM_TOKEN_LIMIT), max_size=200))
def test_batches_cover_every_text_once_and_read_no_more_than_fixed_batches(
    lengths: list[int],
) -> None:
    lengths.sort()
    spans = minilm_adapter.batches(lengths)
    assert [i for start, end in spans for i in range(start, end)] == list(range(len(lengths)))
    assert all(0 < end - start <= minilm_adapter.BATCH for start, end in spans)
    fixed = [(i, min(i + minilm_adapter.BATCH, len(lengths)))
             for i in range(0, len(lengths), minilm_adapter.BATCH)]
    alone = [(i, i + 1) for i in range(len(lengths))]
    cost = _positions(lengths, spans)
    assert cost <= _positions(lengths, fixed) and cost <= _positions(lengths, alone)


def test_threads_sharing_the_memo_get_the_models_vectors() -> None:
    from concurrent.futures import ThreadPoolExecutor

    adapter = attrs.evolve(_adapter())
    texts = [f"note {i}: the {'long ' * (i % 7)}export job for region {i % 5}" for i in range(40)]
    expected = attrs.evolve(adapter).embed(texts)
    orders = [texts[i:] + texts[:i] for i in range(0, 40, 5)]  # overlapping, in other orders
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(adapter.embed, orders))
    for i, got in zip(range(0, 40, 5), results, strict=True):
        np.testing.assert_array_equal(got, np.roll(expected, -i, axis=0))


def test_the_memo_holds_digests_not_texts() -> None:
    adapter = attrs.evolve(_adapter())
    huge = "quarterly export " * 60_000  # about a megabyte: embedded from its first tokens
    lone = "\ud800 a lone surrogate"
    first = adapter.embed([huge, lone])
    np.testing.assert_array_equal(adapter.embed([huge, lone]), first)  # read from the memo
    kept = adapter._memo._vectors
    assert len(kept) == 2 and all(isinstance(k, bytes) and len(k) == 16 for k in kept)


def test_the_memo_keeps_the_most_recently_used_texts() -> None:
    memo = minilm_adapter._Memo(size=2)
    for text in ("a", "b"):
        memo.put(text, np.full(3, ord(text), dtype=np.float32))
    assert memo.get("a") is not None  # "a" is now the most recently used
    memo.put("c", np.zeros(3, dtype=np.float32))
    assert len(memo) == 2 and memo.get("b") is None
    kept = memo.get("a")
    assert kept is not None and kept[0] == ord("a") and not kept.flags.writeable


def test_a_modified_model_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, tokenizer = minilm_adapter.model_files()
    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"not the pinned model")
    monkeypatch.setattr(minilm_adapter, "model_files", lambda: (fake, tokenizer))
    with pytest.raises(ValueError, match="not the pinned"):
        MiniLMAdapter.load()


def test_a_modified_tokenizer_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = minilm_adapter.model_files()
    fake = tmp_path / "tokenizer.json"
    fake.write_text(tokenizer.read_text(encoding="utf-8").replace('"lowercase":true',
                                                                  '"lowercase":false'),
                    encoding="utf-8")
    monkeypatch.setattr(minilm_adapter, "model_files", lambda: (model, fake))
    with pytest.raises(ValueError, match="not the pinned all-MiniLM-L6-v2 tokenizer"):
        MiniLMAdapter.load()


def test_the_tokenizer_ships_with_recallbound_and_is_the_models() -> None:
    """The tokenizer is this package's own file (no SDK is installed for it), pinned, with its
    licence notice beside it; the model's package alone makes the extra available."""
    _, tokenizer = minilm_adapter.model_files()
    assert tokenizer.parent == Path(minilm_adapter.__file__).parent / "data" / "minilm"
    assert "Apache License" in (tokenizer.parent / "NOTICE").read_text(encoding="utf-8")
    assert minilm_adapter._sha256(tokenizer) == minilm_adapter.TOKENIZER_SHA256
    # BERT's uncased pipeline: lower-cased, accents stripped, CJK split; unknown pieces [UNK]
    assert _adapter()._encoder.encode("Café ÉCLAIR, naïve 继续").tokens == [
        "[CLS]", "cafe", "ec", "##lai", "##r", ",", "naive", "[UNK]", "[UNK]", "[SEP]"]


def test_missing_packages_say_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(minilm_adapter, "_package_dir", lambda name: None)
    with pytest.raises(FileNotFoundError, match="minilm extra"):
        minilm_adapter.model_files()


async def _admit(experiment: str) -> bool:
    return True


@pytest.mark.anyio
async def test_a_query_over_256_word_pieces_is_withheld_not_truncated() -> None:
    adapter = _adapter()
    preparation = QueryPreparation(QueryPlanner(QueryStrategy.TASK_CONTEXT, admission=_admit),
                                   adapter)
    short = await preparation.prepare(WorkingState("rotate the billing keys"), scope="s",
                                      principal="p")
    assert short.semantic.vector is not None
    assert short.semantic.tokens == adapter.count_tokens("rotate the billing keys") == 6
    long_request = " ".join(["antidisestablishmentarianism"] * 60)  # one word, many pieces
    prepared = await preparation.prepare(WorkingState(long_request), scope="s", principal="p")
    assert adapter.count_tokens(prepared.query.text) > MINILM_TOKEN_LIMIT
    assert prepared.semantic.withheld_reason is WithheldReason.TOKEN_LIMIT


@pytest.mark.parametrize(("choice", "module", "extra"), [
    ("minilm", "onnxruntime", "minilm"), ("wordllama", "wordllama", "semantic")])
def test_a_missing_models_extra_is_named(
    monkeypatch: pytest.MonkeyPatch, choice: str, module: str, extra: str
) -> None:
    import sys

    from runtime_hooks._extras import MissingExtraError
    from runtime_hooks.bootstrap import Semantic, load_embedding

    monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed
    for name in [n for n in sys.modules if n.startswith(f"{module}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "plugin.memory.wordllama_adapter", raising=False)
    with pytest.raises(MissingExtraError, match=rf"pip install 'recallbound\[{extra}\]'"):
        load_embedding(Semantic(choice))


def test_the_minilm_choice_matches_words_in_wordllamas_word_space() -> None:
    from plugin.memory.embedding_choice import load_embedding
    from plugin.memory.wordllama_adapter import WordLlamaAdapter

    adapter = load_embedding("minilm")
    assert isinstance(adapter, MiniLMAdapter) and word_level(adapter)
    embed = word_embed(adapter)
    assert embed is not None
    words = ["invoice", "qx", "7781"]
    np.testing.assert_array_equal(embed(words), WordLlamaAdapter.load().embed(words))
    # Sentences, the vectors stored and compared, stay MiniLM's.
    assert adapter.name == _adapter().name
    np.testing.assert_array_equal(adapter.embed(words), _adapter().embed(words))


def test_minilm_alone_matches_no_words(monkeypatch: pytest.MonkeyPatch) -> None:
    from plugin.memory import embedding_choice, wordllama_adapter

    alone = _adapter()
    assert not word_level(alone) and word_embed(alone) is None
    with pytest.raises(TypeError, match="matches no words"):
        alone.embed_words(["invoice"])
    from plugin.memory.hashing import HashingEmbedding

    with pytest.raises(TypeError, match="word-level"):  # one-hot words would match nothing
        MiniLMAdapter.load(words=HashingEmbedding())
    monkeypatch.setattr(wordllama_adapter, "available", lambda: False)  # no semantic extra
    assert not word_level(embedding_choice.load_embedding("minilm"))


@pytest.mark.parametrize(("words", "sentences", "chosen"), [
    (True, True, "minilm"), (True, False, "wordllama"), (False, True, "minilm"),
    (False, False, "none")])
def test_auto_loads_the_strongest_installed_arm(
    monkeypatch: pytest.MonkeyPatch, words: bool, sentences: bool, chosen: str
) -> None:
    from plugin.evaluation.evaluator import default_embedding
    from plugin.memory import embedding_choice, wordllama_adapter
    from runtime_hooks.bootstrap import Semantic, best_installed

    monkeypatch.setattr(wordllama_adapter, "available", lambda: words)
    monkeypatch.setattr(minilm_adapter, "available", lambda: sentences)
    assert embedding_choice.best_installed() == chosen
    assert best_installed() is Semantic(chosen)
    adapter = embedding_choice.load_embedding("auto")
    evaluated = default_embedding()  # recallbound evaluate's default is auto's choice
    if chosen == "none":
        assert adapter is None and evaluated.name.startswith("hashing")
        return
    assert adapter is not None and evaluated.name == adapter.name
    # Both extras: MiniLM's sentences with WordLlama's words, the arm that ranks best.
    assert word_level(adapter) == word_level(evaluated) == words
    assert isinstance(adapter, MiniLMAdapter) == sentences


def test_the_evaluators_default_passes_over_a_model_installed_without_its_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from plugin.evaluation.evaluator import default_embedding
    from plugin.memory import wordllama_adapter

    def missing() -> tuple[Path, Path]:
        raise FileNotFoundError("packaged model file missing")

    monkeypatch.setattr(minilm_adapter, "model_files", missing)
    chosen = default_embedding()
    assert chosen.name == wordllama_adapter.WordLlamaAdapter.load().name  # not hashing
    monkeypatch.setattr(wordllama_adapter, "available", lambda: False)
    assert default_embedding().name.startswith("hashing")


NOTES = {
    "filed": "QX-7781 filed under taxes 2024",
    "folder": "Invoices go in the blue folder on the office shelf",
    "paid": "Paid the plumber's invoice by bank transfer",
    "scan": "Scan receipts before putting them away",
    "post": "The post arrives around eleven",
}


@pytest.mark.anyio
async def test_an_id_the_sentence_vectors_rank_second_is_found_by_its_words(
    tmp_path: Path,
) -> None:
    from plugin.control import ManualClock
    from plugin.memory.embedding_choice import load_embedding
    from plugin.memory.store import MemoryStore
    from plugin.memory.store.words import WordQuery

    query = "find invoice QX-7781"
    first = []
    for name, adapter in (("alone", _adapter()), ("words", load_embedding("minilm"))):
        assert adapter is not None
        async with MemoryStore(tmp_path / f"{name}.db", embedding=adapter,
                               clock=ManualClock(wall=1_000.0)) as store:
            for id, text in NOTES.items():
                await store.remember(text, id=id, principal="ana", scope="home")
            words = WordQuery(((query, 1.0),), 0.5) if word_level(adapter) else None
            found = await store.semantic_candidates(
                adapter.embed([query])[0], limit=5, words=words, principal="ana", scope="home")
            first.append(found[0].id)
    assert first == ["folder", "filed"]  # the id ranks first once its words are matched
