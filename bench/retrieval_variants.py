"""Retrieval variants that were measured and not kept, kept runnable.

Each variant changes how the task-context query's fragments are weighed (most of them in the
semantic arm), patched over the shipped code for one run (nothing here is reachable from the
library), and prints the same table as :mod:`bench.tune_ranking`:

    python -m bench.retrieval_variants --variant fragment-cosines --scenarios FILE

- ``default``: the shipped arm, for the same run's reference.
- ``fragment-cosines``: each fragment's cosines divided by the best in the cell, then summed
  by the fragments' weights (the sparse arm's "share"), instead of one combined vector.
- ``fragment-words``: the word match summed per fragment the same way: each word in its
  heaviest fragment, each fragment's match divided by its best in the cell. Shipped for an arm
  that borrows its words (MiniLM with WordLlama's, ``WordQuery.per_fragment``); the variant
  scores every arm's words so.
- ``fragment-words-roots``: the same per fragment, without the division: each fragment's
  match (in [0, 1]) enters as its square root, as the sparse arm's shares do (round seven).
- ``word-squares``, ``word-floor``: a word's match with a memory's nearest word sharpened,
  squared or as ``(cosine - 0.3) / 0.7``, so only close words count (round seven).
- ``entities-fourth-root``: the entities share their role weight as ``weight / n ** 0.25``
  instead of ``weight / sqrt(n)`` (more weight on names).
- ``whole-query``: the whole query's sentence vector joins the combined vector with a quarter
  of the fragments' total weight.
- ``feedback``: pseudo-relevance feedback for notes linked through another note (the editor
  a note names, the form another note asks for): the rare words (in at most two memories of
  the cell, at most eight) of the arm's first two memories join the word match as fragments
  worth a tenth of the query's weight each.
- ``sparse-idf-mass``: each fragment's bm25 list divided by the larger of its best score and
  the fragment's idf mass (the sum of its terms' idf in the cell, about what a memory holding
  every term once scores), instead of by its best alone: a fragment whose best match holds only
  its common words counts less than one whose best holds its rare ones (round eight).
- ``aspect-diversity``: the first twenty of the ranking reordered greedily so the top covers
  the state's fields (xQuAD, Santos et al.): each next memory by half its relevance (its score
  over the best) and half the weighted share of each fragment's content words it holds, times
  how little the memories already placed cover that fragment (round eight).
- ``names-from-fields``: the names and ids of every field but the request (a capitalised word
  that does not start a sentence, a word with a digit) also join the word match as one more
  fragment, worth half the entities' weight (scaled as the other fields are beside a request
  that carries content), so a name the objective or a task gives weighs at least as the next
  action's words (round eight).
- ``request-new-words``: a short request keeps its whole weight when one of its content words
  occurs in the scope's notes and in no other field of the query (a topic the state does not
  name: "honeymoon flights next" while the seating plan is in flight), instead of
  ``(found / 4) ** 2`` of it (round nine).
- ``word-precision``, ``word-precision-1``: the word score times the memory's precision to the
  power 0.5 or 1: the rarity-weighted share of the memory's own words that some query word
  matches (each at its best cosine), so a memory the state explains little counts less
  (round ten).
- ``topic-coherence``, ``topic-neighbours``: the fused ranking's first fifteen re-scored by
  how close each one's sentence vector is to the others', so the notes of the work in progress,
  which are about one thing, lift each other and a distractor that shares a word from another
  topic stands alone: 0.8 of the fused score (over the best) plus 0.2 of the coherence, scaled
  to [0, 1] over the fifteen; the coherence is the mean cosine to the other fourteen weighted
  by their fused scores (``topic-coherence``, 0.4 of it) or to its three nearest
  (``topic-neighbours``) (round eleven).
- ``semantic-aspects`` (``-3``, ``-7``, ``-p2``, ``-p8``): xQuAD over the first twenty as
  ``aspect-diversity``, each field's coverage by a note its sentence-vector cosine with the
  field over the best of the twenty, to the power 4 (``-p2``, ``-p8``: 2, 8), half coverage and
  half score (``-3``, ``-7``: 0.3, 0.7 coverage) (round seventeen).
- ``objective-gate``, ``context-gate``: the fused ranking's first fifteen re-scored by how
  close each one's sentence vector is to the objective's (``context-``: to the mean of the
  objective's, the open questions', the constraints' and the entities'), so a note that echoes
  the next action's words about another matter (a boiler engineer's home visit beside a
  rescue's) falls: 0.8 of the fused score (over the best) plus 0.2 of the closeness, scaled to
  [0, 1] over the fifteen (round nineteen).
- ``task-echo``: a pending task whose content words are at least half those of the next
  action (by Jaccard) weighs nothing, and the role's weight is shared by the tasks left, so the
  next action's words are not counted twice in the combined vector (round nineteen).
- ``beliefs-words-once``: the beliefs' placement (:func:`~plugin.memory.ranking.query_coverage`)
  counts a word several fragments hold once, in the heaviest of them, as the sparse arm does.

The figures are in the evaluation documentation.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import math
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import attrs
import numpy as np

from plugin.memory import pipeline, ranking
from plugin.memory.query import FragmentRole
from plugin.memory.ranking import RankingPolicy, combined_vector
from plugin.memory.store import MemoryStore, sparse_index, vectors, words
from plugin.memory.store.search import MAX_QUERY_TERMS
from plugin.memory.terms import word_terms

from .tune_ranking import DEVSET, run

_FRAGMENTS: dict[bytes, tuple[Any, Any]] = {}
_WHOLE: contextvars.ContextVar[Any] = contextvars.ContextVar("whole", default=None)


@contextlib.contextmanager
def _fragment_cosines() -> Iterator[None]:
    def combined(vecs: Sequence[Any], weights: Sequence[float]) -> Any:
        result = combined_vector(vecs, weights)
        if result is not None and len(vecs) > 1:
            _FRAGMENTS[result.tobytes()] = (np.stack(vecs), np.asarray(weights))
        return result

    shipped = vectors.Matrix.scores

    def scores(self: vectors.Matrix, query: Any) -> Any:
        held = _FRAGMENTS.get(np.asarray(query, dtype=np.float32).tobytes())
        if held is None:
            return shipped(self, query)
        cosines = np.einsum("ij,fj->if", self.vectors, held[0]).astype(np.float64)
        best = cosines.max(axis=0)
        return (np.clip(cosines, 0, None) / np.where(best > 0, best, 1.0)) @ held[1]

    try:
        with mock.patch.object(pipeline, "combined_vector", combined), \
                mock.patch.object(vectors.Matrix, "scores", scores):
            yield
    finally:
        _FRAGMENTS.clear()


@contextlib.contextmanager
def _fragment_words(*, power: float | None = None) -> Iterator[None]:
    def scores(self: words.WordIndex, query: words.WordQuery, table: words.WordVectors) -> Any:
        if power is None:  # the shipped per-fragment match, for every arm
            return self.per_fragment(query, table)
        total = np.zeros(self.count)
        for weight, match in self.fragment_matches(query, table):
            total += weight * match ** power
        return total

    with mock.patch.object(words.WordIndex, "scores", scores):
        yield


@contextlib.contextmanager
def _word_matches(transform: Callable[[Any], Any]) -> Iterator[None]:
    """Each best match through ``transform``, non-decreasing on [0, 1], so transforming the
    best match is transforming every match before the best is taken."""
    shipped = words.WordIndex.best_matches

    def best_matches(self: words.WordIndex, table: Any) -> Any:
        return transform(shipped(self, table))

    with mock.patch.object(words.WordIndex, "best_matches", best_matches):
        yield


@contextlib.contextmanager
def _entities_fourth_root() -> Iterator[None]:
    shipped = pipeline.fragment_weights

    def weights(query: Any, policy: RankingPolicy, *, request_share: float = 1.0) -> Any:
        found = shipped(query, policy, request_share=request_share)
        entities = sum(role is FragmentRole.ENTITY for role in query.roles)
        scale = math.sqrt(entities) / entities ** 0.25 if entities else 1.0
        return tuple(weight * scale if role is FragmentRole.ENTITY else weight
                     for weight, role in zip(found, query.roles, strict=True))

    with mock.patch.object(pipeline, "fragment_weights", weights):
        yield


@contextlib.contextmanager
def _whole_query() -> Iterator[None]:
    shipped = pipeline.MemoryRetriever._semantic

    async def semantic(self: Any, prepared: Any, *args: Any) -> Any:
        token = _WHOLE.set(prepared.semantic.vector)
        try:
            return await shipped(self, prepared, *args)
        finally:
            _WHOLE.reset(token)

    def combined(vecs: Sequence[Any], weights: Sequence[float]) -> Any:
        whole = _WHOLE.get()
        if whole is None:
            return combined_vector(vecs, weights)
        return combined_vector([*vecs, whole], [*weights, 0.25 * math.fsum(weights)])

    with mock.patch.object(pipeline.MemoryRetriever, "_semantic", semantic), \
            mock.patch.object(pipeline, "combined_vector", combined):
        yield


@contextlib.contextmanager
def _feedback(
    first: int = 2, rare: float = 2.0, most: int = 8, share: float = 0.1
) -> Iterator[None]:
    asked = threading.local()  # scores() and mixed() run in one worker thread, in this order
    shipped_scores, shipped_mixed = words.WordIndex.scores, words.mixed

    def scores(self: words.WordIndex, query: words.WordQuery, table: words.WordVectors) -> Any:
        asked.last = (self, query, table)
        return shipped_scores(self, query, table)

    def mixed(cosines: Any, matched: Any, word_share: float) -> Any:
        ranked = shipped_mixed(cosines, matched, word_share)
        last, asked.last = getattr(asked, "last", None), None
        if last is None or len(last[1].fragments) < 2:
            return ranked  # the baseline's one whole query is left as it is
        index, query, table = last
        names = {i: word for word, i in index.vocabulary.items()}
        known = {word for text, _ in query.fragments for word in words.match_words(text)}
        ends = [*index.starts[1:].tolist(), len(index.flat)]
        weight = share * math.fsum(weight for _, weight in query.fragments)
        fragments = []
        for row in np.argsort(-ranked, kind="stable")[:first].tolist():
            found = sorted((index.document_frequency[i], names[i])
                           for i in index.flat[index.starts[row]:ends[row]].tolist()
                           if i in names and names[i] not in known
                           and index.document_frequency[i] <= rare)[:most]
            if found:
                fragments.append((" ".join(word for _, word in found), weight))
        if not fragments:
            return ranked
        extra = shipped_scores(index, words.WordQuery(tuple(fragments), query.share), table)
        return shipped_mixed(cosines, matched + extra, word_share)

    with mock.patch.object(words.WordIndex, "scores", scores), \
            mock.patch.object(vectors, "mixed", mixed):
        yield


@contextlib.contextmanager
def _beliefs_words_once() -> Iterator[None]:
    def coverage(query: Any, policy: RankingPolicy) -> Callable[[str], float]:
        if ranking.uses_fragments(query):
            weights = ranking.fragment_weights(query, policy)
            parts = [(weight, frozenset(terms))
                     for weight, terms in ranking.fragment_terms(query.fragments, weights)]
        else:
            parts = [(1.0, ranking._content(query.text))]
        total = math.fsum(weight for weight, terms in parts if terms)

        def covered(text: str) -> float:
            found = ranking._content(text)
            return math.fsum(weight * len(terms & found) / len(terms)
                             for weight, terms in parts if terms) / total if total > 0 else 0.0

        return covered

    with mock.patch.object(ranking, "query_coverage", coverage):
        yield


def _idf_mass(principal: str, scope: str, query: str) -> Callable[[Any], float]:
    """The sum of ``query``'s terms' weights in the cell, as the sparse arm's bm25 weighs them
    (:func:`~plugin.memory.store.sparse_index.cell_query`)."""
    asked = list(word_terms(query, limit=MAX_QUERY_TERMS, fold=False))

    def run(conn: Any) -> float:
        terms = sparse_index.cell_query(conn, principal, scope, asked)
        return math.fsum(weight for _, weight in terms.terms) if terms is not None else 0.0

    return run


@contextlib.contextmanager
def _sparse_idf_mass() -> Iterator[None]:
    masses: dict[int, float] = {}  # by the id of the list the store returned, while it lives
    shipped = MemoryStore.sparse_candidates

    async def candidates(self: MemoryStore, query: str, *, principal: str, scope: str,
                         limit: int) -> Any:
        found = await shipped(self, query, principal=principal, scope=scope, limit=limit)
        connection = self._search.db.connection()
        masses[id(found)] = await connection.run(_idf_mass(principal, scope, query))
        return found

    def fuse(lists: Sequence[tuple[float, Sequence[Any]]], *, normalise: bool = True,
             power: float = 1.0) -> Any:
        scaled = []
        for weight, ranked in lists:
            top = max((item.score for item in ranked), default=0.0)
            scale = max(top, masses.pop(id(ranked), 0.0))
            scaled.append((weight * (top / scale) ** power if scale > 0 else weight, ranked))
        return ranking.weighted_score_fuse(scaled, normalise=normalise, power=power)

    try:
        with mock.patch.object(MemoryStore, "sparse_candidates", candidates), \
                mock.patch.object(pipeline, "weighted_score_fuse", fuse):
            yield
    finally:
        masses.clear()


def _aspect_terms(text: str) -> frozenset[str]:
    """Content words, a plural's final ``s`` dropped (a crude stem: the arms' own stemming is
    the index's)."""
    return frozenset(term[:-1] if len(term) > 3 and term.endswith("s") else term
                     for term in ranking._content(text) if len(term) > 1)


def _diversified(ranked: Sequence[Any], aspects: Sequence[tuple[float, frozenset[str]]],
                 *, share: float, top: int) -> list[Any]:
    """xQuAD over the first ``top`` of ``ranked``; the rest keep their order after them."""
    head, tail = list(ranked[:top]), list(ranked[top:])
    best = max((item.score for item in head), default=0.0) or 1.0
    covers = {id(item): [len(terms & _aspect_terms(item.text)) / len(terms)
                         for _, terms in aspects] for item in head}
    left = [1.0] * len(aspects)
    placed = []
    while head:
        gains = [(1 - share) * item.score / best + share * math.fsum(
            weight * cover * rest for (weight, _), cover, rest
            in zip(aspects, covers[id(item)], left, strict=True)) for item in head]
        chosen = head.pop(gains.index(max(gains)))  # the first of equals: the ranking's order
        placed.append(chosen)
        left = [rest * (1 - cover) for rest, cover in zip(left, covers[id(chosen)],
                                                           strict=True)]
    return placed + tail


@contextlib.contextmanager
def _aspect_diversity(share: float = 0.5, top: int = 20) -> Iterator[None]:
    shipped = pipeline.MemoryRetriever._rank

    async def rank(self: Any, prepared: Any, principal: str, scope: str, *args: Any) -> Any:
        ranked = await shipped(self, prepared, principal, scope, *args)
        query = prepared.query
        if not ranking.uses_fragments(query) or len(ranked) < 2:
            return ranked
        weights = ranking.fragment_weights(
            query, self.ranking,
            request_share=await self._request_share(query, principal, scope))
        parts = [(weight, _aspect_terms(fragment))
                 for weight, fragment in zip(weights, query.fragments, strict=True)]
        parts = [(weight, terms) for weight, terms in parts if weight > 0 and terms]
        total = math.fsum(weight for weight, _ in parts)
        if total <= 0:
            return ranked
        return _diversified(ranked, [(weight / total, terms) for weight, terms in parts],
                            share=share, top=top)

    with mock.patch.object(pipeline.MemoryRetriever, "_rank", rank):
        yield


@contextlib.contextmanager
def _semantic_aspects(share: float = 0.5, top: int = 20, power: float = 4.0) -> Iterator[None]:
    """xQuAD over the fields, coverage read by the sentence model: each fragment's cosine with
    each of the first ``top`` memories, over the best of them, to the power ``power``."""
    shipped = pipeline.MemoryRetriever._rank

    async def rank(self: Any, prepared: Any, principal: str, scope: str, caps: Any,
                   arms: list[str], notes: list[str]) -> Any:
        ranked = await shipped(self, prepared, principal, scope, caps, arms, notes)
        query = prepared.query
        if not {"sparse", "semantic"} <= set(arms) or len(ranked) < 2:
            return ranked  # the fused arm only
        if not ranking.uses_fragments(query):
            return ranked
        weights = ranking.fragment_weights(
            query, self.ranking,
            request_share=await self._request_share(query, principal, scope))
        parts = [(w, f) for w, f in zip(weights, query.fragments, strict=True) if w > 0]
        if len(parts) < 2:
            return ranked
        total = math.fsum(w for w, _ in parts)
        head, tail = list(ranked[:top]), list(ranked[top:])
        embed = self.store.embedding.embed
        frags = np.asarray(embed([f for _, f in parts]), dtype=np.float64)
        mems = np.asarray(embed([item.text for item in head]), dtype=np.float64)
        cos = np.clip(mems @ frags.T, 0.0, None)
        best = cos.max(axis=0)
        cover = (cos / np.where(best > 0, best, 1.0)) ** power
        aspect = np.array([w / total for w, _ in parts])
        scores = np.array([item.score for item in head])
        scores = scores / (scores.max() or 1.0)
        left = np.ones(len(parts))
        order: list[int] = []
        rest = list(range(len(head)))
        while rest:
            gains = [(1 - share) * scores[i] + share * float((aspect * cover[i] * left).sum())
                     for i in rest]
            chosen = rest.pop(gains.index(max(gains)))
            order.append(chosen)
            left = left * (1 - cover[chosen])
        return [head[i] for i in order] + tail

    with mock.patch.object(pipeline.MemoryRetriever, "_rank", rank):
        yield


_NAME = re.compile(r"[^\W_](?:[\w\-#./@']*[^\W_])?")
_NAMES: contextvars.ContextVar[tuple[str, float] | None] = contextvars.ContextVar(
    "names", default=None)


def _names(texts: Sequence[str]) -> list[str]:
    """Capitalised words that do not start a sentence, and words with a digit, in order."""
    found: list[str] = []
    for text in texts:
        for match in _NAME.finditer(text):
            word, before = match.group(0), text[:match.start()].rstrip()
            capital = word[0].isupper() and len(word) > 1 and bool(before) \
                and before[-1] not in ".!?:;" and word.casefold() not in ranking.STOPWORDS
            if (capital or any(c.isdigit() for c in word)) and word not in found:
                found.append(word)
    return found


@contextlib.contextmanager
def _names_from_fields(share: float = 0.5) -> Iterator[None]:
    shipped_semantic, shipped_query = pipeline.MemoryRetriever._semantic, pipeline.WordQuery

    async def semantic(self: Any, prepared: Any, weights: Sequence[float], *args: Any) -> Any:
        query, policy = prepared.query, self.ranking
        fields = [(role, text, weight) for role, text, weight
                  in zip(query.roles, query.fragments, weights, strict=False)
                  if role is not FragmentRole.REQUEST and weight > 0]
        counts = {role: query.roles.count(role) for role in query.roles}
        # The other fields' scale beside the request (1 when it carries no content).
        scale = next((weight * math.sqrt(counts[role]) / policy.role_weight(role)
                      for role, _, weight in fields), None)
        found = _names([text for _, text, _ in fields])
        token = _NAMES.set((" ".join(found), share * policy.entity * scale)
                           if found and scale is not None else None)
        try:
            return await shipped_semantic(self, prepared, weights, *args)
        finally:
            _NAMES.reset(token)

    def word_query(fragments: tuple[tuple[str, float], ...], word_share: float) -> Any:
        names = _NAMES.get()
        if names is not None and len(fragments) < words.MAX_FRAGMENTS:
            fragments = (*fragments, names)
        return shipped_query(fragments, word_share)

    with mock.patch.object(pipeline.MemoryRetriever, "_semantic", semantic), \
            mock.patch.object(pipeline, "WordQuery", word_query):
        yield


@contextlib.contextmanager
def _request_new_words() -> Iterator[None]:
    shipped = pipeline.MemoryRetriever._request_share

    async def request_share(self: pipeline.MemoryRetriever, query: Any, principal: str,
                            scope: str) -> float:
        share = await shipped(self, query, principal, scope)
        if share >= 1.0 or FragmentRole.REQUEST not in query.roles:
            return share
        at = query.roles.index(FragmentRole.REQUEST)
        content, _ = ranking.request_terms(query.fragments[at],
                                           short=self.ranking.short_words)
        state = {term for i, fragment in enumerate(query.fragments) if i != at
                 for term in word_terms(fragment, limit=None)}
        for term in content:
            if term not in state and await self.store.sparse_candidates(
                    term, principal=principal, scope=scope, limit=1):
                return 1.0
        return share

    with mock.patch.object(pipeline.MemoryRetriever, "_request_share", request_share):
        yield


@contextlib.contextmanager
def _word_precision(power: float = 0.5) -> Iterator[None]:
    """The word score times the memory's precision to the ``power``: the rarity-weighted share
    of the memory's own words that some query word matches (each at its best cosine)."""
    shipped = words.WordIndex.scores

    def scores(self: words.WordIndex, query: words.WordQuery, known: words.WordVectors) -> Any:
        found = shipped(self, query, known)  # summed or per fragment, as the arm scores them
        table, _ = self.asked(query, known)  # the query's words' vectors
        if not self.count or not len(table) or table.shape[1] != self.vectors.shape[1]:
            return found
        similar = np.clip(np.einsum("vd,qd->vq", self.vectors, table), 0.0, 1.0).max(axis=1)
        documents = float(self.count)
        rarity = np.append(np.log1p(documents / (1.0 + self.document_frequency)), 0.0)
        covered = np.add.reduceat((similar * rarity)[self.flat], self.starts)
        mass = np.add.reduceat(rarity[self.flat], self.starts)
        precision = np.divide(covered, mass, out=np.zeros_like(covered), where=mass > 0)
        return found * precision ** power

    with mock.patch.object(words.WordIndex, "scores", scores):
        yield


def _mixed_head(ranked: list[Any], top: int, signal: Any, share: float) -> list[Any]:
    """The first ``top`` of ``ranked`` re-scored: ``1 - share`` of each one's score over the
    best, plus ``share`` of ``signal`` scaled to [0, 1] over them; the rest as they were."""
    head = ranked[:top]
    scores = np.array([item.score for item in head])
    scores = scores / (scores.max() or 1.0)
    spread = float(signal.max() - signal.min()) or 1.0
    mixed = (1 - share) * scores + share * (signal - signal.min()) / spread
    order = sorted(range(len(head)), key=lambda index: -mixed[index])
    return [attrs.evolve(head[i], score=float(mixed[i])) for i in order] + ranked[top:]


@contextlib.contextmanager
def _topic_coherence(share: float, *, nearest: int | None = None, top: int = 15
                     ) -> Iterator[None]:
    shipped = pipeline.MemoryRetriever._rank

    async def rank(self: Any, prepared: Any, principal: str, scope: str, caps: Any,
                   arms: list[str], notes: list[str]) -> Any:
        ranked = await shipped(self, prepared, principal, scope, caps, arms, notes)
        if not {"sparse", "semantic"} <= set(arms) or len(ranked) < 3:
            return ranked  # the fused arm only
        head = ranked[:top]
        vectors = self.store.embedding.embed([item.text for item in head])
        close = vectors @ vectors.T
        np.fill_diagonal(close, 0.0)
        scores = np.array([item.score for item in head])
        scores = scores / (scores.max() or 1.0)
        if nearest is None:
            coherence = (close * scores).sum(axis=1) / np.maximum(scores.sum() - scores, 1e-9)
        else:
            coherence = np.sort(close, axis=1)[:, -nearest:].mean(axis=1)
        return _mixed_head(ranked, top, coherence, share)

    with mock.patch.object(pipeline.MemoryRetriever, "_rank", rank):
        yield


_ANCHORS = {
    "objective": frozenset({FragmentRole.OBJECTIVE}),
    "context": frozenset({FragmentRole.OBJECTIVE, FragmentRole.QUESTION,
                          FragmentRole.CONSTRAINT, FragmentRole.ENTITY}),
}


@contextlib.contextmanager
def _anchor_gate(anchor: str, share: float = 0.2, top: int = 15) -> Iterator[None]:
    shipped = pipeline.MemoryRetriever._rank
    roles = _ANCHORS[anchor]

    async def rank(self: Any, prepared: Any, principal: str, scope: str, caps: Any,
                   arms: list[str], notes: list[str]) -> Any:
        ranked = await shipped(self, prepared, principal, scope, caps, arms, notes)
        query, fragments = prepared.query, prepared.semantic.fragment_vectors
        picked = [vector for vector, role in zip(fragments, query.roles, strict=False)
                  if role in roles]
        if not {"sparse", "semantic"} <= set(arms) or len(ranked) < 3 or not picked \
                or len(fragments) != len(query.fragments):
            return ranked
        centre = np.mean(np.stack(picked), axis=0)
        close = self.store.embedding.embed([item.text for item in ranked[:top]]) @ (
            centre / (np.linalg.norm(centre) or 1.0))
        return _mixed_head(ranked, top, close, share)

    with mock.patch.object(pipeline.MemoryRetriever, "_rank", rank):
        yield


@contextlib.contextmanager
def _task_echo(threshold: float = 0.5) -> Iterator[None]:
    def weights(query: Any, policy: RankingPolicy, *, request_share: float = 1.0) -> Any:
        roles = list(query.roles)
        if FragmentRole.NEXT_ACTION not in roles:
            return ranking.fragment_weights(query, policy, request_share=request_share)
        step = set(ranking.search_terms(query.fragments[roles.index(FragmentRole.NEXT_ACTION)]))
        echoed = set()
        for index, (role, text) in enumerate(zip(roles, query.fragments, strict=True)):
            terms = set(ranking.search_terms(text))
            if role is FragmentRole.TASK and terms \
                    and len(terms & step) / len(terms | step) >= threshold:
                echoed.add(index)
        share = max(0.0, min(1.0, request_share))
        others = 1.0 - share * (1.0 - policy.context)
        counts: dict[Any, int] = {}
        for index, role in enumerate(roles):
            if index not in echoed:
                counts[role] = counts.get(role, 0) + 1
        return tuple(
            0.0 if index in echoed else policy.role_weight(role) / math.sqrt(counts[role])
            * (share if role is FragmentRole.REQUEST else others)
            for index, role in enumerate(roles))

    with mock.patch.object(pipeline, "fragment_weights", weights):
        yield


VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "default": contextlib.nullcontext,
    "fragment-cosines": _fragment_cosines,
    "fragment-words": _fragment_words,
    "fragment-words-roots": lambda: _fragment_words(power=0.5),
    "word-squares": lambda: _word_matches(lambda similar: similar ** 2),
    "word-floor": lambda: _word_matches(lambda similar: np.clip((similar - 0.3) / 0.7, 0, 1)),
    "entities-fourth-root": _entities_fourth_root,
    "whole-query": _whole_query,
    "feedback": _feedback,
    "beliefs-words-once": _beliefs_words_once,
    "sparse-idf-mass": _sparse_idf_mass,
    "aspect-diversity": _aspect_diversity,
    "names-from-fields": _names_from_fields,
    "semantic-aspects": _semantic_aspects,
    "semantic-aspects-3": lambda: _semantic_aspects(0.3),
    "semantic-aspects-7": lambda: _semantic_aspects(0.7),
    "semantic-aspects-p2": lambda: _semantic_aspects(power=2.0),
    "semantic-aspects-p8": lambda: _semantic_aspects(power=8.0),
    "request-new-words": _request_new_words,
    "word-precision": _word_precision,
    "word-precision-1": lambda: _word_precision(1.0),
    "topic-coherence": lambda: _topic_coherence(0.4),
    "topic-neighbours": lambda: _topic_coherence(0.2, nearest=3),
    "objective-gate": lambda: _anchor_gate("objective"),
    "context-gate": lambda: _anchor_gate("context"),
    "task-echo": _task_echo,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=sorted(VARIANTS), action="append")
    parser.add_argument("--scenarios", type=Path, default=DEVSET)
    args = parser.parse_args()
    for name in args.variant or list(VARIANTS):
        with VARIANTS[name]():
            for line in run(name, RankingPolicy(), None, None, args.scenarios, None):
                print(f"fused below an arm: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
