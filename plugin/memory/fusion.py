"""Fusion: how ranked lists of evidence become one ranking.

Fusion by confidence. Arms are fused by weighted reciprocal rank with a small constant (k =
10, or 0 when the semantic arm matches words: :class:`~plugin.memory.ranking.RankingPolicy`),
each arm weighted by its policy weight times how peaked its own scores are
(:func:`peakedness`): an arm whose best candidate stands out votes louder than one whose
scores are compressed. Fusion by score shares (:func:`score_fuse`) is the other option. The
recent arm (the frozen control) only breaks ties, it never outvotes an arm that found
something. Within the sparse arm, the fragments' lists are summed by their scores
(:func:`weighted_score_fuse`).

Every function here is a pure function of its lists: deterministic, ties broken by rank in the
tie-breaker, then by kind and id. The weights come from :mod:`plugin.memory.ranking`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from .store import Evidence

__all__ = [
    "PEAK_DEPTH",
    "RRF_K",
    "peakedness",
    "score_fuse",
    "weighted_fuse",
    "weighted_score_fuse",
]

RRF_K = 60
"""Reciprocal-rank fusion constant (Cormack et al.): score = sum of weight / (k + rank)."""

PEAK_DEPTH = 10
""":func:`peakedness` compares an arm's best score with its score at this rank."""


def weighted_fuse(
    lists: Sequence[tuple[float, Sequence[Evidence]]],
    *,
    tie_breaker: Sequence[Evidence] = (),
    k: int = RRF_K,
) -> list[Evidence]:
    """Weighted reciprocal-rank fusion: score = sum of ``weight / (k + rank)``.

    Ties (equal scores) are broken by the rank in ``tie_breaker``, then by kind and id, so the
    order is deterministic. Items found only by ``tie_breaker`` come last, in its order: it
    breaks ties, it never outvotes a list. Lists of weight 0 contribute nothing.
    """
    scores: dict[tuple[str, str], float] = {}
    first: dict[tuple[str, str], Evidence] = {}
    for weight, ranked in lists:
        if weight <= 0:
            continue
        for rank, item in enumerate(ranked, start=1):
            key = (item.kind, item.id)
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
            first.setdefault(key, item)
    tie: dict[tuple[str, str], int] = {
        (item.kind, item.id): rank for rank, item in enumerate(tie_breaker)
    }
    for item in tie_breaker:
        key = (item.kind, item.id)
        if key not in scores:
            scores[key] = 0.0
            first[key] = item
    last = len(tie)
    order = sorted(scores, key=lambda key: (-scores[key], tie.get(key, last), key))
    return [attrs.evolve(first[key], score=scores[key]) for key in order]


def score_fuse(
    lists: Sequence[tuple[float, Sequence[Evidence]]],
    *,
    tie_breaker: Sequence[Evidence] = (),
) -> list[Evidence]:
    """Fuse arms by their own scores: each arm's scores are divided by its best, and an item
    an arm did not return gets that arm's lowest returned share (it ranked below every one it
    returned); the weighted shares are summed.

    So each arm votes with its own confidence: an arm whose scores are compressed (every
    candidate near its best) moves items little, an arm whose best stands out moves them
    much. Ties are broken by the rank in ``tie_breaker``, then by kind and id; items found only
    by ``tie_breaker`` come last, in its order. Lists of weight 0, empty lists and lists whose
    best score is not positive contribute nothing.
    """
    arms: list[tuple[float, dict[tuple[str, str], float], float]] = []
    first: dict[tuple[str, str], Evidence] = {}
    for weight, ranked in lists:
        top = max((item.score for item in ranked), default=0.0)
        if weight <= 0 or not math.isfinite(top) or top <= 0:
            continue
        shares: dict[tuple[str, str], float] = {}
        for item in ranked:
            key = (item.kind, item.id)
            shares.setdefault(key, max(item.score, 0.0) / top)
            first.setdefault(key, item)
        arms.append((weight, shares, min(shares.values())))
    scores = {
        key: math.fsum(weight * shares.get(key, lowest) for weight, shares, lowest in arms)
        for key in first
    }
    tie: dict[tuple[str, str], int] = {
        (item.kind, item.id): rank for rank, item in enumerate(tie_breaker)
    }
    for item in tie_breaker:
        key = (item.kind, item.id)
        if key not in scores:
            scores[key] = -1.0
            first[key] = item
    last = len(tie)
    order = sorted(scores, key=lambda key: (-scores[key], tie.get(key, last), key))
    return [attrs.evolve(first[key], score=max(scores[key], 0.0)) for key in order]


def peakedness(ranked: Sequence[Evidence], *, depth: int = PEAK_DEPTH) -> float:
    """How far an arm's best score stands above its score at rank ``depth``, relative to the
    best, in [0, 1] (a list shorter than ``depth`` counts its missing ranks as 0, so a short list
    is confident). 0 for an empty list or scores that are not positive and finite."""
    if not ranked:
        return 0.0
    best = ranked[0].score
    if not math.isfinite(best) or best <= 0:
        return 0.0
    floor = ranked[depth - 1].score if len(ranked) >= depth else 0.0
    if not math.isfinite(floor):
        return 0.0
    return max(0.0, min(1.0, (best - max(floor, 0.0)) / best))


def weighted_score_fuse(
    lists: Sequence[tuple[float, Sequence[Evidence]]], *, normalise: bool = True,
    power: float = 1.0,
) -> list[Evidence]:
    """Fuse lists of one arm by their scores: each list's scores are divided by its best (so
    a fragment's strongest match counts 1) unless ``normalise`` is False, raised to ``power``,
    weighted, and summed; ties by kind and id.

    A ``power`` below 1 favours breadth over depth: a memory that two lists match half-way
    (``2 * 0.5 ** 0.5`` = 1.41 at 0.5) outranks one that a single list matches fully (1)."""
    scores: dict[tuple[str, str], float] = {}
    first: dict[tuple[str, str], Evidence] = {}
    for weight, ranked in lists:
        top = max((item.score for item in ranked), default=0.0)
        if weight <= 0 or top <= 0 or not math.isfinite(top):
            continue
        scale = top if normalise else 1.0
        for item in ranked:
            key = (item.kind, item.id)
            share = max(item.score, 0.0) / scale
            scores[key] = scores.get(key, 0.0) + weight * share ** power
            first.setdefault(key, item)
    order = sorted(scores, key=lambda key: (-scores[key], key))
    return [attrs.evolve(first[key], score=scores[key]) for key in order]
