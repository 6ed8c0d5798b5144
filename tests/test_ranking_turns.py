"""Turns of one conversation: the turn that matches a need lends part of its score to the
turns written just before and just after it (where the answer often is, even when it shares
no word with the need), and only to those: notes written a minute apart, a batch written at
once, another principal's turns and the frozen control's recent arm are untouched. The rule is
opt-in (``RankingPolicy(adjacent=...)``); off by default."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest

from plugin import (
    WorkingState,
)
from plugin.memory import MemoryRecord, MemoryStore
from plugin.memory.ranking import RankingPolicy

from ._ranking_env import RankingEnv, ranked, ranking_env

pytestmark = pytest.mark.anyio

P, S = "ada", "chat"

# The question's words are in the turn that asks about the trip, not in the answer after it;
# five other turns share one of the question's words each and outrank the answer on bm25.
_TURNS = [
    ("t1", "Mel: Caro, did you ever go to the pottery class you signed up for?"),
    ("t2", "Caro: Yes! Last Tuesday, the day after my birthday. I made a wonky bowl."),
    ("t3", "Mel: The pottery shop near me sells lovely glazes."),
    ("t4", "Caro: A class on painting starts next month, want to join?"),
    ("t5", "Mel: I signed up for the gym again."),
    ("t6", "Caro: Pottery is so relaxing, I should do more of it."),
    ("t7", "Mel: My class reunion is in June."),
    ("t8", "Caro: Went to a yoga class with Jo, not for me."),
    ("t9", "Mel: Pottery on a wheel is harder than it looks."),
    ("t10", "Caro: The pottery class teacher is from Kyoto."),
]
_STATE = WorkingState("Continue", next_action="When did Caro go to the pottery class?")
TURNS = RankingPolicy(adjacent=0.8)
OFF = RankingPolicy()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[RankingEnv]:
    async with ranking_env(tmp_path) as opened:
        yield opened


async def _seed(store: MemoryStore, *, apart: float, principal: str = P) -> None:
    await store.add_memories([
        MemoryRecord(id=f"{principal}-{key}", text=text, principal=principal, scope=S,
                     created_at=1_700_000_000.0 + apart * i)
        for i, (key, text) in enumerate(_TURNS)
    ])


async def _ranked(env: RankingEnv, policy: RankingPolicy = TURNS,
                  arms: frozenset[str] = frozenset({"sparse"})) -> list[str]:
    return await ranked(env, _STATE, arms, policy, principal=P, scope=S)


@pytest.mark.parametrize("arms", [frozenset({"sparse"}), frozenset({"sparse", "semantic"})])
async def test_the_answer_after_the_matching_turn_is_lifted_into_the_top(
    env: RankingEnv, arms: frozenset[str],
) -> None:
    await _seed(env[0], apart=1.0)
    off = await _ranked(env, OFF, arms)
    assert off[0] == "ada-t1" and off.index("ada-t2") >= 5, off
    on = await _ranked(env, arms=arms)
    assert on[0] == "ada-t1" and "ada-t2" in on[:4], on
    assert sorted(on) == sorted(off), (on, off)  # lifted, nothing else changed


async def test_the_answer_joins_even_when_no_arm_found_it(
    env: RankingEnv,
) -> None:
    store = env[0]
    await store.add_memories([
        MemoryRecord(id="q", text="Mel: Caro, did you ever go to the pottery class?",
                     principal=P, scope=S, created_at=1_700_000_000.0),
        MemoryRecord(id="a", text="Yes! Last Tuesday.", principal=P, scope=S,
                     created_at=1_700_000_001.0),
        MemoryRecord(id="x", text="The pottery shop sells glazes.", principal=P, scope=S,
                     created_at=1_700_000_500.0),
    ])
    assert await _ranked(env, OFF) == ["q", "x"]
    assert await _ranked(env) == ["q", "x", "a"]  # 0.8 of the first place: below the second


async def test_notes_a_minute_apart_are_not_turns(
    env: RankingEnv,
) -> None:
    await _seed(env[0], apart=60.0)
    assert await _ranked(env) == await _ranked(env, OFF)


async def test_a_batch_written_at_one_instant_is_not_a_conversation(
    env: RankingEnv,
) -> None:
    await _seed(env[0], apart=0.0)
    assert await _ranked(env) == await _ranked(env, OFF)


async def test_adjacent_memories_are_the_nearest_of_the_cell_within_the_window(
    env: RankingEnv,
) -> None:
    store = env[0]
    await _seed(store, apart=1.0)
    await _seed(store, apart=1.0, principal="eve")  # the same instants in another cell
    found = await store.get_memories(["ada-t1", "ada-t3"], principal=P, scope=S)
    first, third = sorted(found, key=lambda item: item.id)
    near = await store.adjacent_memories(third.created_at, third.id, principal=P, scope=S,
                                         window_s=1.0)
    assert [item.id for item in near] == ["ada-t2", "ada-t4"]
    assert all(item.principal == P for item in near)
    for window in (0.5, 0.0):
        assert await store.adjacent_memories(third.created_at, third.id, principal=P,
                                             scope=S, window_s=window) == []
    near = await store.adjacent_memories(first.created_at, first.id, principal=P, scope=S,
                                         window_s=5.0)
    assert [item.id for item in near] == ["ada-t2"]


def test_turns_are_off_by_default() -> None:
    assert RankingPolicy().adjacent == 0.0


def test_turn_options_are_checked() -> None:
    for bad in ({"adjacent": -0.1}, {"adjacent_sources": -1}, {"adjacent_window_s": float("nan")}):
        with pytest.raises(ValueError, match="RankingPolicy"):
            RankingPolicy(**bad)  # type: ignore[arg-type]
    assert attrs.evolve(RankingPolicy(), adjacent=0.0).adjacent == 0.0
