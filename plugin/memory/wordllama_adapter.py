"""The packaged semantic model: WordLlama, loaded offline (the ``semantic`` extra).

WordLlama ships its weights (``l2_supercat``, 256 dimensions) and its tokenizer inside the
wheel, so :meth:`WordLlamaAdapter.load` reads them from the installed package with downloads
disabled: nothing is fetched at run time. ``wordllama`` is imported only by ``load()``, so
importing :mod:`plugin` never imports it.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs
import numpy as np
import numpy.typing as npt

from .fts import remove_lone_surrogates

__all__ = ["WORDLLAMA_TOKEN_LIMIT", "WordLlamaAdapter"]

#: The model's real token limit: ``max_length = 256`` in the ``[tokenizer]`` section of
#: wordllama's training config for this model (``wordllama/config/train/l2_supercat.toml``);
#: the model never saw a longer input. Inference itself does not truncate (it averages every
#: token), so the limit is enforced by the caller: a longer query is withheld, not truncated.
WORDLLAMA_TOKEN_LIMIT = 256

_CONFIG = "l2_supercat"
_NATIVE_DIMENSIONS = 256
_DIMENSIONS = (64, 128, 256)  # the Matryoshka truncations of the packaged 256-d weights


def available() -> bool:
    """Whether the ``semantic`` extra (wordllama) is installed; imports nothing."""
    return "wordllama" in sys.modules or importlib.util.find_spec("wordllama") is not None


def _import_wordllama() -> Any:
    """Import wordllama, undoing the root-logger setup its import performs.

    ``wordllama.inference`` calls ``logging.basicConfig(level=INFO)`` at import time, which
    would change the host application's logging; the root logger is restored afterwards.
    """
    imported = sys.modules.get("wordllama")
    if imported is not None:
        return imported
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import wordllama
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
    return wordllama


@attrs.frozen(kw_only=True)
class WordLlamaAdapter:
    """:class:`~plugin.memory.embedding.EmbeddingAdapter` over a loaded WordLlama model.

    Vectors are mean-pooled token embeddings, L2-normalised, float32; the same text always
    gives the same vector. A text with no token (the empty string) embeds as the zero vector.
    Lone surrogates are replaced by U+FFFD before tokenizing (the tokenizer rejects them).
    Build it with :meth:`load`.

    ``word_level``: a word's vector is the average of its static token vectors, so single
    words can be compared with each other (the semantic arm's word-level match,
    :mod:`plugin.memory.store.words`).
    """

    word_level: ClassVar[bool] = True
    _model: Any = attrs.field(alias="model", repr=False)
    dimensions: int = _NATIVE_DIMENSIONS
    token_limit: int = WORDLLAMA_TOKEN_LIMIT

    @classmethod
    def load(cls, *, dimensions: int = _NATIVE_DIMENSIONS) -> WordLlamaAdapter:
        """Load the packaged model offline; ``dimensions`` is 64, 128 or 256.

        Raises ``ValueError`` for another dimension, ``ImportError`` when the ``semantic``
        extra is not installed, and ``FileNotFoundError`` when the packaged files are missing
        (downloads are disabled, so nothing is fetched instead).
        """
        if dimensions not in _DIMENSIONS:
            raise ValueError(f"dimensions must be one of {_DIMENSIONS}, got {dimensions!r}")
        wordllama = _import_wordllama()
        model = wordllama.WordLlama.load(
            config=_CONFIG,
            cache_dir=Path(wordllama.__file__).parent,
            disable_download=True,
            dim=_NATIVE_DIMENSIONS,
            trunc_dim=None if dimensions == _NATIVE_DIMENSIONS else dimensions,
        )
        return cls(model=model, dimensions=dimensions)

    @property
    def name(self) -> str:
        return f"wordllama-{_CONFIG}-{self.dimensions}"

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in WordLlama's own (Llama 2) tokenizer, without special tokens."""
        encoding = self._model.tokenizer.encode(
            remove_lone_surrogates(text), add_special_tokens=False
        )
        return len(encoding.ids)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        clean = [remove_lone_surrogates(text) for text in texts]
        raw = self._model.embed(clean, norm=False, return_np=True)
        vectors = np.ascontiguousarray(raw, dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        vectors[~np.isfinite(vectors).all(axis=1)] = 0.0
        return vectors
