"""The semantic arm's embedding adapter protocol.

An adapter turns query and memory texts into L2-normalised float32 vectors. It states its real
token limit and counts tokens with its own tokenizer: a query over the limit is not embedded
(semantic preparation is withheld, with the reason recorded) while the sparse arm still runs.
The planner's 512-byte bound is not a claim about tokenizer equivalence.

An adapter may also say ``word_level = True`` (a class attribute): its vector of a single word
means something on its own, as with a model that averages static token vectors (the packaged
WordLlama). The semantic arm then also matches each query word against the nearest word of
each memory (:mod:`plugin.memory.store.words`); without it, the arm ranks by sentence vectors
alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]


@runtime_checkable
class EmbeddingAdapter(Protocol):
    """Embeds texts for the semantic arm. Methods are synchronous (run them in a worker thread)."""

    @property
    def name(self) -> str:
        """A stable identifier of the model (stored beside each vector)."""
        ...

    @property
    def token_limit(self) -> int:
        """The most tokens the model reads; longer queries are withheld, not truncated."""
        ...

    @property
    def dimensions(self) -> int:
        """Length of every vector this adapter returns."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` takes in this model's own tokenizer."""
        ...

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Vectors for ``texts``: shape ``(len(texts), dimensions)``, float32, L2-normalised."""
        ...


def word_level(adapter: object) -> bool:
    """Whether ``adapter``'s vectors of single words can be compared (``word_level = True``)."""
    return getattr(adapter, "word_level", False) is True


_EMBEDDING_METHODS = ("count_tokens", "embed")
_EMBEDDING_PROPERTIES = ("name", "token_limit", "dimensions")


def is_embedding_adapter(value: object) -> bool:
    """Whether ``value`` has every member of :class:`EmbeddingAdapter`.

    Unlike ``isinstance(value, EmbeddingAdapter)``, which since Python 3.12 reads attributes
    statically, this also accepts a proxy that forwards them through ``__getattr__``.
    """
    try:  # a property that raises anything is not one the adapter has
        return all(callable(getattr(value, m, None)) for m in _EMBEDDING_METHODS) and all(
            hasattr(value, p) for p in _EMBEDDING_PROPERTIES)
    except Exception:
        return False
