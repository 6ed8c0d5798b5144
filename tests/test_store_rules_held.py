"""Rules of the reference store's sparse arm that no other test held on its own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from plugin.control.clock import ManualClock
from plugin.memory.fts import fts5_match_expression
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.store import MemoryStore

pytestmark = pytest.mark.anyio

P, S = "u1", "proj"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[MemoryStore]:
    async with MemoryStore(
        tmp_path / "memory.db", embedding=HashingEmbedding(), clock=ManualClock(wall=1_000.0)
    ) as store:
        yield store


async def test_sparse_arm_uses_the_same_32_terms_the_safe_expression_quotes(
    store: MemoryStore,
) -> None:
    await store.add_memory("z", "zebra crossing", principal=P, scope=S)
    filler = " ".join(f"w{i}" for i in range(31))
    within = f"{filler} zebra"  # the 32nd distinct word
    beyond = f"{filler} w31 zebra"  # the 33rd
    assert '"zebra"' in (fts5_match_expression(within) or "")
    assert '"zebra"' not in (fts5_match_expression(beyond) or "")
    found = await store.sparse_candidates(within, limit=5, principal=P, scope=S)
    assert [e.id for e in found] == ["z"]
    assert await store.sparse_candidates(beyond, limit=5, principal=P, scope=S) == []
