"""What the ranking tests share: a reference store (hashing embedding) beside a SQLite ledger on
one virtual clock, and one deliberate search through the reference retriever."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Collection
from pathlib import Path

from plugin import (
    AttemptKind,
    ManualClock,
    PreparedRecall,
    QueryPlanner,
    QueryPreparation,
    QueryStrategy,
    RecallAllowance,
    RoundKind,
    SqliteLedger,
    WorkingState,
)
from plugin.memory import ContextCaps, MemoryRetriever, MemoryStore
from plugin.memory.enforce import search_attempt
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.ranking import RankingPolicy

RankingEnv = tuple[MemoryStore, RecallAllowance]
"""A store and an allowance over its own ledger, on one virtual clock."""

_RUNS = itertools.count()


async def admit(experiment: str) -> bool:
    """A planner admission that lets every experiment run."""
    return True


@contextlib.asynccontextmanager
async def ranking_env(folder: Path) -> AsyncIterator[RankingEnv]:
    """A fresh store and allowance in ``folder``."""
    clock = ManualClock()
    async with SqliteLedger(folder / "l.db") as ledger, MemoryStore(
        folder / "m.db", embedding=HashingEmbedding(dimensions=512, token_limit=256),
        clock=clock,
    ) as store:
        yield store, RecallAllowance(ledger, clock=clock)


async def prepare(store: MemoryStore, state: WorkingState, *, principal: str, scope: str,
                  strategy: QueryStrategy = QueryStrategy.TASK_CONTEXT) -> PreparedRecall:
    """The recall planned from ``state``, as a turn would plan it."""
    preparation = QueryPreparation(QueryPlanner(strategy, admission=admit), store.embedding)
    return await preparation.prepare(state, scope=scope, principal=principal)


async def search(env: RankingEnv, prepared: PreparedRecall, arms: Collection[str],
                 **retriever: object) -> tuple[list[str], tuple[str, ...]]:
    """One deliberate search of ``prepared`` in a fresh run, through a reference retriever
    with the options ``retriever``: the ids found, best first, and the retriever's notes."""
    store, allowance = env
    caps = ContextCaps(max_items=20, max_bytes=100_000)
    found = MemoryRetriever(store, arms=frozenset(arms), **retriever)  # type: ignore[arg-type]
    async with allowance.round(f"r{next(_RUNS)}", RoundKind.DELIBERATE, slots=1) as permit:
        attempted = await search_attempt(permit, found, prepared, kind=AttemptKind.BASE,
                                         caps=caps, nested_beliefs=False)
    return [item.id for item in attempted.found.evidence], attempted.found.notes


async def ranked(env: RankingEnv, state: WorkingState, arms: Collection[str],
                 policy: RankingPolicy | None = None, *, principal: str,
                 scope: str) -> list[str]:
    """The ids one task-context search of ``state`` finds, best first."""
    prepared = await prepare(env[0], state, principal=principal, scope=scope)
    return (await search(env, prepared, arms, ranking=policy or RankingPolicy()))[0]
