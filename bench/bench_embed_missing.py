"""Computing the vectors a model lacks, across a whole store: ``MemoryStore.embed_missing``.

Run from the repository root: ``python -m bench.bench_embed_missing [--memories N]``. A store
of ``N`` memories written without a model gets the hashing stand-in (so the model's own time
does not hide the store's), and ``embed_missing`` computes every vector, 256 at a time. The
baseline, in the same run on a copy of the same file: each batch found by scanning from the
store's first memory again (what ``embed_missing`` did before it went on from the last memory
it read), the shipped method with that one condition taken out of its query.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

from plugin.memory.hashing import HashingEmbedding
from plugin.memory.store import MemoryRecord, MemoryStore

CURSOR = "m.seq > ? AND "


async def _fill(path: Path, count: int) -> None:
    async with MemoryStore(path) as store:
        await store.add_memories(
            MemoryRecord(id=f"m{i}", text=f"note {i} on the invoice backfill", principal="u",
                         scope="s")
            for i in range(count))


async def _embed(path: Path, *, rescan: bool) -> tuple[int, float]:
    async with MemoryStore(path, embedding=HashingEmbedding()) as store:
        kind = type(store._writer.db)  # the store's database handle's class
        shipped = kind.fetch

        async def fetch(db: Any, sql: str, params: Any = ()) -> Any:
            if rescan and CURSOR in sql:  # the baseline: from the first memory every batch
                return await shipped(db, sql.replace(CURSOR, ""), params[1:])
            return await shipped(db, sql, params)

        with mock.patch.object(kind, "fetch", fetch):
            start = time.perf_counter()
            done = await store.embed_missing()
            return done, time.perf_counter() - start


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memories", type=int, default=50_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        filled = Path(folder) / "filled.db"
        await _fill(filled, args.memories)
        times = {}
        for rescan in (True, False):
            copy = Path(folder) / f"{'rescan' if rescan else 'shipped'}.db"
            shutil.copy(filled, copy)  # closed: the WAL was checkpointed into the file
            done, times[rescan] = await _embed(copy, rescan=rescan)
            assert done == args.memories, done
    print(f"embed_missing, {args.memories} memories (hashing stand-in, batches of 256):")
    print(f"  scanning from the first memory every batch (baseline) {times[True]:7.2f} s")
    print(f"  on from the last memory read (shipped)                {times[False]:7.2f} s"
          f"   x{times[False] / times[True]:.3f}")
