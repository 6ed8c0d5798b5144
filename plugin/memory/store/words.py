"""Word-level matching for the semantic arm: every query word against the nearest word of a
memory, in the embedding model's own word space.

A sentence vector averages its words, so in a note of twenty words a rare name or id weighs a
twentieth, and a paraphrase ("dietary requirements" for "19 vegetarian, 7 vegan") is lost in
the average. Here each content word of a query fragment is compared with each word of a memory
(both embedded as words by the same model), and keeps its best match: 1 for the same word, a
high cosine for a close one ("dietary", "vegetarian"), little for the rest. A fragment's match
with a memory is the mean of its words' best matches, weighted by each word's rarity in the
cell (``idf``), so a name or an id the cell uses twice counts more than a word every note has;
a memory's word score is the fragments' matches summed by their role weights, like the
sentence vectors' cosines (:func:`~plugin.memory.ranking.combined_vector`).

The arm's score mixes both: ``(1 - share) * cosine / best cosine + share * words / best
words`` over the cell, with ``share`` :attr:`RankingPolicy.words
<plugin.memory.ranking.RankingPolicy.words>`. Only adapters whose word vectors mean something
on their own take part (``word_level = True``: the packaged WordLlama, whose vectors are
averages of static token vectors; MiniLM given WordLlama's words, whose sentence vectors are
MiniLM's and word vectors WordLlama's, through its ``embed_words``); any other adapter (the
hashing adapter, whose single-word vectors are one-hot, MiniLM alone, a custom one) is ranked
by its sentence vectors alone.

The index of a cell (its vocabulary, the words of each memory, the words' vectors) is built
from the same rows as the cell's vector matrix and kept while that matrix is current; a cell of
more than :data:`MAX_WORD_MEMORIES` memories is ranked by its sentence vectors alone.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from ..embedding import EmbeddingAdapter, word_level
from ..terms import STOPWORDS, word_terms

__all__ = [
    "MAX_FRAGMENTS",
    "MAX_WORD_MEMORIES",
    "WordIndex",
    "WordQuery",
    "WordVectors",
    "borrows_words",
    "match_words",
    "mixed",
    "word_embed",
    "word_level",
]

MAX_WORD_MEMORIES = 5_000
"""A cell with more memories is ranked by its sentence vectors alone."""

MAX_WORDS = 64
"""The most distinct words taken from one text (a fragment or a memory)."""

MAX_WORD_CHARS = 100
"""Longer words are left out (a blob, not a word: the sparse arm still matches it)."""

_SCAN_CHARS = 16 * 1024

Embed = Callable[[Sequence[str]], npt.NDArray[np.float32]]


def _borrowed(adapter: object) -> Embed | None:
    """``adapter``'s ``embed_words``, the word space it borrows from another model, if any."""
    borrowed: Embed | None = getattr(adapter, "embed_words", None)
    return borrowed if callable(borrowed) else None


def borrows_words(adapter: object) -> bool:
    """Whether ``adapter`` matches words in another model's word space (``embed_words``):
    a contextual encoder's sentence vectors beside a static model's words."""
    return word_level(adapter) and _borrowed(adapter) is not None


def word_embed(adapter: EmbeddingAdapter | None) -> Embed | None:
    """How ``adapter`` embeds single words for the word match: its ``embed_words`` where it
    has one (an adapter that borrows another's word space), else its ``embed``; None when it
    is not word-level."""
    if adapter is None or not word_level(adapter):
        return None
    return _borrowed(adapter) or adapter.embed


def match_words(text: str) -> tuple[str, ...]:
    """The distinct content words of ``text`` (the project's terms, :func:`~..terms.word_terms`:
    case-folded, NFKC; no function words, no single letters, none over
    :data:`MAX_WORD_CHARS`), in order, at most :data:`MAX_WORDS`; its first 16 KiB are read."""
    terms = word_terms(text, limit=None, scan=_SCAN_CHARS)
    return tuple(itertools.islice(
        (term for term in terms if 1 < len(term) <= MAX_WORD_CHARS and term not in STOPWORDS),
        MAX_WORDS))


MAX_FRAGMENTS = 64
"""The most fragments one word query holds (a planned query has far fewer)."""


@attrs.frozen
class WordQuery:
    """The fragments of one query, each with its role weight (finite, at least 0), and the
    share of the word score in the arm's score (in (0, 1]); at most :data:`MAX_FRAGMENTS`
    fragments. Anything else is a ``ValueError`` (a ``TypeError`` for a text that is not a
    ``str``)."""

    fragments: tuple[tuple[str, float], ...]
    share: float
    per_fragment: bool = False
    """Whether each fragment's match is divided by its best memory's before the fragments are
    summed by weight (each word counted in its heaviest fragment), so a fragment whose words
    only a few memories hold still gives its best one its whole weight. The pipeline sets it
    for an arm that borrows its words beside a contextual encoder's sentence vectors."""

    def __attrs_post_init__(self) -> None:
        share = self.share
        if isinstance(share, bool) or not isinstance(share, (int, float)) \
                or not 0.0 < share <= 1.0:
            raise ValueError(f"WordQuery.share must be in (0, 1], got {share!r}")
        if len(self.fragments) > MAX_FRAGMENTS:
            raise ValueError(f"WordQuery holds at most {MAX_FRAGMENTS} fragments, "
                             f"got {len(self.fragments)}")
        for text, weight in self.fragments:
            if not isinstance(text, str):
                raise TypeError(f"a WordQuery fragment must be a str, got {type(text).__name__}")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                    or not math.isfinite(weight) or weight < 0:
                raise ValueError(f"a WordQuery weight must be a finite number >= 0, "
                                 f"got {weight!r}")


@attrs.define(eq=False)
class WordVectors:
    """Unit vectors of single words by one adapter, the most recently used ``capacity`` kept.

    Safe from several threads at once (one search's worker thread builds a cell's index while
    another's embeds a query's words): the table is locked, the model is not (its ``embed`` runs
    unlocked, so a word two callers miss together is embedded twice, to the same vector).
    """

    embed: Embed
    capacity: int = 20_000
    _known: OrderedDict[str, npt.NDArray[np.float32]] = attrs.field(
        factory=OrderedDict, init=False
    )
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def of(self, words: Sequence[str]) -> npt.NDArray[np.float32]:
        """The vectors of ``words`` (one row each), the missing ones embedded in one batch."""
        while True:
            with self._lock:
                missing = []
                for word in dict.fromkeys(words):
                    if word in self._known:
                        self._known.move_to_end(word)  # kept while the others are embedded
                    else:
                        missing.append(word)
            embedded = self.embed(missing) if missing else ()
            with self._lock:
                for word, vector in zip(missing, embedded, strict=True):
                    norm = float(np.linalg.norm(vector))
                    self._known[word] = (vector / norm).astype(np.float32) \
                        if norm > 0 and math.isfinite(norm) else np.zeros_like(vector)
                if all(word in self._known for word in words):  # none evicted meanwhile
                    rows = [self._known[word] for word in words]
                    for word in words:
                        self._known.move_to_end(word)
                    while len(self._known) > self.capacity:
                        self._known.popitem(last=False)
                    break
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack(rows)


@attrs.frozen(eq=False)
class WordIndex:
    """The words of a cell's memories: row ``i`` is the matrix's memory ``i``.

    ``flat[starts[i]:starts[i + 1]]`` are memory ``i``'s word ids (at least one: a memory
    without words holds the padding id, whose vector is zero).
    """

    vocabulary: dict[str, int]
    vectors: npt.NDArray[np.float32]
    """One unit vector per word id, plus a zero row (the padding id) last."""
    document_frequency: npt.NDArray[np.float64]
    flat: npt.NDArray[np.intp]
    starts: npt.NDArray[np.intp]

    @property
    def count(self) -> int:
        return len(self.starts)

    @classmethod
    def build(cls, texts: Sequence[str], vectors: WordVectors) -> WordIndex:
        """The index of ``texts`` (the memories, in the matrix's order)."""
        empty = np.zeros(0, dtype=np.intp)
        return cls({}, np.zeros((1, 1), dtype=np.float32), np.zeros(0), empty, empty) \
            .extended(texts, vectors)

    def extended(self, texts: Sequence[str], vectors: WordVectors) -> WordIndex:
        """This index with the memories ``texts`` appended (a new index: this one is left as
        it is). Only the words the index did not hold yet are looked up in ``vectors``."""
        vocabulary = dict(self.vocabulary)
        added: list[int] = []
        starts: list[int] = []
        held = len(self.vocabulary)
        documents = [[vocabulary.setdefault(word, len(vocabulary)) for word in match_words(text)]
                     for text in texts]
        pad = len(vocabulary)
        for words in documents:
            starts.append(len(self.flat) + len(added))
            added.extend(words or [pad])
        flat = np.concatenate([self.flat, np.array(added, dtype=np.intp)])
        flat[: len(self.flat)][self.flat == held] = pad  # the padding id moves past new words
        frequency = np.zeros(pad, dtype=np.float64)
        frequency[:held] = self.document_frequency
        np.add.at(frequency, np.array([word for words in documents for word in words],
                                      dtype=np.intp), 1.0)
        table = vectors.of(list(vocabulary)[held:])
        width = table.shape[1] if pad > held else self.vectors.shape[1]
        padded = np.zeros((pad + 1, width), dtype=np.float32)
        padded[:held] = self.vectors[:held]
        if pad > held:
            padded[held:pad] = table
        return WordIndex(vocabulary, padded, frequency, flat,
                         np.concatenate([self.starts, np.array(starts, dtype=np.intp)]))

    @property
    def nbytes(self) -> int:
        return int(self.vectors.nbytes + self.flat.nbytes + self.starts.nbytes
                   + self.document_frequency.nbytes + 80 * len(self.vocabulary))

    def scores(self, query: WordQuery, vectors: WordVectors) -> npt.NDArray[np.float64]:
        """Each memory's word score for ``query`` (0 for every memory when no fragment has a
        word): :meth:`asked` (it embeds the query's new words), then :meth:`scored`; or, for a
        query scored :attr:`~WordQuery.per_fragment`, :meth:`per_fragment`."""
        if query.per_fragment:
            return self.per_fragment(query, vectors)
        return self.scored(*self.asked(query, vectors))

    def per_fragment(self, query: WordQuery, vectors: WordVectors) -> npt.NDArray[np.float64]:
        """Each memory's word score, fragment by fragment (:meth:`fragment_matches`): each
        fragment's match divided by its best memory's, then summed by the fragments'
        weights."""
        total = np.zeros(self.count, dtype=np.float64)
        for weight, match in self.fragment_matches(query, vectors):
            top = float(match.max())
            total += weight * (match / top if top > 0 else match)
        return total

    def fragment_matches(
        self, query: WordQuery, vectors: WordVectors
    ) -> Iterator[tuple[float, npt.NDArray[np.float64]]]:
        """Each fragment's weight and each memory's match for it, from the heaviest fragment:
        each word in the first fragment that holds it (a fragment left with no word of its
        own is skipped), its words weighed by their share of its rarity (``idf`` in the
        cell)."""
        parts = sorted(((match_words(text), weight) for text, weight in query.fragments
                        if weight > 0), key=lambda part: -part[1])
        asked = list(dict.fromkeys(word for words, _ in parts for word in words))
        table = vectors.of(asked) if asked and self.count else None
        if table is None or table.shape[1] != self.vectors.shape[1]:  # as :meth:`scored`
            return
        best = self.best_matches(table)
        column = {word: i for i, word in enumerate(asked)}
        seen: set[str] = set()
        for words, weight in parts:
            fresh = [word for word in words if word not in seen]
            seen.update(fresh)
            if not fresh:
                continue
            yield weight, np.einsum("nq,q->n", best[:, [column[w] for w in fresh]],
                                    self.rarity_shares(fresh))

    def asked(
        self, query: WordQuery, vectors: WordVectors
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float64]]:
        """The query's distinct words as vectors, and each word's coefficient: the largest,
        over the fragments holding it, of the fragment's weight times the word's share of the
        fragment's rarity (``idf`` in the cell). A word counts once, so a common word the
        fields repeat is not summed over a name one field gives."""
        fragments = [(match_words(text), weight) for text, weight in query.fragments
                     if weight > 0]
        asked = list(dict.fromkeys(word for words, _ in fragments for word in words))
        coefficients = np.zeros(len(asked), dtype=np.float64)
        if not asked or not self.count:
            return np.zeros((0, self.vectors.shape[1]), dtype=np.float32), coefficients
        row = {word: i for i, word in enumerate(asked)}
        for words, weight in fragments:
            if words:
                np.maximum.at(coefficients, [row[w] for w in words],
                              weight * self.rarity_shares(words))
        return vectors.of(asked), coefficients

    def rarity_shares(self, words: Sequence[str]) -> npt.NDArray[np.float64]:
        """Each of ``words``' share of their rarity in the cell (``log(1 + N / (1 + df))``,
        a word the cell lacks at its rarest): a fragment's words weighed against each other."""
        frequency = np.array([self.document_frequency[self.vocabulary[w]]
                              if w in self.vocabulary else 0.0 for w in words])
        rarity = np.log1p(float(self.count) / (1.0 + frequency))
        shares: npt.NDArray[np.float64] = rarity / rarity.sum()
        return shares

    def scored(
        self, table: npt.NDArray[np.float32], coefficients: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Each memory's word score from the asked words' vectors and coefficients (a pure
        function of this immutable index)."""
        if not self.count or not len(table) or table.shape[1] != self.vectors.shape[1]:
            return np.zeros(self.count, dtype=np.float64)
        scores: npt.NDArray[np.float64] = np.einsum(
            "nq,q->n", self.best_matches(table), coefficients)
        return scores

    def best_matches(self, table: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Each memory's best match for each word of ``table`` (a row per memory, a column per
        word): the cosines clipped to [0, 1], the max over the memory's words (one reduceat
        over the flat word list). ``table`` has the index's width and at least one row."""
        # einsum, not ``@``: BLAS's threads spin-wait and starve the store's SQLite thread.
        similar = np.clip(np.einsum("vd,qd->vq", self.vectors, table), 0.0, 1.0)
        best: npt.NDArray[np.float32] = np.maximum.reduceat(
            similar[self.flat], self.starts, axis=0)
        return best


def mixed(
    cosines: npt.NDArray[np.float32], words: npt.NDArray[np.float64], share: float
) -> npt.NDArray[np.float64]:
    """``(1 - share) * cosine / best cosine + share * words / best words`` (a best that is not
    positive divides by 1)."""
    top_cosine = float(cosines.max(initial=0.0))
    top_words = float(words.max(initial=0.0))
    return ((1.0 - share) * cosines.astype(np.float64) / (top_cosine if top_cosine > 0 else 1.0)
            + share * words / (top_words if top_words > 0 else 1.0))
