"""Forgetting is a cell's own act: a memory id forgotten under another principal or scope
changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugin.memory import MemoryStore

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("principal", "scope"), [("u1", "other"), ("u2", "proj")],
                         ids=["scope", "principal"])
async def test_forget_under_another_cell_keeps_the_memory(
    tmp_path: Path, principal: str, scope: str,
) -> None:
    async with MemoryStore(tmp_path / "m.db") as store:
        mid = await store.remember("Ana owns the schema review.", principal="u1", scope="proj")
        assert await store.forget(mid, principal=principal, scope=scope) is False
        kept = [memory.id async for memory in store.memories(principal="u1", scope="proj")]
        assert kept == [mid]
        assert await store.forget(mid, principal="u1", scope="proj") is True
        assert [m async for m in store.memories(principal="u1", scope="proj")] == []
