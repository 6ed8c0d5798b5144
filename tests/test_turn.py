"""The deliberate turn beside the automatic one: one People lookup and one render per call.

The hooks' dispatch and the evaluator run :func:`plugin.memory.turn.deliberate_turn`, so what
one ``search_memory`` call costs is counted here, on the reference store, on both loops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from plugin import ManualClock, QueryPlanner, QueryPreparation
from plugin.memory import MemoryRecord, MemoryRetriever, MemoryStore, pipeline, recall, rendering
from plugin.memory import turn as turns

from ._hooks_env import hooks_over, search_calls, usage_counts

pytestmark = pytest.mark.anyio

P, S = "ana", "atlas"



@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[MemoryStore]:
    async with MemoryStore(tmp_path / "memory.db") as store:
        await store.add_memories([
            MemoryRecord(id="m-cutover", text="Bruno moves the cutover to friday", principal=P,
                         scope=S, created_at=1.0),
            MemoryRecord(id="m-deploy", text="deploy window is at noon", principal=P,
                         scope=S, created_at=2.0),
        ])
        await store.add_person("Bruno", principal=P, scope=S)
        await store.add_belief("b-bruno", "Bruno", "Bruno prefers small cutovers",
                               principal=P, scope=S, created_at=3.0)
        yield store


class Counting:
    """Counts the store's People lookups and every render, wherever it is called from."""

    def __init__(self, store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lookups = 0
        self.renders = 0
        discover = store.discover_people

        async def counted_discover(*args: Any, **kwargs: Any) -> Any:
            self.lookups += 1
            return await discover(*args, **kwargs)

        monkeypatch.setattr(store, "discover_people", counted_discover)
        real_render = rendering.render

        def counted_render(*args: Any, **kwargs: Any) -> Any:
            self.renders += 1
            return real_render(*args, **kwargs)

        for module in (rendering, pipeline, recall):
            if hasattr(module, "render"):
                monkeypatch.setattr(module, "render", counted_render)


async def test_one_search_call_looks_up_people_once_and_renders_once(
    store: MemoryStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = Counting(store, monkeypatch)
    hooks = hooks_over(MemoryRetriever(store), clock)
    (result,) = await hooks.dispatch(search_calls("what did Bruno say about the cutover"),
                                     run_id="r", scope=S, principal=P)
    assert result.status == "ok"
    assert "m-cutover" in [e.id for e in result.evidence]
    assert "b-bruno" in [e.id for e in result.evidence]  # the nested read still ran
    assert (counting.lookups, counting.renders) == (1, 1)
    assert await usage_counts(hooks, "r") == (1, 2, 2, 0)  # the search and its nested read


async def test_the_deliberate_turn_is_what_the_hooks_run(
    store: MemoryStore, clock: ManualClock
) -> None:
    hooks = hooks_over(MemoryRetriever(store), clock)
    via_hooks = await hooks.dispatch(search_calls("Bruno cutover", "deploy noon"),
                                     run_id="h", scope=S, principal=P)
    turn = await turns.deliberate_turn(
        hooks.allowance, QueryPreparation(QueryPlanner()), MemoryRetriever(store),
        ["Bruno cutover", "deploy noon"], run_id="t", scope=S, principal=P, caps=hooks.caps,
        budget_s=2.0,
    )
    assert isinstance(turn, turns.DeliberateTurn)
    assert [p.people for p in turn.prepared] == [("Bruno",), ()]
    searched = [s.rendered.items if s.rendered is not None else () for s in turn.recall.searches]
    assert [[e.id for e in items] for items in searched] == [
        [e.id for e in result.evidence] for result in via_hooks
    ]
    assert await usage_counts(hooks, "t") == await usage_counts(hooks, "h")
