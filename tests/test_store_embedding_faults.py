"""A broken embedding adapter cannot poison the store: a write whose vectors are not finite
numbers of the right shape, or whose adapter raises, is a typed MemoryStoreError and writes
nothing (on asyncio and trio)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugin.memory.store import MemoryStore
from plugin.memory.store.errors import MemoryStoreError

pytestmark = pytest.mark.anyio

P, S = "ana", "atlas"


class Adapter:
    """Four dimensions; ``fault`` turns each later call's vectors into something broken."""

    name = "faulty-4"
    token_limit = 64
    dimensions = 4

    def __init__(self) -> None:
        self.fault: Callable[[int], Any] | None = None

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def embed(self, texts: Sequence[str]) -> Any:
        if self.fault is not None:
            return self.fault(len(texts))
        return np.ones((len(texts), 4), dtype=np.float32) / 2.0


def _raise(rows: int) -> Any:
    raise RuntimeError("model not loaded")


FAULTS: dict[str, Callable[[int], Any]] = {
    "nan": lambda rows: np.full((rows, 4), np.nan, dtype=np.float32),
    "inf": lambda rows: np.full((rows, 4), np.inf, dtype=np.float32),
    "raises": _raise,
    "strings": lambda rows: np.full((rows, 4), "x", dtype=object),
    "ragged": lambda rows: [[1.0, 2.0], [3.0]] * rows,
    "wrong shape": lambda rows: np.zeros((rows, 3), dtype=np.float32),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_broken_adapter_fails_the_write_and_writes_nothing(
    anyio_backend: object, tmp_path: Path, fault: str
) -> None:
    adapter = Adapter()
    async with MemoryStore(tmp_path / "memory.db", embedding=adapter) as store:
        good = await store.remember("zulu yankee good", principal=P, scope=S)
        adapter.fault = FAULTS[fault]
        with pytest.raises(MemoryStoreError, match="embedding adapter"):
            await store.remember("zulu yankee poisoned", principal=P, scope=S)
        assert [m.id async for m in store.memories(principal=P, scope=S)] == [good]
