"""Helpers shared by the hooks' test modules: the store behind the hooks, calls, usage."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

from plugin import AllowancePolicy, Clock, QueryPlanner, QueryPreparation, RecallAllowance
from plugin.memory import MemoryRetriever, MemoryStore
from runtime_hooks import RecallHooks, ToolCall
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import seed

from ._fakes import MemoryLedger


def store_of(hooks: RecallHooks) -> MemoryStore:
    """The reference store behind ``hooks`` (to seed it)."""
    retriever = hooks.retriever
    assert isinstance(retriever, MemoryRetriever)
    return retriever.store


_TURNS = itertools.count()


def search_calls(*queries: object) -> list[ToolCall]:
    """One search call per query, with ids fresh for each turn (``t7-c0``, ``t7-c1``, ...), as
    a model gives them: a call id with the same arguments again would be a replay."""
    turn = next(_TURNS)
    return [ToolCall(call_id=f"t{turn}-c{i}", arguments={"query": q})
            for i, q in enumerate(queries)]


async def usage_counts(hooks: RecallHooks, run_id: str) -> tuple[int, int, int, int]:
    """The run's (rounds, reserved, executed, refused)."""
    usage = await hooks.allowance.ledger.usage(run_id)
    return usage.rounds, usage.reserved, usage.executed, usage.refused


def hooks_over(retriever: Any, clock: Clock, **policy: Any) -> RecallHooks:
    """Hooks over ``retriever`` on an in-memory ledger (no threads), baseline planning."""
    allowance = RecallAllowance(MemoryLedger(), policy=AllowancePolicy(**policy), clock=clock)
    return RecallHooks(allowance=allowance, preparer=QueryPreparation(QueryPlanner()),
                       retriever=retriever)


async def each_way(factory: Callable[[], Any], clock: Clock) -> AsyncIterator[RecallHooks]:
    """Hooks over the retriever ``factory`` makes, in process, then in a worker process
    (``ProcessRetriever(factory)``, closed before the next): the same search both ways."""
    from plugin import ProcessRetriever

    for retriever in (factory(), ProcessRetriever(factory)):
        async with contextlib.AsyncExitStack() as stack:
            if isinstance(retriever, ProcessRetriever):
                await stack.enter_async_context(retriever)
            yield hooks_over(retriever, clock)


@contextlib.asynccontextmanager
async def seeded_hooks(config: RecallConfig, clock: Clock) -> AsyncIterator[RecallHooks]:
    """Hooks opened from ``config`` over the reference store, seeded with the demo's memories."""
    async with open_hooks(config, clock=clock) as hooks:
        retriever = hooks.retriever
        assert isinstance(retriever, MemoryRetriever)
        await seed(retriever.store)
        yield hooks
