"""The packaged WordLlama model: loads offline, embeds reproducibly, ranks paraphrases sensibly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TypedDict

import numpy as np
import pytest

from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.store import MemoryStore
from plugin.memory.wordllama_adapter import WORDLLAMA_TOKEN_LIMIT, WordLlamaAdapter

wordllama = pytest.importorskip("wordllama")


class Who(TypedDict):
    principal: str
    scope: str


ME: Who = {"principal": "u1", "scope": "proj"}


@pytest.fixture(scope="module")
def adapter() -> WordLlamaAdapter:
    return WordLlamaAdapter.load()


def test_it_is_an_embedding_adapter(adapter: WordLlamaAdapter) -> None:
    assert isinstance(adapter, EmbeddingAdapter)
    assert isinstance(HashingEmbedding(), EmbeddingAdapter)
    assert adapter.name == "wordllama-l2_supercat-256"
    assert adapter.dimensions == 256


def test_token_limit_is_the_models_training_max_length(adapter: WordLlamaAdapter) -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the backport the package installs on 3.10
        import tomli as tomllib
    config = Path(wordllama.__file__).parent / "config" / "train" / "l2_supercat.toml"
    with config.open("rb") as f:
        assert tomllib.load(f)["tokenizer"]["max_length"] == WORDLLAMA_TOKEN_LIMIT
    assert adapter.token_limit == WORDLLAMA_TOKEN_LIMIT == 256


def test_count_tokens_uses_the_models_tokenizer(adapter: WordLlamaAdapter) -> None:
    text = "Continue the database migration review"
    expected = len(adapter._model.tokenizer.encode(text, add_special_tokens=False).ids)
    assert adapter.count_tokens(text) == expected > 0
    assert adapter.count_tokens("") == 0
    assert adapter.count_tokens("word " * 300) > adapter.token_limit
    assert adapter.count_tokens("lone \ud800 surrogate") > 0


def test_vectors_are_normalised_float32_and_reproducible(adapter: WordLlamaAdapter) -> None:
    texts = ["the cat sat on the mat", "a completely different sentence", "", "nul\x00byte"]
    first = adapter.embed(texts)
    assert first.dtype == np.float32
    assert first.shape == (4, 256)
    norms = np.linalg.norm(first, axis=1)
    assert norms[[0, 1, 3]] == pytest.approx(1.0, abs=1e-5)
    assert norms[2] == 0.0  # no token: the zero vector, not NaN
    assert np.array_equal(first, adapter.embed(texts))
    assert np.array_equal(first[1:2], adapter.embed(texts[1:2]))  # independent of the batch
    assert adapter.embed([]).shape == (0, 256)
    assert np.isfinite(adapter.embed(["lone \udfff surrogate"])).all()


def test_smaller_dimensions_and_invalid_ones() -> None:
    small = WordLlamaAdapter.load(dimensions=64)
    vector = small.embed(["hello"])
    assert vector.shape == (1, 64)
    assert small.name == "wordllama-l2_supercat-64"
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="dimensions"):
        WordLlamaAdapter.load(dimensions=100)


def test_importing_plugin_does_not_import_wordllama_and_load_keeps_logging() -> None:
    code = (
        "import logging, sys\n"
        "import plugin, plugin.memory.store, plugin.memory.wordllama_adapter as w\n"
        "assert 'wordllama' not in sys.modules\n"
        "root = logging.getLogger()\n"
        "before = (list(root.handlers), root.level)\n"
        "w.WordLlamaAdapter.load()\n"
        "assert 'wordllama' in sys.modules\n"
        "assert (list(root.handlers), root.level) == before, (root.handlers, root.level)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_a_store_with_wordllama_ranks_paraphrases(
    tmp_path: Path, adapter: WordLlamaAdapter
) -> None:
    memories = {
        "deploy": "The deployment pipeline failed because the database migration timed out",
        "lunch": "We had pasta for lunch on Friday",
        "cat": "Alice's cat is named Whiskers",
        "budget": "The quarterly budget review is scheduled for March",
        "plants": "Remember to water the plants in the office",
    }
    questions = {
        "why did the release break? the schema change took too long": "deploy",
        "what is the name of the pet": "cat",
        "when do we go over the finances": "budget",
    }
    async with MemoryStore(tmp_path / "m.db", embedding=adapter) as store:
        for i, (memory_id, text) in enumerate(memories.items()):
            await store.add_memory(memory_id, text, created_at=float(i), **ME)
        for question, expected in questions.items():
            assert adapter.count_tokens(question) <= adapter.token_limit
            (vector,) = adapter.embed([question])
            found = await store.semantic_candidates(vector, limit=5, **ME)
            assert found[0].id == expected, (question, [(e.id, e.score) for e in found])
            assert len(found) == 5


def test_availability_check_imports_nothing() -> None:
    import subprocess
    import sys

    code = (
        "import logging, sys\n"
        "from plugin.memory.wordllama_adapter import available\n"
        "handlers = list(logging.getLogger().handlers)\n"
        "print(available(), 'wordllama' in sys.modules, logging.getLogger().handlers == handlers)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["True", "False", "True"]
