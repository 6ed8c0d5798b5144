"""A memory store whose file is deleted or replaced while open refuses writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plugin.memory import MemoryStore
from plugin.memory.store.errors import MemoryStorePathError

pytestmark = pytest.mark.anyio


def _delete(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        with_suffix = Path(f"{path}{suffix}")
        if with_suffix.exists():
            with_suffix.unlink()


def _replace(path: Path) -> None:
    os.rename(path, path.with_name("old.db"))
    path.write_bytes(b"")


@pytest.mark.parametrize("change", [_delete, _replace])
async def test_remember_refused_after_file_deleted_or_replaced(tmp_path: Path, change) -> None:
    path = tmp_path / "memories.db"
    async with MemoryStore(path) as store:
        await store.remember("first", principal="u1", scope="proj")
        change(path)
        with pytest.raises(MemoryStorePathError, match="deleted or replaced"):
            await store.remember("lost", principal="u1", scope="proj")
        with pytest.raises(MemoryStorePathError):
            await store.forget("x", principal="u1", scope="proj")


async def test_store_reopened_at_same_path_writes(tmp_path: Path) -> None:
    path = tmp_path / "memories.db"
    async with MemoryStore(path) as store:
        await store.remember("first", principal="u1", scope="proj")
    _delete(path)
    async with MemoryStore(path) as store:
        await store.remember("second", principal="u1", scope="proj")
        texts = [m.text async for m in store.memories(principal="u1", scope="proj")]
    assert texts == ["second"]
