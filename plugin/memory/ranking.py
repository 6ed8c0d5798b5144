"""Ranking: how one round's query weighs its fragments, and what each arm searches for.

The task-context query is one information-need query made of fragments, each with the role of
the working-state field it came from (:class:`~plugin.memory.query.FragmentRole`: the
request, the next action, pending tasks, questions, the objective, constraints, entities). The
arms keep that structure instead of flattening it:

- **Weights by role, not position.** Each role has a weight (:class:`RankingPolicy`); the
  fragments of one role share it (``weight / sqrt(n)``), so eight entities do not outvote one
  next action. The entities the facts name and the open questions weigh twice the next action:
  in real notes what ties a memory to the work is most often a person's name, an id or the
  answer to a question, while distractors share the next action's common words. A request
  that carries content leads (``request``) and the other fields keep a share of their weights
  (``context``), so a task in flight does not dilute a question asked now.
- **A content-free request** ("Continue", "weiter", "ok, next step please") weighs 0 and the
  other fields carry the query together. Content is measured on the store's own vocabulary,
  acknowledgements set aside (:func:`request_terms`, :func:`request_share`).
- **Sparse.** Each weighted fragment is searched on its own (its terms never crowd out another
  fragment's under the FTS term cap), and the lists are fused by their normalised scores
  (``fragment_scores="share"``, each share raised to ``fragment_power`` = 0.5, so a memory
  several fields match in part outranks one a single field matches fully; ``"bm25"`` sums the
  bm25 scores themselves, measured and not chosen). A term several fragments hold is searched
  in the heaviest of them only (:func:`fragment_terms`): agreement between fields counts, but
  a common word the fields repeat is not summed once per field over a name one field gives.
- **Semantic.** Every vector is unit length, so the weighted sum of a memory's cosines to the
  fragments is its dot product with the weighted sum of the fragment vectors: one scan with
  one combined vector. No cosine floor: the arm ranks its candidates and fusion decides.
- **Semantic, word by word** (``words``, with the packaged WordLlama). A sentence vector
  averages its words, so a rare name in a long note weighs little. The arm also matches every
  content word of each fragment against the nearest word of each memory (1 for the same word,
  a high cosine for a close one), weighted by rarity in the cell and by role, each word once
  (:mod:`plugin.memory.store.words`): half the cosine, half that match, each relative to its
  best in the cell. Beside MiniLM's sentence vectors, each fragment's match is relative to its
  best memory before the role weights sum them (``WordQuery.per_fragment``).
- **Fusion by confidence** (:mod:`plugin.memory.fusion`): each arm weighted by its policy
  weight times how peaked its scores are. With the word match the semantic arm is the
  stronger one, and its scores look less peaked than bm25's: its weight is ``semantic_words``
  (6) and each list counts ``weight / rank`` (``rrf_k_words`` 0), so the stronger arm's first
  places lead; by sentence vectors alone, ``semantic`` (0.5) and ``rrf_k`` (10). MiniLM's
  sentence vectors beside WordLlama's words make the strongest semantic arm measured: its
  weight is ``semantic_contextual`` (40), so its ranking leads while it is confident.
- **Turns of one conversation (opt-in, ``adjacent``).** In a chat the answer to the turn that
  matches a need is often the next turn, which shares no word with it: the best memories of
  the fused ranking lend part of their score to the turns written just before and after them.
- **Beliefs by relevance.** Beliefs read for the people a query names take their place among the
  evidence by their overlap with the query (:func:`with_beliefs`), not after a fixed rank.

The baseline query (the frozen control, a search call) keeps its single whole-query search.
:class:`RankingPolicy` holds the tunables; the fusion functions are importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from .embedding import Vector
from .fusion import PEAK_DEPTH, RRF_K, peakedness, score_fuse, weighted_fuse, weighted_score_fuse
from .query import FragmentRole, QueryStrategy, RecallQuery
from .store import Evidence
from .terms import STOPWORDS, request_content, word_terms

__all__ = [
    "BELIEFS_AFTER",
    "FTS_TERM_CAP",
    "MAX_TERM_CHUNKS",
    "PEAK_DEPTH",
    "RRF_K",
    "SHORT_REQUEST_TERMS",
    "RankingPolicy",
    "combined_vector",
    "fragment_terms",
    "fragment_weights",
    "peakedness",
    "query_coverage",
    "request_share",
    "request_terms",
    "score_fuse",
    "search_terms",
    "term_chunks",
    "uses_fragments",
    "weighted_fuse",
    "weighted_score_fuse",
    "with_beliefs",
]

FTS_TERM_CAP = 32
"""Terms one FTS expression keeps (:func:`~plugin.memory.fts.fts5_match_expression`)."""
MAX_TERM_CHUNKS = 4
"""Most FTS expressions one list's terms are split into; terms beyond are reported, not lost
silently."""

SHORT_REQUEST_TERMS = 4
"""A request of at most this many words is short: how much content it carries is measured
term by term on the scope's vocabulary; a longer one carries all or none (:func:`request_terms`)."""


def _unit(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
        value
    ) or value < 0:
        raise ValueError(f"RankingPolicy.{attribute.name} must be a finite number >= 0, "
                         f"got {value!r}")


def _share(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    _unit(instance, attribute, value)
    if value > 1:
        raise ValueError(f"RankingPolicy.{attribute.name} must be at most 1, got {value!r}")


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if value <= 0:
        raise ValueError(f"RankingPolicy.{attribute.name} must be above 0, got {value!r}")


def _rrf_k(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"RankingPolicy.{attribute.name} must be an int >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class RankingPolicy:
    """The ranking's tunables: one weight per fragment role, the arms' fusion.

    Chosen on development data only (hand-written sets and the LoCoMo dev split, each choice on
    at least two); the figures are in the evaluation documentation.
    """

    request: float = attrs.field(default=4.0, validator=_unit)
    """Weight of a request that carries content (scaled by :func:`request_share`)."""
    next_action: float = attrs.field(default=1.0, validator=_unit)
    task: float = attrs.field(default=1.0, validator=_unit)
    """Shared by the unfinished tasks (``weight / sqrt(n)`` each)."""
    question: float = attrs.field(default=2.0, validator=_unit)
    """Shared by the open questions."""
    objective: float = attrs.field(default=0.6, validator=_unit)
    constraint: float = attrs.field(default=1.0, validator=_unit)
    """Shared by the constraints."""
    entity: float = attrs.field(default=2.0, validator=_unit)
    """Shared by the entities."""
    context: float = attrs.field(default=0.15, validator=_unit)
    """How much the other fields keep beside a request that carries content: their weights are
    scaled by ``1 - share * (1 - context)``, so they keep all of it when the request carries
    none (``share`` 0) and this share when it carries all of it."""
    short_words: int = attrs.field(default=SHORT_REQUEST_TERMS, validator=_rrf_k)
    """A request of at most this many words is short: how much content it carries is measured
    on the scope's vocabulary (:func:`request_share`); a longer one carries all of it when any
    of its content terms occurs in the scope's memories, none otherwise."""
    request_terms: int = attrs.field(default=4, validator=_rrf_k)
    """A short request with this many terms found in the scope carries its full weight; one
    with fewer carries ``(found / request_terms) ** request_power`` of it."""
    request_power: float = attrs.field(default=2.0, validator=_unit)
    """How fast a short request's share grows with the terms the scope knows (1: linearly). At
    2 one known word (a go-on word the acknowledgements lack, where the notes use it) keeps a
    sixteenth and does not dilute the need in the state; two ("vault audit?") keep a quarter."""
    whole_query: float = attrs.field(default=0.0, validator=_unit)
    """Sparse: weight of the whole task-context query's list beside the fragments' lists."""
    sparse: float = attrs.field(default=1.0, validator=_unit)
    """Fusion weight of the sparse arm (times its peakedness when ``confidence``)."""
    semantic: float = attrs.field(default=0.5, validator=_unit)
    """Fusion weight of the semantic arm ranking by sentence vectors alone (times its
    peakedness when ``confidence``)."""
    semantic_words: float = attrs.field(default=6.0, validator=_unit)
    """Fusion weight of the semantic arm when it also matches words (``words`` above 0, with
    the packaged WordLlama), times its peakedness when ``confidence``."""
    semantic_contextual: float = attrs.field(default=40.0, validator=_unit)
    """Fusion weight of the semantic arm when it matches words in another model's word space
    beside a contextual encoder's sentence vectors (MiniLM with WordLlama's words), times its
    peakedness when ``confidence``. That arm is the strongest measured on every development
    set, so the fused ranking is its ranking while it is confident: the sparse arm breaks its
    ties and adds what it did not find."""
    words: float = attrs.field(default=0.5, validator=_share)
    """Semantic: the share of the word-level match in the arm's score, in [0, 1] (each query
    word against the nearest word of a memory, :mod:`plugin.memory.store.words`); the rest
    is the sentence vectors' cosine. 0: the cosine alone. Used with adapters whose single words
    can be compared (the packaged WordLlama)."""
    fusion: str = attrs.field(default="rrf", validator=attrs.validators.in_(("score", "rrf")))
    """How arms are fused: ``score`` (:func:`score_fuse`, each arm by its own score shares)
    or ``rrf`` (weighted reciprocal rank, :func:`weighted_fuse`)."""
    confidence: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    """With ``rrf``: weight each arm by how peaked its own scores are (:func:`peakedness`)."""
    rrf_k: int = attrs.field(default=10, validator=_rrf_k)
    """The fusion's reciprocal-rank constant (10: an arm's first places count more than the
    items both arms rank in the middle; :data:`RRF_K` is the textbook 60). Used when the
    semantic arm ranks by sentence vectors alone."""
    rrf_k_words: int = attrs.field(default=0, validator=_rrf_k)
    """The fusion's reciprocal-rank constant when the semantic arm also matches words (the
    packaged WordLlama). 0: an arm's list counts ``weight / rank``, so each arm's first places
    lead; measured on both the hand-written notes and the long conversations."""
    fragment_scores: str = attrs.field(
        default="share", validator=attrs.validators.in_(("share", "bm25"))
    )
    """Sparse: how the fragments' lists are summed: ``share`` (each list's scores divided by
    its best) or ``bm25`` (the scores themselves, so a match on rare terms counts more)."""
    fragment_power: float = attrs.field(default=0.5, validator=[_share, _positive])
    """Sparse, by ``share``: each share is raised to this power, in (0, 1], before the sum. At
    0.5 a memory several fields match in part outranks one a single field matches fully (a
    distractor that repeats the next action's words); 1 sums the shares."""

    adjacent: float = attrs.field(default=0.0, validator=_unit)
    """The share of its score each of the best ``adjacent_sources`` memories of the fused
    ranking lends to the memories written just before and after it within
    ``adjacent_window_s``; joined if no arm found them. 0 (default): off; 0.3 measured on
    conversations. Notes a minute apart, or written at one instant, are not turns."""
    adjacent_sources: int = attrs.field(default=2, validator=_rrf_k)
    """How many of the best memories lend their score to the turns around them."""
    adjacent_window_s: float = attrs.field(default=30.0, validator=_unit)
    """The most seconds between two memories that count as neighbouring turns (memories
    written at the same instant never do: a batch written at once is not a conversation)."""

    def role_weight(self, role: FragmentRole) -> float:
        """The weight of ``role`` (the request's before :func:`request_share`)."""
        return float(getattr(self, role.value))


def request_terms(
    request: str, *, short: int = SHORT_REQUEST_TERMS
) -> tuple[tuple[str, ...], bool]:
    """The terms of ``request`` that may carry content (no function word, acknowledgement or
    single letter: :func:`~plugin.memory.terms.request_content`), and whether it is short (at
    most ``short`` words: its share then grows with each term the scope holds; a longer one
    carries content when any of them occurs in the scope)."""
    terms = word_terms(request, limit=64)
    return request_content(terms), len(terms) <= short


def request_share(found: int, policy: RankingPolicy) -> float:
    """The share of its weight a short request keeps when ``found`` of its terms occur in the
    scope's memories: 0 for none (a content-free request), ``(found / request_terms) **
    request_power`` below ``request_terms``, 1 from there on."""
    if found <= 0:
        return 0.0
    if policy.request_terms <= 0:
        return 1.0
    return float(min(1.0, found / policy.request_terms) ** policy.request_power)


def fragment_weights(
    query: RecallQuery, policy: RankingPolicy, *, request_share: float = 1.0
) -> tuple[float, ...]:
    """One weight per fragment, by its role: the role's weight shared by that role's fragments
    (``weight / sqrt(n)``); the request's also times ``request_share`` (0 for a request that
    carries no content, see :func:`request_share`), every other one's times
    ``1 - request_share * (1 - policy.context)``."""
    share = max(0.0, min(1.0, request_share))
    others = 1.0 - share * (1.0 - policy.context)
    counts: dict[FragmentRole, int] = {}
    for role in query.roles:
        counts[role] = counts.get(role, 0) + 1
    weights: list[float] = []
    for role in query.roles:
        weight = policy.role_weight(role) / math.sqrt(counts[role])
        weights.append(weight * (share if role is FragmentRole.REQUEST else others))
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


def fragment_terms(
    fragments: Sequence[str], weights: Sequence[float]
) -> list[tuple[float, tuple[str, ...]]]:
    """Each fragment's :func:`search_terms` with its weight, heaviest first, every term once:
    in the heaviest fragment that holds it (the earlier on a tie). Fragments of weight 0, and
    those left with no term, are left out."""
    weighted = sorted(zip(weights, fragments, strict=True), key=lambda pair: -pair[0])
    seen: set[str] = set()
    parts: list[tuple[float, tuple[str, ...]]] = []
    for weight, fragment in weighted:
        if weight <= 0:
            continue
        terms = tuple(term for term in search_terms(fragment) if term not in seen)
        seen.update(terms)
        if terms:
            parts.append((weight, terms))
    return parts


def term_chunks(terms: Sequence[str]) -> tuple[list[str], int]:
    """``terms`` split into FTS-sized expressions (at most :data:`MAX_TERM_CHUNKS`), and how
    many terms were left out beyond them."""
    chunks = [
        " ".join(terms[i : i + FTS_TERM_CAP]) for i in range(0, len(terms), FTS_TERM_CAP)
    ]
    kept = chunks[:MAX_TERM_CHUNKS]
    return kept, max(0, len(terms) - FTS_TERM_CAP * MAX_TERM_CHUNKS)


BELIEFS_AFTER = 5
"""Beliefs that share no term with the query enter the ranking after this many items."""


def _content(text: str) -> frozenset[str]:
    return frozenset(t for t in word_terms(text, limit=None) if t not in STOPWORDS)


def query_coverage(
    query: RecallQuery, policy: RankingPolicy
) -> Callable[[str], float]:
    """A text's relevance to ``query``: the weighted share of each fragment's content terms
    the text contains (fragment weights as the arms use them, the request at full share), in
    [0, 1]. The same measure for every item, so beliefs and evidence compare."""
    if uses_fragments(query):
        weights = fragment_weights(query, policy)
        parts = [(w, _content(f)) for w, f in zip(weights, query.fragments, strict=True)]
    else:
        parts = [(1.0, _content(query.text))]
    parts = [(w, terms) for w, terms in parts if w > 0 and terms]
    total = math.fsum(w for w, _ in parts)

    def coverage(text: str) -> float:
        if total <= 0:
            return 0.0
        terms = _content(text)
        return math.fsum(w * len(t & terms) / len(t) for w, t in parts) / total

    return coverage


def with_beliefs(
    ranked: Sequence[Evidence], beliefs: Sequence[Evidence], *,
    query: RecallQuery | None = None, policy: RankingPolicy | None = None,
    after: int = BELIEFS_AFTER,
) -> list[Evidence]:
    """``ranked`` with ``beliefs`` merged in by relevance to ``query``.

    Relevance is :func:`query_coverage`, measured the same way for beliefs and evidence. A
    belief that covers part of the query goes just before the first evidence item it beats
    (the leading item keeps its place), the more relevant belief first, ties in read order. A
    belief that covers none of it (or any belief without a ``query``) enters after ``after``
    items, alternating with the rest (a belief first), so a belief read that was paid for stays
    within a small context cap without pushing the best evidence down. Repeats are dropped.
    """
    coverage = (query_coverage(query, policy or RankingPolicy()) if query is not None
                else None)
    relevant: list[tuple[float, Evidence]] = []
    pending: list[Evidence] = []
    for belief in beliefs:
        score = coverage(belief.text) if coverage is not None else 0.0
        (relevant.append((score, belief)) if score > 0 else pending.append(belief))
    merged: list[Evidence] = []
    seen: set[tuple[str, str]] = set()

    def take(item: Evidence) -> None:
        key = (item.kind, item.id)
        if key not in seen:
            seen.add(key)
            merged.append(item)

    rest = list(ranked)
    if relevant and coverage is not None:
        scores = [coverage(item.text) for item in rest]
        placed: list[Evidence] = []
        queue = sorted(relevant, key=lambda pair: -pair[0])
        for index, item in enumerate(rest):
            while queue and index > 0 and queue[0][0] > scores[index]:
                placed.append(queue.pop(0)[1])
            placed.append(item)
        placed.extend(belief for _, belief in queue)
        rest = placed
    for item in rest[:after]:
        take(item)
    tail = rest[after:]
    while tail or pending:
        if pending:
            take(pending.pop(0))
        if tail:
            take(tail.pop(0))
    return merged


def combined_vector(vectors: Sequence[Vector], weights: Sequence[float]) -> Vector | None:
    """The unit vector along ``sum(weight * vector)`` (a memory's dot product with it ranks
    by its weighted sum of cosines to the fragments); None when it is zero or not finite."""
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
