"""The composition root: the one place that picks concrete classes and the system clock.

``async with open_hooks(RecallConfig(...)) as hooks:`` opens the SQLite ledger and the
reference memory store, builds the planner, the preparation and the retriever, and hands back
:class:`~runtime_hooks.hooks.RecallHooks`. Tests and replays pass a ``clock``; production gets
:class:`~plugin.SystemClock`.
"""

from __future__ import annotations

import enum
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs

from plugin.control import AllowancePolicy, Clock, RecallAllowance, SqliteLedger, SystemClock
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.pipeline import ContextCaps, MemoryRetriever
from plugin.memory.planning import Admission, QueryPlanner, QueryStrategy
from plugin.memory.preparation import QueryPreparation
from plugin.memory.store import MemoryStore

from .hooks import RecallHooks


class Semantic(enum.Enum):
    """Which embedding adapter the semantic arm uses."""

    NONE = "none"
    """Sparse arm only."""
    WORDLLAMA = "wordllama"
    """The packaged WordLlama model (the ``semantic`` extra), loaded offline."""
    HASHING = "hashing"
    """A deterministic hashing embedding sized like WordLlama (tests and demos without the
    extra)."""


@attrs.frozen(kw_only=True)
class RecallConfig:
    """What the host decides; everything else has a default."""

    ledger_path: str | os.PathLike[str]
    store_path: str | os.PathLike[str]
    policy: AllowancePolicy = attrs.field(factory=AllowancePolicy)
    query_planning: QueryStrategy = attrs.field(
        default=QueryStrategy.BASELINE, converter=QueryStrategy
    )
    admission: Admission | None = None
    admission_timeout_s: float = 0.25
    semantic: Semantic = attrs.field(default=Semantic.NONE, converter=Semantic)
    caps: ContextCaps = attrs.field(factory=ContextCaps)
    legacy: bool = False
    """The explicit legacy mode: no enforcement, every attempt traced as legacy."""


def load_embedding(choice: Semantic) -> EmbeddingAdapter | None:
    """The adapter for ``choice``; WordLlama needs the ``semantic`` extra."""
    if choice is Semantic.WORDLLAMA:
        from plugin.memory.wordllama_adapter import WordLlamaAdapter

        return WordLlamaAdapter.load()
    if choice is Semantic.HASHING:
        from plugin.memory.hashing import HashingEmbedding

        return HashingEmbedding.like_wordllama()
    return None


@asynccontextmanager
async def open_hooks(
    config: RecallConfig,
    *,
    clock: Clock | None = None,
    embedding: EmbeddingAdapter | None = None,
) -> AsyncIterator[RecallHooks]:
    """Open the ledger and the store and wire the hooks; close both on exit."""
    clock = clock if clock is not None else SystemClock()
    if embedding is None:
        embedding = load_embedding(config.semantic)
    async with SqliteLedger(config.ledger_path) as ledger, MemoryStore(
        config.store_path, embedding=embedding, clock=clock
    ) as store:
        if config.legacy:
            allowance = RecallAllowance.legacy(ledger, clock=clock)
        else:
            allowance = RecallAllowance(ledger, policy=config.policy, clock=clock)
        planner = QueryPlanner(
            config.query_planning,
            admission=config.admission,
            admission_timeout_s=config.admission_timeout_s,
        )
        yield RecallHooks(
            allowance=allowance,
            preparer=QueryPreparation(planner, embedding),
            retriever=MemoryRetriever(store),
            caps=config.caps,
        )
