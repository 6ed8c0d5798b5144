"""The preparation protocol: how the runtime gets a round's query, never a concrete store.

One former, one fingerprint: :meth:`QueryPreparation.prepare` plans the round's query once and
returns it inside a :class:`PreparedRecall` together with its semantic preparation. Retrieval
uses that same object, so the query embedded and the query searched cannot differ, even if the
release admission changes its answer in between.
"""

from __future__ import annotations

import contextvars
import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.to_thread
import attrs
import numpy as np

from plugin.control.clock import Clock, finite_clock
from plugin.control.logs import log_event
from plugin.memory.embedding import EmbeddingAdapter, Vector, is_embedding_adapter
from plugin.memory.planning import (
    BaselineReason,
    QueryPlanner,
    QueryStrategy,
    RecallQuery,
    compose_search_call,
)
from plugin.memory.state import WorkingState
from plugin.memory.threads import memory_threads

_log = logging.getLogger("recallbound.memory")

MAX_CHARS_PER_TOKEN = 64
"""No tokenizer we adapt has a token longer than this, so a query of more than
``token_limit * MAX_CHARS_PER_TOKEN`` characters is over the limit without counting (counting
a megabyte takes the WordLlama tokenizer most of a second)."""


_PLANNED: contextvars.ContextVar[list[tuple[RecallQuery | None, RecallQuery]] | None] = (
    contextvars.ContextVar("recallbound_planned", default=None))
"""Within one :meth:`PreparationBound.prepare`, what its first attempt planned: the query
(None while admission was being asked) and the recent arm's control query."""


class WithheldReason(enum.Enum):
    """Why a query has no vector (the sparse arm still runs on ``query.text``)."""

    NO_ADAPTER = "no_adapter"
    """No embedding adapter is configured."""
    EMPTY_QUERY = "empty_query"
    """The query has no text to embed."""
    TOKEN_LIMIT = "token_limit"
    """The query takes more tokens than the adapter reads; it is withheld, not truncated."""
    ADAPTER_FAILED = "adapter_failed"
    """The adapter raised, or returned a malformed token count or vector."""
    PREPARATION_BOUND = "preparation_bound"
    """The hooks' preparation bound ran out before this query was embedded."""
    NO_SLOT = "no_slot"
    """Not embedded: the round could not grant this call a slot anyway."""


@attrs.frozen(kw_only=True)
class SemanticPreparation:
    """The semantic arm's input for one query: a vector, or why there is none.

    ``vector`` is a read-only float32 array of the adapter's dimensions, or ``None`` exactly
    when ``withheld_reason`` is set. ``tokens`` is the adapter's own count (``None`` when it was
    not counted). ``model`` names the adapter.
    """

    fingerprint: str
    vector: Vector | None = attrs.field(default=None, eq=False, repr=False)
    withheld_reason: WithheldReason | None = None
    tokens: int | None = None
    model: str | None = None
    fragment_vectors: tuple[Vector, ...] = attrs.field(default=(), eq=False, repr=False)
    """One vector per query fragment, embedded in the same call as ``vector`` (so under the
    same token count: every fragment is part of the counted text); empty when withheld, for a
    baseline query (ranked as a whole) and for a single fragment (``vector`` is that one)."""

    def __attrs_post_init__(self) -> None:
        if (self.vector is None) is (self.withheld_reason is None):
            raise ValueError(
                "SemanticPreparation needs either a vector or a withheld_reason, not both"
            )


@attrs.frozen(kw_only=True)
class PreparedRecall:
    """Everything one round retrieves with: the query, the frozen control and the vector.

    Built only when ``semantic.fingerprint == query.fingerprint`` and ``recent_query`` is a
    baseline query of the same scope and principal; otherwise ``ValueError``.
    """

    query: RecallQuery
    recent_query: RecallQuery
    semantic: SemanticPreparation
    people: tuple[str, ...] | None = None
    """The known People the query names, when they were looked up while the call was prepared
    (a deliberate call's nested-read slot depends on them); None: not looked up, the search
    discovers them itself. One lookup per call, never two."""

    def __attrs_post_init__(self) -> None:
        self.check()

    @property
    def fingerprint(self) -> str:
        """The round's query fingerprint (the same for preparation and retrieval)."""
        return self.query.fingerprint

    def check(self) -> None:
        """Raise ``ValueError`` unless the semantic preparation belongs to ``query``."""
        if self.semantic.fingerprint != self.query.fingerprint:
            raise ValueError(
                f"PreparedRecall.semantic was prepared for query {self.semantic.fingerprint}, "
                f"not {self.query.fingerprint}"
            )
        recent = self.recent_query
        if recent.strategy is not QueryStrategy.BASELINE:
            raise ValueError(
                f"PreparedRecall.recent_query must be a baseline query, got {recent.strategy}"
            )
        if (recent.scope, recent.principal) != (self.query.scope, self.query.principal):
            raise ValueError(
                "PreparedRecall.recent_query must have the query's scope and principal"
            )


@runtime_checkable
class RecallPreparer(Protocol):
    """What the runtime calls in the preparation phase (it never sees a concrete store)."""

    async def prepare(
        self,
        state: WorkingState,
        *,
        scope: str | None,
        principal: str | None,
        withhold: WithheldReason | None = None,
    ) -> PreparedRecall:
        """Form this round's query once and prepare its semantic arm.

        With ``withhold``, the query is not embedded (the semantic arm is withheld for that
        reason): the hooks' preparation bound ran out, or no slot is left for the query.
        """
        ...

    async def prepare_search(
        self,
        text: str,
        *,
        scope: str | None,
        principal: str | None,
        withhold: WithheldReason | None = None,
    ) -> PreparedRecall:
        """Prepare one deliberate search call's own text (no planning, same arms)."""
        ...


def _embedding(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not is_embedding_adapter(value):
        raise TypeError(
            f"QueryPreparation.embedding must be an EmbeddingAdapter or None, "
            f"got {type(value).__name__}"
        )


@attrs.frozen
class QueryPreparation:
    """The default :class:`RecallPreparer`: a :class:`QueryPlanner` and an optional adapter."""

    planner: QueryPlanner = attrs.field(validator=attrs.validators.instance_of(QueryPlanner))
    embedding: EmbeddingAdapter | None = attrs.field(default=None, validator=_embedding)

    async def prepare(
        self,
        state: WorkingState,
        *,
        scope: str | None,
        principal: str | None,
        withhold: WithheldReason | None = None,
    ) -> PreparedRecall:
        """Plan once (admission asked once) and embed that query in a worker thread.

        A query over the adapter's ``token_limit``, an empty query, a missing adapter or a
        failing adapter gives no vector and the reason; the sparse arm still runs.
        """
        planned = _PLANNED.get()
        if planned:  # the bound cut this call's first attempt: admission is not asked again
            planned_query, recent = planned[0]
            # Cut while admission was asked (the plan's only wait): it did not answer in time.
            query = planned_query or attrs.evolve(
                recent, baseline_reason=BaselineReason.ADMISSION_TIMEOUT)
        else:
            recent = self.planner.plan_recent(state, scope=scope, principal=principal)
            if planned is not None:
                planned.append((None, recent))
            query = await self.planner.plan(state, scope=scope, principal=principal)
            if planned is not None:
                planned[0] = (query, recent)
        semantic = await self._prepare_semantic(query, withhold)
        return PreparedRecall(query=query, recent_query=recent, semantic=semantic)

    async def prepare_search(
        self,
        text: str,
        *,
        scope: str | None,
        principal: str | None,
        withhold: WithheldReason | None = None,
    ) -> PreparedRecall:
        """The model's search text as the query; it is also the recent arm's control query."""
        query = compose_search_call(text, scope=scope, principal=principal)
        semantic = await self._prepare_semantic(query, withhold)
        return PreparedRecall(query=query, recent_query=query, semantic=semantic)

    async def _prepare_semantic(
        self, query: RecallQuery, withhold: WithheldReason | None
    ) -> SemanticPreparation:
        adapter = self.embedding
        if withhold is not None and adapter is not None:
            return SemanticPreparation(
                fingerprint=query.fingerprint, withheld_reason=withhold, model=adapter.name
            )
        if adapter is None:
            return SemanticPreparation(
                fingerprint=query.fingerprint, withheld_reason=WithheldReason.NO_ADAPTER
            )
        if not query.text:
            return SemanticPreparation(
                fingerprint=query.fingerprint,
                withheld_reason=WithheldReason.EMPTY_QUERY,
                model=adapter.name,
            )
        # Only task-context ranking weighs fragments (the baseline is the frozen control).
        weighed = query.strategy is QueryStrategy.TASK_CONTEXT and len(query.fragments) > 1
        fragments = query.fragments if weighed else ()
        # Abandoned, not awaited, when the hooks' preparation bound cancels it: a hung model
        # cannot hold the turn (the thread finishes on its own; its answer is dropped).
        tokens, vectors, reason = await anyio.to_thread.run_sync(
            _embed, adapter, query.text, fragments, abandon_on_cancel=True,
            limiter=memory_threads(adapter),
        )
        return SemanticPreparation(
            fingerprint=query.fingerprint,
            vector=vectors[0] if vectors else None,
            withheld_reason=reason,
            tokens=tokens,
            model=adapter.name,
            fragment_vectors=vectors[1:],
        )


def _embed(
    adapter: EmbeddingAdapter, text: str, fragments: tuple[str, ...] = ()
) -> tuple[int | None, tuple[Vector, ...], WithheldReason | None]:
    """Count ``text``, then embed it and its ``fragments`` in one call unless it is over the
    limit (runs in a worker thread). The fragments are parts of ``text``, so the one count
    bounds them all."""
    tokens: int | None = None
    try:  # everything the adapter gives is read in here: any of it may raise or be junk
        limit = adapter.token_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            _adapter_failed(adapter, "token_limit", type(limit).__name__)
            return None, (), WithheldReason.ADAPTER_FAILED
        if len(text) > limit * MAX_CHARS_PER_TOKEN:
            return None, (), WithheldReason.TOKEN_LIMIT  # cannot fit; not worth tokenizing
        tokens = adapter.count_tokens(text)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            _adapter_failed(adapter, "count_tokens", type(tokens).__name__)
            return None, (), WithheldReason.ADAPTER_FAILED
        if tokens > limit:
            return tokens, (), WithheldReason.TOKEN_LIMIT
        vectors = adapter.embed([text, *fragments])
        shape = (1 + len(fragments), adapter.dimensions)
        finite = (isinstance(vectors, np.ndarray) and vectors.shape == shape
                  and vectors.dtype.kind in "fiu" and bool(np.isfinite(vectors).all()))
    except Exception as exc:  # its message may hold the query's words: only its type is logged
        _adapter_failed(adapter, "raised", type(exc).__name__)
        return tokens, (), WithheldReason.ADAPTER_FAILED
    if not finite:
        _adapter_failed(adapter, "embed", type(vectors).__name__)
        return tokens, (), WithheldReason.ADAPTER_FAILED
    frozen = []
    for row in vectors:
        vector = np.array(row, dtype=np.float32)  # a private copy, then frozen
        vector.setflags(write=False)
        frozen.append(vector)
    return tokens, tuple(frozen), None


@attrs.define(eq=False)
class PreparationBound:
    """The bound on preparing one hook call's queries before its round is reserved.

    Queries are formed and embedded *before* the round, so the permit's time is spent on
    searching; this bound (``budget_s`` on the injected clock, and a real cancel scope around
    each embedding) keeps preparation from holding the turn. A query prepared after the bound
    ran out, or whose embedding the bound cut, runs without its vector, and says so.
    """

    budget_s: float
    clock: Clock = attrs.field(converter=finite_clock)
    """Every reading checked: a non-finite one is a typed error, never a deadline."""
    started: float = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.started = self.clock.monotonic()

    def left(self) -> float:
        """Seconds of the bound left (negative once it ran out)."""
        return self.budget_s - (self.clock.monotonic() - self.started)

    async def prepare(
        self,
        prepare: Callable[[WithheldReason | None], Awaitable[PreparedRecall]],
        withhold: WithheldReason | None = None,
    ) -> PreparedRecall:
        """Prepare one query within what is left of the bound (see the class docstring). When
        the bound cuts the embedding, the query is prepared again without it: a
        :class:`QueryPreparation` keeps the plan it already made (its admission is asked
        once), and a plan the bound cut while admission was asked takes the baseline
        (``ADMISSION_TIMEOUT``) without asking again; another preparer prepares again."""
        left = self.left()
        if withhold is None and left <= 0:
            withhold = WithheldReason.PREPARATION_BOUND
        token = _PLANNED.set([])
        try:
            if withhold is None:
                with anyio.move_on_after(left):
                    return await prepare(None)
                withhold = WithheldReason.PREPARATION_BOUND
            return await prepare(withhold)
        finally:
            _PLANNED.reset(token)


def _adapter_failed(adapter: EmbeddingAdapter, what: str, got: str) -> None:
    """Log an adapter's failure as an event: what failed and the type it gave, never a value
    or a message (either may hold the query's words); its semantic arm is withheld."""
    try:
        name = str(adapter.name)[:80]
    except Exception:  # a name that raises is the adapter's failure too
        name = type(adapter).__name__
    log_event(_log, logging.WARNING, "embedding.adapter_failed", adapter=name, failed=what,
              got=got)
