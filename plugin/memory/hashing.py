"""A deterministic embedding adapter: no model, no download, the same vector every run.

The fallback semantic arm of the bootstrap and the evaluator when no packaged model is
installed, and the adapter tests and benchmarks use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

from .terms import word_terms

__all__ = ["HashingEmbedding"]


def _positive(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


@attrs.frozen(kw_only=True)
class HashingEmbedding:
    """The hashing trick: each ``\\w+`` token (case-folded) adds one to a BLAKE2b-chosen slot.

    Texts sharing words get a positive cosine; texts sharing none get zero. A text without any
    word embeds as the zero vector (cosine 0 with everything). ``count_tokens`` is the number of
    word tokens, so ``token_limit`` is easy to hit in tests. Implements
    :class:`~plugin.memory.embedding.EmbeddingAdapter`.
    """

    dimensions: int = attrs.field(default=64, validator=_positive)
    token_limit: int = attrs.field(default=64, validator=_positive)

    @classmethod
    def like_wordllama(cls) -> HashingEmbedding:
        """Sized like the packaged model (256 dimensions, 256 tokens), so a stand-in for it
        embeds the same queries rather than withholding the longer ones."""
        return cls(dimensions=256, token_limit=256)

    @property
    def name(self) -> str:
        return f"hashing-blake2b-{self.dimensions}"

    @staticmethod
    def _tokens(text: str) -> list[str]:
        # Every occurrence counts (no dedup, no cap): a repeated word weighs more.
        return list(word_terms(text, limit=None, scan=None, unique=False))

    def count_tokens(self, text: str) -> int:
        return len(self._tokens(text))

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            for token in self._tokens(text):
                digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
                out[row, int.from_bytes(digest, "little") % self.dimensions] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out
