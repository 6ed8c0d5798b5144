"""Memory-store benchmark: what the number of (principal, scope) cells costs.

Run from the repository root::

    python -m bench.bench_cells --cells 10,1000,100000
    python -m bench.bench_store --no-arms --sizes "" --cells 10,100000   # the same table

Cells are rows of the term index and of the semantic arm's generations, never tables, so no
operation should grow with C. For C cells of one memory each (with its vector, from the
hashing adapter), each operation below is timed on every C in turn, so a load spike on this
shared machine hits every C alike, and reported against the same operation at the smallest C
of the same run (the baseline):

- a write to a new cell (``remember``, with its vector), a write to an existing cell;
- a sparse search and a semantic search of an existing cell;
- opening the store plus a first sparse and a first semantic search.

Medians of :data:`CELL_CALLS` calls (:data:`CELL_OPENS` opens). The targets, printed at the
end: every operation at the largest C at most 2x its figure at the smallest, and a write to a
new cell at most 2 ms (p50) at the largest. Every write commits with ``synchronous=FULL``, so
its time is mostly the disk's flush.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from plugin.memory.hashing import HashingEmbedding
from plugin.memory.store import MemoryRecord, MemoryStore

SCOPE = "proj"
#: Calls per operation, and opens, in the cells table.
CELL_CALLS = 50
CELL_OPENS = 11
#: The most an operation at the largest C may cost, against the smallest C of the same run.
MAX_RATIO = 2.0
EMBEDDING = HashingEmbedding()


async def cell_store(path: Path, count: int) -> None:
    """A store of ``count`` cells of one memory each, with vectors, in one transaction."""
    async with MemoryStore(path, embedding=EMBEDDING) as store:
        await store.add_memories(
            MemoryRecord(
                id="m", text=f"text {i} word", principal=f"p{i}", scope=SCOPE, created_at=1.0
            )
            for i in range(count)
        )


async def cell_costs(folder: Path, counts: Sequence[int]) -> dict[int, dict[str, float]]:
    """Median ms of each operation on a store of C cells of one memory each, for each C."""
    paths = {count: folder / f"cells-{count}.db" for count in counts}
    for count, path in paths.items():
        await cell_store(path, count)
    times: dict[int, dict[str, list[float]]] = {count: {} for count in counts}
    vector = EMBEDDING.embed(["text word"])[0]

    def calls(store: MemoryStore, i: int) -> dict[str, Callable[[], Awaitable[Any]]]:
        return {
            "write to a new cell": lambda: store.remember("text", principal=f"new{i}", scope=SCOPE),
            "write to an existing cell": lambda: store.remember(
                "text", id=f"more{i}", principal="p1", scope=SCOPE
            ),
            "sparse search": lambda: store.sparse_candidates(
                "text word", principal="p2", scope=SCOPE, limit=10
            ),
            "semantic search": lambda: store.semantic_candidates(
                vector, principal="p3", scope=SCOPE, limit=10
            ),
        }

    async with contextlib.AsyncExitStack() as stack:
        stores = {
            count: await stack.enter_async_context(MemoryStore(path, embedding=EMBEDDING))
            for count, path in paths.items()
        }
        for i in range(CELL_CALLS):
            for count, store in stores.items():
                for name, call in calls(store, i).items():
                    start = time.perf_counter()
                    await call()
                    times[count].setdefault(name, []).append(time.perf_counter() - start)
    for i in range(CELL_OPENS):
        for count, path in paths.items():
            start = time.perf_counter()
            async with MemoryStore(path, embedding=EMBEDDING) as again:
                principal = f"p{i % min(counts)}"
                await again.sparse_candidates("text", principal=principal, scope=SCOPE, limit=10)
                await again.semantic_candidates(vector, principal=principal, scope=SCOPE, limit=10)
            times[count].setdefault("open + first searches", []).append(time.perf_counter() - start)
    return {
        count: {name: statistics.median(values) * 1e3 for name, values in found.items()}
        for count, found in times.items()
    }


async def cells(counts: Sequence[int]) -> None:
    print(
        f"\ncells: C cells of one memory each; medians of {CELL_CALLS} calls ({CELL_OPENS} opens), "
        f"every C in turn; asyncio; load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory() as folder:
        found = await cell_costs(Path(folder), counts)
    for count, results in found.items():
        print(f"  C = {count:,}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in results.items()))
    low, high = min(found), max(found)
    print(f"cell targets (this run; each operation at {high:,} cells against {low:,}):")
    if low != high:
        for name, baseline in found[low].items():
            ratio = found[high][name] / baseline
            verdict = "ok" if ratio <= MAX_RATIO else "OVER"
            print(f"  {name:28s} {ratio:6.2f}x   (target <= {MAX_RATIO:g}x) {verdict}")
    print(
        f"  write to a new cell at {high:,}, p50   "
        f"{found[high]['write to a new cell']:6.2f} ms (target <= 2 ms)"
    )


async def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_cells")
    parser.add_argument("--cells", default="10,10000", help="cell counts, comma-separated")
    args = parser.parse_args(list(argv))
    await cells([int(c) for c in args.cells.split(",") if c])


if __name__ == "__main__":
    import sys

    anyio.run(main, sys.argv[1:])
