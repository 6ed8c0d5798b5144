"""Ranking: how one round's query weighs its fragments, and how the arms are fused.

The task-context query is one information-need query made of fragments in priority order (the
request, the next action, pending tasks, questions, the objective, constraints, entities). The
arms keep that structure instead of flattening it:

- **Weights.** The first fragment that carries information gets ``lead``, the next 1, every
  later one ``decay`` times the one before. A request with no information of its own
  ("Continue", "go on", "do that", "yes", "ok, next") stays in the query text, in fragment order,
  but weighs 0, so the next action leads. A request that points back ("do that one Priya
  raised", "pick that up again": an anaphor and at most three words of its own) keeps a weight
  but does not lead: what it points at does.
- **Sparse.** Each weighted fragment is searched on its own (its terms never crowd out another
  fragment's under the FTS term cap), and the lists are fused by weighted reciprocal rank.
- **Semantic.** The fragment vectors were prepared once, with the query. Since every vector is
  unit length, the weighted sum of a memory's cosines to the fragments is its dot product with
  the weighted sum of the fragment vectors, so the arm is one scan with one combined vector.
- **Fusion.** Arms are fused by weighted reciprocal rank; the recent arm (the frozen control)
  only breaks ties, it never outvotes an arm that found something.

The baseline query (the frozen control, a search call) keeps its single whole-query search.
:class:`RankingPolicy` holds the tunables; its defaults were chosen on the development set
``examples/devset.jsonl`` only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np

from .embedding import Vector
from .planning import QueryStrategy, RecallQuery
from .store import Evidence
from .terms import STOPWORDS, word_terms

__all__ = [
    "ANAPHORS",
    "CONTENT_FREE_WORDS",
    "FTS_TERM_CAP",
    "MAX_TERM_CHUNKS",
    "RRF_K",
    "RankingPolicy",
    "BELIEFS_AFTER",
    "combined_vector",
    "with_beliefs",
    "fragment_weights",
    "is_content_free",
    "is_pointer",
    "search_terms",
    "term_chunks",
    "weighted_fuse",
    "weighted_score_fuse",
]

RRF_K = 60
"""Reciprocal-rank fusion constant (Cormack et al.): score = sum of weight / (k + rank)."""

FTS_TERM_CAP = 32
"""Terms one FTS expression keeps (:func:`~plugin.memory.fts.fts5_match_expression`)."""
MAX_TERM_CHUNKS = 4
"""Most FTS expressions one list's terms are split into; terms beyond are reported, not lost
silently."""

CONTENT_FREE_WORDS = frozenset(
    """continue continuing go going ahead on ok okay k yes yeah yep yup sure please pls next
    proceed carry keep let lets s do that it this now then again resume same fine good great
    cool alright right thanks thank perfect sounds done and so""".split()  # noqa: SIM905
)
"""Words that say "go on" without saying what about (with :data:`STOPWORDS`)."""


ANAPHORS = frozenset(
    """that it this those these one ones same again thing things above earlier before
    previous last said mentioned discussed""".split()  # noqa: SIM905
)
"""Words that point back at something said before."""
MAX_POINTER_TERMS = 3


def is_pointer(fragment: str) -> bool:
    """Whether ``fragment`` points back at earlier work rather than naming it: it has an
    anaphor and at most :data:`MAX_POINTER_TERMS` words of its own."""
    terms = word_terms(fragment, limit=64)
    if not any(term in ANAPHORS for term in terms):
        return False
    own = [t for t in terms
           if t not in STOPWORDS and t not in CONTENT_FREE_WORDS and t not in ANAPHORS]
    return len(own) <= MAX_POINTER_TERMS


def is_content_free(fragment: str) -> bool:
    """Whether ``fragment`` carries no information of its own ("Continue", "ok, next")."""
    terms = word_terms(fragment, limit=64)
    return all(term in STOPWORDS or term in CONTENT_FREE_WORDS for term in terms)


def _unit(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
        value
    ) or value < 0:
        raise ValueError(f"RankingPolicy.{attribute.name} must be a finite number >= 0, "
                         f"got {value!r}")


@attrs.frozen(kw_only=True)
class RankingPolicy:
    """The ranking's tunables (defaults chosen on the development set only)."""

    lead: float = attrs.field(default=6.0, validator=_unit)
    """Weight of the first fragment that carries information (the next one weighs 1)."""
    decay: float = attrs.field(default=0.6, validator=_unit)
    """Each later fragment's weight relative to the one before (from the second on)."""
    whole_query: float = attrs.field(default=0.0, validator=_unit)
    """Sparse: weight of the whole task-context query's list beside the fragments' lists."""
    sparse: float = attrs.field(default=1.0, validator=_unit)
    """Fusion weight of the sparse arm."""
    semantic: float = attrs.field(default=1.0, validator=_unit)
    """Fusion weight of the semantic arm."""
    relative_floor: float = attrs.field(default=0.5, validator=_unit)
    """Semantic: also keep candidates scoring at least this share of the best one, so a
    combined vector's lower cosines do not leave the arm short (0: the absolute floor only)."""


def fragment_weights(query: RecallQuery, policy: RankingPolicy) -> tuple[float, ...]:
    """One weight per fragment: 0 for a content-free fragment, ``lead`` for the first that
    carries information (a leading pointer such as "do that one" weighs 1 and lets the next
    lead), 1 for the next, then ``decay`` times the previous weight."""
    weights: list[float] = []
    current: float | None = None
    for index, fragment in enumerate(query.fragments):
        if is_content_free(fragment):
            weights.append(0.0)
            continue
        if index == 0 and is_pointer(fragment):
            weights.append(1.0)  # kept, but what it points at leads
            continue
        if current is None:
            weights.append(policy.lead)
            current = 1.0
            continue
        weights.append(current)
        current *= policy.decay
    return tuple(weights)


def uses_fragments(query: RecallQuery) -> bool:
    """Task-context queries rank by fragment; the baseline keeps its whole-query search."""
    return query.strategy is QueryStrategy.TASK_CONTEXT and len(query.fragments) > 1


def search_terms(text: str) -> tuple[str, ...]:
    """Every distinct case-folded term of ``text`` without function words (all of them when
    nothing else is left): no cap here, :func:`term_chunks` splits them."""
    terms = word_terms(text, limit=None)
    content = tuple(term for term in terms if term not in STOPWORDS)
    return content or terms


def term_chunks(terms: Sequence[str]) -> tuple[list[str], int]:
    """``terms`` split into FTS-sized expressions (at most :data:`MAX_TERM_CHUNKS`), and how
    many terms were left out beyond them."""
    chunks = [
        " ".join(terms[i : i + FTS_TERM_CAP]) for i in range(0, len(terms), FTS_TERM_CAP)
    ]
    kept = chunks[:MAX_TERM_CHUNKS]
    return kept, max(0, len(terms) - FTS_TERM_CAP * MAX_TERM_CHUNKS)


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


BELIEFS_AFTER = 5
"""Beliefs read for the people a query names enter the ranking after this many items."""


def with_beliefs(
    ranked: Sequence[Evidence], beliefs: Sequence[Evidence], *, after: int = BELIEFS_AFTER
) -> list[Evidence]:
    """``ranked`` with ``beliefs`` merged in: the first ``after`` items keep their places, then
    beliefs and the rest alternate (a belief first), so a belief read that was paid for stays
    within a small context cap without pushing the best evidence down. Repeats are dropped."""
    seen: set[tuple[str, str]] = set()
    merged: list[Evidence] = []

    def take(item: Evidence) -> None:
        key = (item.kind, item.id)
        if key not in seen:
            seen.add(key)
            merged.append(item)

    for item in ranked[:after]:
        take(item)
    rest, pending = list(ranked[after:]), list(beliefs)
    while rest or pending:
        if pending:
            take(pending.pop(0))
        if rest:
            take(rest.pop(0))
    return merged


def weighted_score_fuse(lists: Sequence[tuple[float, Sequence[Evidence]]]) -> list[Evidence]:
    """Fuse lists of one arm by their scores: each list's scores are divided by its best (so
    a fragment's strongest match counts 1), weighted, and summed; ties by kind and id."""
    scores: dict[tuple[str, str], float] = {}
    first: dict[tuple[str, str], Evidence] = {}
    for weight, ranked in lists:
        top = max((item.score for item in ranked), default=0.0)
        if weight <= 0 or top <= 0:
            continue
        for item in ranked:
            key = (item.kind, item.id)
            scores[key] = scores.get(key, 0.0) + weight * max(item.score, 0.0) / top
            first.setdefault(key, item)
    order = sorted(scores, key=lambda key: (-scores[key], key))
    return [attrs.evolve(first[key], score=scores[key]) for key in order]


def combined_vector(vectors: Sequence[Vector], weights: Sequence[float]) -> Vector | None:
    """The unit vector along ``sum(weight * vector)``; None when it is zero or not finite.

    A memory's dot product with it is proportional to its weighted sum of cosines to the
    fragments, so ranking by it ranks by that sum.
    """
    if not vectors or len(vectors) != len(weights):
        return None
    total = np.zeros_like(np.asarray(vectors[0], dtype=np.float32))
    for vector, weight in zip(vectors, weights, strict=True):
        if weight > 0:
            total += np.float32(weight) * np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(total))
    if not math.isfinite(norm) or norm == 0.0:
        return None
    result = (total / norm).astype(np.float32)
    result.setflags(write=False)
    return result
