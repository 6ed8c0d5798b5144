"""The search pipeline: one attempt, start to end, under one permit.

One attempt is People discovery, ordinary (sparse) and semantic candidate selection, recent
candidates under the frozen control query, ranking (reciprocal-rank fusion with deterministic
ties), rendering under the host's context caps, and bounded source recovery — all inside
``permit.attempt(...)``, so one slot and one deadline cover the whole of it, and its trace is
persisted with the permit's. A People-to-belief read takes a slot of its own.

The runtime sees only the :class:`Retriever` protocol; :class:`MemoryRetriever` is the concrete
one over the reference :class:`~plugin.memory.store.MemoryStore`, chosen by the bootstrap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import attrs

from plugin.control import AttemptKind, Permit, RecallBudgetExceeded

from .planning import QueryStrategy
from .preparation import PreparedRecall
from .store import Evidence, MemoryStore
from .terms import STOPWORDS as STOPWORDS
from .terms import content_terms as content_terms
from .terms import query_terms as query_terms

ARMS = frozenset({"sparse", "semantic", "recent"})
"""The candidate arms of an attempt."""

RRF_K = 60
"""Reciprocal-rank fusion constant (Cormack et al.): score = sum of 1 / (k + rank)."""


def _positive(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"ContextCaps.{attribute.name} must be an int >= 1, got {value!r}")


@attrs.frozen(kw_only=True)
class ContextCaps:
    """The host's limits on rendered recall context."""

    max_items: int = attrs.field(default=8, validator=_positive)
    """Most evidence items rendered."""
    max_bytes: int = attrs.field(default=4096, validator=_positive)
    """Most UTF-8 bytes of rendered evidence."""
    candidates_per_arm: int = attrs.field(default=20, validator=_positive)
    """How many candidates each arm contributes to ranking."""
    beliefs_per_person: int = attrs.field(default=3, validator=_positive)


@attrs.frozen(kw_only=True)
class Rendered:
    """Evidence rendered under the context caps, and what was left out."""

    items: tuple[Evidence, ...]
    text: str
    omitted: int
    """Evidence items ranked but left out by the caps."""


@attrs.frozen(kw_only=True)
class SearchOutcome:
    """What one attempt found, and the slot it took."""

    slot: int
    kind: AttemptKind
    fingerprint: str
    evidence: tuple[Evidence, ...]
    rendered: Rendered
    people: tuple[str, ...] = ()
    arms: tuple[str, ...] = ()
    """The arms that ran (``sparse``, ``semantic``, ``recent``)."""
    notes: tuple[str, ...] = ()
    """Degradations: an arm skipped or withheld, a nested read refused, a source not read."""
    belief_slot: int | None = None


@runtime_checkable
class Retriever(Protocol):
    """What the runtime hooks call to search; they never see a concrete store."""

    def searchable(self, prepared: PreparedRecall) -> bool:
        """Whether an attempt would run anything (else it is skipped: reserved, not executed)."""
        ...

    async def search(
        self,
        prepared: PreparedRecall,
        permit: Permit,
        *,
        kind: AttemptKind,
        caps: ContextCaps,
        nested_beliefs: bool,
    ) -> SearchOutcome:
        """Run one attempt under ``permit`` (raises ``RecallBudgetExceeded`` with no slot)."""
        ...

    async def read_beliefs(
        self,
        people: Sequence[str],
        permit: Permit,
        *,
        kind: AttemptKind,
        principal: str,
        scope: str,
        caps: ContextCaps,
    ) -> tuple[int, tuple[Evidence, ...]]:
        """A People-to-belief read, on a slot of its own; returns (slot, beliefs)."""
        ...

    async def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:
        """Current correction notices (no slot: they stay available when recall is spent)."""
        ...

    async def revalidate(
        self, ids: Sequence[str], *, principal: str, scope: str
    ) -> tuple[Evidence, ...]:
        """Re-read retained evidence by id (no search, no slot); the missing ones are gone."""
        ...


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


def by_fragment_priority(
    evidence: Sequence[Evidence], fragments: Sequence[str]
) -> list[Evidence]:
    """``evidence`` reordered by the earliest query fragment each item shares a word with.

    The planner orders fragments by priority (the request first, then the next action, ...);
    this ranking lets that order count without forming a second query. Items that share no
    word with any fragment keep their order at the end.
    """
    fragment_terms = [frozenset(content_terms(fragment)) for fragment in fragments]

    def first_hit(item: Evidence) -> int:
        words = frozenset(query_terms(item.text))
        return next(
            (i for i, terms in enumerate(fragment_terms) if terms & words), len(fragment_terms)
        )

    return sorted(evidence, key=first_hit)  # stable: ties keep the fused order


def render(evidence: Sequence[Evidence], caps: ContextCaps) -> Rendered:
    """Render whole evidence lines within ``caps``; an item that does not fit is left out."""
    lines: list[str] = []
    kept: list[Evidence] = []
    used = 0
    for item in evidence:
        if len(kept) >= caps.max_items:
            break
        line = f"- [{item.kind} {item.id}] {' '.join(item.text.split())}"
        size = len(line.encode("utf-8", "surrogatepass")) + (1 if lines else 0)
        if used + size > caps.max_bytes:
            continue
        lines.append(line)
        kept.append(item)
        used += size
    omitted = len(evidence) - len(kept)
    if omitted:
        lines.append(f"({omitted} more item{'s' if omitted != 1 else ''} left out by the "
                     f"context cap)")
    return Rendered(items=tuple(kept), text="\n".join(lines), omitted=omitted)


def _arms(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


@attrs.define(eq=False)
class MemoryRetriever:
    """The reference :class:`Retriever` over a :class:`MemoryStore`."""

    store: MemoryStore
    min_similarity: float = 0.25
    """Semantic candidates below this cosine are not evidence (calibrated on WordLlama)."""
    arms: frozenset[str] = attrs.field(default=ARMS, converter=_arms)
    """The candidate arms that run (an evaluator's ablation runs one at a time)."""

    def __attrs_post_init__(self) -> None:
        unknown = self.arms - ARMS
        if unknown or not self.arms:
            raise ValueError(f"MemoryRetriever.arms must be a non-empty subset of {sorted(ARMS)}")

    def searchable(self, prepared: PreparedRecall) -> bool:
        lexical = bool(query_terms(prepared.query.text)) and bool(self.arms - {"semantic"})
        return lexical or ("semantic" in self.arms and prepared.semantic.vector is not None)

    async def search(
        self,
        prepared: PreparedRecall,
        permit: Permit,
        *,
        kind: AttemptKind,
        caps: ContextCaps,
        nested_beliefs: bool,
    ) -> SearchOutcome:
        query = prepared.query
        principal, scope = _trusted(query.principal, query.scope)
        store = self.store
        notes: list[str] = []
        arms: list[str] = []
        belief_slot: int | None = None
        async with permit.attempt(
            kind, strategy=query.strategy.value, fingerprint=query.fingerprint
        ) as slot:
            people = await store.discover_people(query.text, principal=principal, scope=scope)
            ranked: list[list[Evidence]] = []
            terms = content_terms(query.text) if "sparse" in self.arms else ()
            if terms:
                ranked.append(await store.sparse_candidates(
                    " ".join(terms), principal=principal, scope=scope,
                    limit=caps.candidates_per_arm,
                ))
                arms.append("sparse")
            elif "sparse" in self.arms:
                notes.append("sparse arm skipped: the query has no searchable terms")
            vector = prepared.semantic.vector if "semantic" in self.arms else None
            if vector is not None:
                similar = await store.semantic_candidates(
                    vector, principal=principal, scope=scope, limit=caps.candidates_per_arm
                )
                ranked.append([item for item in similar if item.score >= self.min_similarity])
                arms.append("semantic")
            elif "semantic" in self.arms and prepared.semantic.withheld_reason is not None:
                notes.append(
                    f"semantic arm withheld: {prepared.semantic.withheld_reason.value}"
                )
            if "recent" in self.arms:
                recent = await self._recent(prepared, principal, scope, caps)
                if recent:
                    ranked.append(recent)
                arms.append("recent")
            evidence = fuse(ranked)
            if query.strategy is QueryStrategy.TASK_CONTEXT and evidence:
                # Its fragments are in priority order; the baseline's ranking stays unchanged.
                evidence = fuse([evidence, by_fragment_priority(evidence, query.fragments)])
            if nested_beliefs and people:
                try:
                    belief_slot, beliefs = await self.read_beliefs(
                        [p.name for p in people], permit, kind=AttemptKind.NESTED,
                        principal=principal, scope=scope, caps=caps,
                    )
                except RecallBudgetExceeded as exc:
                    notes.append(f"belief read refused: {exc.refusal.reason.value}")
                else:
                    evidence = fuse([evidence, list(beliefs)])
            rendered = render(evidence, caps)
            sources = await self._recover_sources(rendered.items, permit, slot, principal, scope,
                                                  notes)
            if sources:
                rendered = render([*rendered.items, *sources], caps)
        return SearchOutcome(
            slot=slot, kind=kind, fingerprint=query.fingerprint, evidence=rendered.items,
            rendered=rendered, people=tuple(p.name for p in people), arms=tuple(arms),
            notes=tuple(notes), belief_slot=belief_slot,
        )

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
        permit: Permit,
        slot: int,
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
                permit.source_read(slot)
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
        permit: Permit,
        *,
        kind: AttemptKind,
        principal: str,
        scope: str,
        caps: ContextCaps,
    ) -> tuple[int, tuple[Evidence, ...]]:
        async with permit.attempt(kind) as slot:
            beliefs: list[Evidence] = []
            for name in people:
                beliefs.extend(await self.store.beliefs_of(
                    name, principal=principal, scope=scope, limit=caps.beliefs_per_person
                ))
        return slot, tuple(beliefs)

    async def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:
        return tuple(await self.store.current_corrections(principal=principal, scope=scope))

    async def revalidate(
        self, ids: Sequence[str], *, principal: str, scope: str
    ) -> tuple[Evidence, ...]:
        return tuple(await self.store.get_memories(ids, principal=principal, scope=scope))


def _trusted(principal: str | None, scope: str | None) -> tuple[str, str]:
    if principal is None or scope is None:
        raise ValueError("a search needs the trusted principal and scope of the run")
    return principal, scope
