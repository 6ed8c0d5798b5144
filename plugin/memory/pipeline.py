"""The search pipeline: what one attempt does, start to end, inside the slot the hooks took.

One attempt is People discovery, ordinary (sparse) and semantic candidate selection, recent
candidates under the frozen control query, ranking (reciprocal-rank fusion with deterministic
ties), and bounded source recovery. The hooks open the attempt (its slot, its deadline, its
trace) before calling ``Retriever.search`` (see :mod:`plugin.memory.enforce`), so one slot
and one deadline cover the whole of it, and render what it found under the host's context
caps. A People-to-belief read takes a slot of its own, through the attempt's handle.

The runtime sees only the :class:`~plugin.memory.protocol.Retriever` protocol;
:class:`MemoryRetriever` is the concrete one over the reference
:class:`~plugin.memory.store.MemoryStore`, chosen by the bootstrap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from plugin.control import RecallBudgetExceeded

from .fusion import peakedness, score_fuse, weighted_fuse, weighted_score_fuse
from .preparation import PreparedRecall
from .protocol import CORRECTIONS_EXAMINED, AttemptHandle, Found
from .protocol import ContextCaps as ContextCaps
from .protocol import Retriever as Retriever
from .query import FragmentRole, RecallQuery
from .ranking import (
    RankingPolicy,
    combined_vector,
    fragment_terms,
    fragment_weights,
    request_share,
    request_terms,
    search_terms,
    term_chunks,
    uses_fragments,
    with_beliefs,
)
from .rendering import Rendered as Rendered
from .rendering import fit
from .rendering import render as render
from .store import Evidence, MemoryStore, WordQuery
from .store.words import MAX_FRAGMENTS, borrows_words, word_level
from .terms import STOPWORDS as STOPWORDS
from .terms import content_terms as content_terms
from .terms import query_terms as query_terms

ARMS = frozenset({"sparse", "semantic", "recent"})
"""The candidate arms of an attempt."""

RRF_K = 60
"""Reciprocal-rank fusion constant (Cormack et al.): score = sum of 1 / (k + rank)."""


def fuse(arms: Iterable[Sequence[Evidence]], *, k: int = RRF_K) -> list[Evidence]:
    """Reciprocal-rank fusion of ranked lists; ties broken by kind and id, so it is stable."""
    scores: dict[tuple[str, str], float] = {}
    first: dict[tuple[str, str], Evidence] = {}
    for ranked in arms:
        for rank, item in enumerate(ranked, start=1):
            key = (item.kind, item.id)
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
            first.setdefault(key, item)
    order = sorted(scores, key=lambda key: (-scores[key], key))
    return [attrs.evolve(first[key], score=scores[key]) for key in order]


def _arms(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


@attrs.define(eq=False)
class MemoryRetriever:
    """The reference :class:`Retriever` over a :class:`MemoryStore`."""

    store: MemoryStore
    min_similarity: float | None = None
    """An absolute cosine floor for semantic candidates; None (the default): no floor, the arm
    ranks its candidates and fusion decides."""
    arms: frozenset[str] = attrs.field(default=ARMS, converter=_arms)
    """The candidate arms that run (an evaluator's ablation runs one at a time)."""
    ranking: RankingPolicy = attrs.field(
        factory=RankingPolicy, validator=attrs.validators.instance_of(RankingPolicy)
    )
    """How fragments are weighted and arms fused (:mod:`plugin.memory.ranking`)."""

    def __attrs_post_init__(self) -> None:
        unknown = self.arms - ARMS
        if unknown or not self.arms:
            raise ValueError(f"MemoryRetriever.arms must be a non-empty subset of {sorted(ARMS)}")

    def searchable(self, prepared: PreparedRecall) -> bool:
        if not query_terms(prepared.query.text):  # no word: nothing any arm could match
            return False
        lexical = bool(self.arms - {"semantic"})
        return lexical or ("semantic" in self.arms and prepared.semantic.vector is not None)

    async def named_people(self, prepared: PreparedRecall) -> tuple[str, ...]:
        query = prepared.query
        principal, scope = _trusted(query.principal, query.scope)
        people = await self.store.discover_people(query.text, principal=principal, scope=scope)
        return tuple(person.name for person in people)

    async def search(
        self,
        prepared: PreparedRecall,
        handle: AttemptHandle,
        *,
        caps: ContextCaps,
        nested_beliefs: bool,
    ) -> Found:
        query = prepared.query
        principal, scope = _trusted(query.principal, query.scope)
        store = self.store
        notes: list[str] = []
        arms: list[str] = []
        people = prepared.people  # looked up once, while the call was prepared
        if people is None:
            found = await store.discover_people(query.text, principal=principal, scope=scope)
            people = tuple(person.name for person in found)
        evidence = await self._rank(prepared, principal, scope, caps, arms, notes)
        if nested_beliefs and people and handle.offers_nested:
            read = await handle.nested(people)
            if read.refusal is not None:
                notes.append(f"belief read refused: {read.refusal.reason.value}")
            else:
                evidence = with_beliefs(evidence, read.beliefs, query=query,
                                        policy=self.ranking)
        shown = fit(evidence, caps)  # what the hooks' one render will show
        sources = await self._recover_sources(shown, handle, principal, scope, notes)
        if sources:
            evidence = [*shown, *sources]
        return Found(evidence=tuple(evidence), people=people,
                     arms=tuple(arms), notes=tuple(notes))

    async def _rank(
        self, prepared: PreparedRecall, principal: str, scope: str, caps: ContextCaps,
        arms: list[str], notes: list[str],
    ) -> list[Evidence]:
        """Every arm's candidates, fused: weighted arms, recency as the tie-breaker."""
        query, policy = prepared.query, self.ranking
        # The semantic arm's fusion weight and the rank constant follow whether it matches words.
        words = self._matches_words()
        weights: tuple[float, ...] = ()
        if uses_fragments(query):
            share = await self._request_share(query, principal, scope)
            weights = fragment_weights(query, policy, request_share=share)
        if not any(weights):
            weights = ()  # nothing but content-free fragments: search the whole query
        lists: list[tuple[float, Sequence[Evidence]]] = []
        if "sparse" in self.arms:
            sparse = await self._sparse(query.text, query.fragments, weights, principal, scope,
                                        caps, notes)
            if sparse is None:
                notes.append("sparse arm skipped: the query has no searchable terms")
            else:
                lists.append((self._confidence(policy.sparse, sparse), sparse))
                arms.append("sparse")
        if "semantic" in self.arms:
            semantic = await self._semantic(prepared, weights, principal, scope, caps)
            if semantic is not None:
                if not words:
                    weight = policy.semantic
                elif borrows_words(self.store.embedding):
                    weight = policy.semantic_contextual
                else:
                    weight = policy.semantic_words
                lists.append((self._confidence(weight, semantic), semantic))
                arms.append("semantic")
            elif prepared.semantic.withheld_reason is not None:
                notes.append(
                    f"semantic arm withheld: {prepared.semantic.withheld_reason.value}"
                )
        recent: list[Evidence] = []
        if "recent" in self.arms:
            recent = await self._recent(prepared, principal, scope, caps)
            arms.append("recent")
            if not lists:  # the recent arm alone: its order is the ranking
                lists.append((1.0, recent))
        if policy.fusion == "score" and len(lists) > 1:
            fused = score_fuse(lists, tie_breaker=recent)
        else:
            fused = weighted_fuse(lists, tie_breaker=recent,
                                  k=policy.rrf_k_words if words else policy.rrf_k)
        if not {"sparse", "semantic"} & set(arms):
            return fused  # the recent arm alone keeps the frozen control's order
        return await self._with_adjacent(fused, principal, scope)

    async def _with_adjacent(
        self, ranked: list[Evidence], principal: str, scope: str
    ) -> list[Evidence]:
        """``ranked`` with the turns around its best memories lifted (:mod:`.ranking`, turns
        of one conversation): each of the first ``adjacent_sources`` memories lends
        ``adjacent`` times its score to the memories written just before and just after it
        (within ``adjacent_window_s``), which keep the larger of their own score and what they
        were lent, and join the ranking if no arm found them. Ties keep the fused order; a
        memory that joins comes after the items it ties with (by id among themselves)."""
        policy = self.ranking
        if policy.adjacent <= 0 or policy.adjacent_sources <= 0 or not ranked:
            return ranked
        scores = {(item.kind, item.id): item.score for item in ranked}
        items = {(item.kind, item.id): item for item in ranked}
        lifted = dict(scores)
        for source in [item for item in ranked if item.kind == "memory"][
            : policy.adjacent_sources
        ]:
            lent = policy.adjacent * source.score
            for near in await self.store.adjacent_memories(
                source.created_at, source.id, principal=principal, scope=scope,
                window_s=policy.adjacent_window_s,
            ):
                key = (near.kind, near.id)
                if lent > lifted.get(key, 0.0):
                    lifted[key] = lent
                    items.setdefault(key, near)
        if lifted == scores:
            return ranked
        place = {key: index for index, key in enumerate(scores)}
        order = sorted(lifted, key=lambda key: (-lifted[key], place.get(key, len(place)), key))
        return [attrs.evolve(items[key], score=lifted[key]) for key in order]

    def _matches_words(self) -> bool:
        """Whether the semantic arm also matches words (``RankingPolicy.words``): with an
        adapter whose single words can be compared, and no similarity floor (a floor is on
        cosines)."""
        return self.ranking.words > 0 and self.min_similarity is None \
            and word_level(self.store.embedding)

    def _confidence(self, weight: float, ranked: Sequence[Evidence]) -> float:
        """An arm's fusion weight: its policy weight, times how peaked its scores are."""
        if not self.ranking.confidence or self.ranking.fusion == "score":
            return weight
        return weight * max(peakedness(ranked), 1e-3)

    async def _request_share(self, query: RecallQuery, principal: str, scope: str) -> float:
        """How much of its weight the request keeps, measured on the scope's own vocabulary:
        a short request by how many of its content terms occur in the scope's memories, a
        longer one fully when any of them does. So a request that says only "go on", in any
        language and at any length, weighs 0."""
        if FragmentRole.REQUEST not in query.roles:
            return 1.0
        request = query.fragments[query.roles.index(FragmentRole.REQUEST)]
        content, short = request_terms(request, short=self.ranking.short_words)
        if not short:  # one search: the terms are OR-ed
            return 1.0 if content and await self.store.sparse_candidates(
                " ".join(content), principal=principal, scope=scope, limit=1) else 0.0
        found = 0
        for term in content:
            if await self.store.sparse_candidates(term, principal=principal, scope=scope,
                                                  limit=1):
                found += 1
        return request_share(found, self.ranking)

    async def _sparse(
        self, text: str, fragments: Sequence[str], weights: Sequence[float], principal: str,
        scope: str, caps: ContextCaps, notes: list[str],
    ) -> list[Evidence] | None:
        """bm25 candidates: the whole query's terms, or each weighted fragment's on its own
        (a term several fragments hold in the heaviest of them only, :func:`fragment_terms`).

        Terms are split into FTS-sized expressions, so no fragment's terms fall silently
        under the FTS term cap. None when there is no term to search.
        """
        parts = ([(1.0, search_terms(text))] if not weights
                 else fragment_terms(fragments, weights))
        if weights and self.ranking.whole_query > 0:
            searched = [f for w, f in zip(weights, fragments, strict=True) if w > 0]
            parts.append((self.ranking.whole_query, search_terms("\n".join(searched))))
        lists: list[tuple[float, Sequence[Evidence]]] = []
        dropped = 0
        for weight, terms in parts:
            chunks, lost = term_chunks(terms)
            dropped += lost
            for chunk in chunks:
                lists.append((weight, await self.store.sparse_candidates(
                    chunk, principal=principal, scope=scope, limit=caps.candidates_per_arm,
                )))
        if dropped:
            notes.append(f"sparse arm: {dropped} query terms beyond the FTS term cap left out")
        if not lists:
            return None
        if len(lists) == 1:
            return list(lists[0][1])
        normalise = self.ranking.fragment_scores == "share"
        power = self.ranking.fragment_power if normalise else 1.0
        fused = weighted_score_fuse(lists, normalise=normalise, power=power)
        return fused[: caps.candidates_per_arm * 2]

    async def _semantic(
        self, prepared: PreparedRecall, weights: Sequence[float], principal: str, scope: str,
        caps: ContextCaps,
    ) -> list[Evidence] | None:
        """Cosine candidates for the query's vector, or for its fragments' weighted vector,
        mixed with the word-level match (``RankingPolicy.words``) where the store's adapter
        allows it.

        No floor unless ``min_similarity`` is set (a floor is on cosines: the arm then ranks by
        the cosine alone): the arm ranks, fusion decides. None when the query has no vector.
        """
        semantic = prepared.semantic
        vector = semantic.vector
        if weights and len(semantic.fragment_vectors) == len(weights):
            vector = combined_vector(semantic.fragment_vectors, weights)
        if vector is None:
            return None
        words = None
        if self._matches_words():
            query = prepared.query
            # A planned query holds far fewer fragments than a word query may (MAX_FRAGMENTS).
            fragments = tuple(pair for pair in zip(query.fragments, weights, strict=True)
                              if pair[1] > 0)[:MAX_FRAGMENTS] \
                if weights and len(weights) == len(query.fragments) else ((query.text, 1.0),)
            words = WordQuery(fragments, self.ranking.words,
                              per_fragment=borrows_words(self.store.embedding))
        similar = await self.store.semantic_candidates(
            vector, principal=principal, scope=scope, limit=caps.candidates_per_arm,
            words=words,
        )
        floor = self.min_similarity
        if floor is None:
            return list(similar)
        return [item for item in similar if item.score >= floor]

    async def _recent(
        self, prepared: PreparedRecall, principal: str, scope: str, caps: ContextCaps
    ) -> list[Evidence]:
        """Recent candidates that share a term with the frozen-control (baseline) query."""
        terms = frozenset(content_terms(prepared.recent_query.text))
        if not terms:
            return []
        recent = await self.store.recent_candidates(
            principal=principal, scope=scope, limit=caps.candidates_per_arm
        )
        scored = [(len(terms.intersection(query_terms(item.text))), item) for item in recent]
        kept = [(overlap, item) for overlap, item in scored if overlap]
        kept.sort(key=lambda pair: (-pair[0], -pair[1].created_at, pair[1].id))
        return [item for _, item in kept]

    async def _recover_sources(
        self,
        items: Sequence[Evidence],
        handle: AttemptHandle,
        principal: str,
        scope: str,
        notes: list[str],
    ) -> list[Evidence]:
        """Read the sources that rendered memories cite, within the attempt's fallbacks."""
        recovered: list[Evidence] = []
        seen = {item.id for item in items if item.kind == "source"}
        for source_id in (s for item in items for s in item.cites):
            if source_id in seen:
                continue
            seen.add(source_id)
            try:
                handle.source_read()
            except RecallBudgetExceeded as exc:
                notes.append(f"source recovery stopped: {exc.refusal.reason.value}")
                break
            source = await self.store.read_source(source_id, principal=principal, scope=scope)
            if source is not None:
                recovered.append(source)
        return recovered

    async def read_beliefs(
        self,
        people: Sequence[str],
        handle: AttemptHandle,
        *,
        principal: str,
        scope: str,
        caps: ContextCaps,
    ) -> tuple[Evidence, ...]:
        beliefs: list[Evidence] = []
        for name in people:
            beliefs.extend(await self.store.beliefs_of(
                name, principal=principal, scope=scope, limit=caps.beliefs_per_person
            ))
        return tuple(beliefs)

    async def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:
        # The newest that the hooks examine, and one more to tell that more were left out:
        # a cell of a million current corrections costs what one of a thousand does.
        return tuple(await self.store.current_corrections(
            principal=principal, scope=scope, limit=CORRECTIONS_EXAMINED + 1))

    async def revalidate(
        self, ids: Sequence[str], *, principal: str, scope: str
    ) -> tuple[Evidence, ...]:
        return tuple(await self.store.get_evidence(ids, principal=principal, scope=scope))


def _trusted(principal: str | None, scope: str | None) -> tuple[str, str]:
    if principal is None or scope is None:
        raise ValueError("a search needs the trusted principal and scope of the run")
    return principal, scope
