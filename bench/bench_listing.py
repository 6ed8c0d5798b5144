"""Listing a cell page by page (``MemoryStore.memories``, ``recallbound memory list``).

Run from the repository root::

    python -m bench.bench_listing                     # a cell of 20,000 memories
    python -m bench.bench_listing --sizes 20000,100000

For each size N, a temporary store holds N memories in one cell beside 1,000 in another,
written with ``add_memories``: the newest 5,000 share one ``created_at`` (an import written at
one clock reading), the others come three to a time. It times reading the whole cell 256 at a time
through the store, and, as the baseline in the same run on the same file, the same pages read
with the page condition written as an ``OR`` (``created_at < ? OR (created_at = ? AND seq <
?)``), which SQLite cannot read as one range of an index, so it sorts the rest of the cell for
every page. Prints each time and the store's over the baseline's.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

import anyio

from plugin.memory.store import MemoryRecord, MemoryStore
from plugin.memory.store.lookups import FIRST_PAGE, NEXT_PAGE, next_page

PAGE = 256
TIE = 5_000
"""The newest memories share one time, as an import written at one clock reading does."""
OLD_NEXT_PAGE = FIRST_PAGE.replace(
    "ORDER BY", "AND (m.created_at < ? OR (m.created_at = ? AND m.seq < ?)) ORDER BY")


async def build(path: Path, size: int) -> None:
    async with MemoryStore(path) as store:
        for start in range(0, size, 5_000):
            await store.add_memories(
                MemoryRecord(id=f"m{i}", text=f"note {i} about item {i % 97}", principal="u1",
                             scope="big", created_at=1e9 if i < TIE else float(i // 3))
                for i in range(start, min(size, start + 5_000)))
        await store.add_memories(
            MemoryRecord(id=f"o{i}", text=f"other {i}", principal="u1", scope="small",
                         created_at=float(i)) for i in range(1_000))


async def through_store(path: Path) -> tuple[float, int]:
    async with MemoryStore(path) as store:
        began = time.perf_counter()
        count = 0
        async for _ in store.memories(principal="u1", scope="big", page=PAGE):
            count += 1
        return time.perf_counter() - began, count


def pages(path: Path, query: str, key: int) -> tuple[float, int]:
    """The whole cell through ``query``: the store's (``key`` 2) or the OR condition's
    (``key`` 3, whose key is ``(created_at, created_at, seq)``)."""
    conn = sqlite3.connect(path)
    try:
        began = time.perf_counter()
        rows = conn.execute(FIRST_PAGE, ("u1", "big", PAGE)).fetchall()
        count = len(rows)
        while len(rows) == PAGE:
            created_at, seq = rows[-1][4], rows[-1][6]
            params = (next_page("u1", "big", (created_at, seq), PAGE) if key == 2
                      else ("u1", "big", created_at, created_at, seq, PAGE))
            rows = conn.execute(query, params).fetchall()
            count += len(rows)
        return time.perf_counter() - began, count
    finally:
        conn.close()


async def run(sizes: list[int]) -> None:
    print(f"listing one cell, {PAGE} a page: the page query (one index range a page) against "
          "the OR condition (a sort a page)")
    for size in sizes:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "memory.db"
            await build(path, size)
            store_s, listed = await through_store(path)
            new_s, new_listed = pages(path, NEXT_PAGE, 2)
            old_s, old_listed = pages(path, OLD_NEXT_PAGE, 3)
            assert listed == new_listed == old_listed == size, (listed, old_listed, size)
            print(f"  N={size:>7,}: page query {new_s * 1000:8.1f} ms, OR condition "
                  f"{old_s * 1000:8.1f} ms, ratio {new_s / old_s:.3f}; through the store "
                  f"{store_s * 1000:8.1f} ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="20000",
                        type=lambda text: [int(part) for part in text.split(",")])
    args = parser.parse_args(argv)
    anyio.run(run, args.sizes)


if __name__ == "__main__":
    main()
