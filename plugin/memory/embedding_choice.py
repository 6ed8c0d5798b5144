"""Which embedding adapter a name stands for: the one place an adapter is picked and loaded.

Names: ``none`` (no semantic arm), ``auto`` (the best installed: see :func:`best_installed`),
``wordllama`` (the ``semantic`` extra), ``minilm`` (the ``minilm`` extra; with WordLlama's word
match when the ``semantic`` extra is installed too) and ``hashing`` (a deterministic stand-in
sized like WordLlama). The configuration, the demo and ``recallbound evaluate`` all load
through here.
"""

from __future__ import annotations

import attrs

from .embedding import EmbeddingAdapter

CHOICES = ("none", "auto", "wordllama", "minilm", "hashing")


def best_installed() -> str:
    """What ``auto`` loads (imports nothing).

    ``minilm`` where the ``minilm`` and ``semantic`` extras are both installed (MiniLM's
    sentence vectors with WordLlama's word match: the strongest arm measured, on hand-written
    notes and on LoCoMo alike), else ``wordllama`` (MiniLM alone ranks below it), else
    ``minilm``, else ``none``.
    """
    from . import minilm_adapter, wordllama_adapter

    if minilm_adapter.available():  # with WordLlama's words when it is installed too
        return "minilm"
    return "wordllama" if wordllama_adapter.available() else "none"


def load_embedding(choice: str) -> EmbeddingAdapter | None:
    """The adapter ``choice`` names (``None`` for ``none``); ``ValueError`` for another name.

    Loading WordLlama or MiniLM without its extra raises their ``ImportError``.
    """
    if choice == "auto":
        choice = best_installed()
    if choice == "wordllama":
        from .wordllama_adapter import WordLlamaAdapter

        return WordLlamaAdapter.load()
    if choice == "minilm":
        from . import wordllama_adapter
        from .minilm_adapter import MiniLMAdapter

        minilm = MiniLMAdapter.load()
        if not wordllama_adapter.available():
            return minilm
        # WordLlama's word vectors, where the semantic extra is installed too, let the arm
        # match words beside MiniLM's sentence vectors (the evaluation guide has the figures).
        try:
            return attrs.evolve(minilm, words=wordllama_adapter.WordLlamaAdapter.load())
        except FileNotFoundError:  # installed without its model files: sentences alone
            return minilm
    if choice == "hashing":
        from .hashing import HashingEmbedding

        return HashingEmbedding.like_wordllama()
    if choice == "none":
        return None
    raise ValueError(f"unknown embedding {choice!r}: one of {', '.join(CHOICES)}")
