"""Memory-store benchmark: per-read cost of each arm against a plain indexed read.

Run from the repository root: ``python -m bench.bench_store``. Seeds a temporary store with
memories for 10 principals (so every read filters 90% of the rows away), then times each read
method on asyncio. The baseline, measured in the same run, is ``recent_candidates`` (one
indexed SELECT); the other arms print their median per-call time and the ratio to it. The
semantic arm uses the packaged WordLlama model when installed (the ``semantic`` extra) and the
hashing test adapter otherwise.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.store import MemoryRecord, MemoryStore

PRINCIPALS = 10
PER_PRINCIPAL = 1_000
CALLS = 50
WORDS = [
    *("release", "migration", "database", "review", "budget", "deploy", "pipeline", "alice"),
    *("bob", "notes", "design", "schema", "cache", "latency", "index", "query", "trio"),
    *("asyncio", "permit", "ledger", "slot", "deadline"),
]


def adapter() -> EmbeddingAdapter:
    try:
        from plugin.memory.wordllama_adapter import WordLlamaAdapter

        return WordLlamaAdapter.load()
    except ImportError:
        return HashingEmbedding()


def text(i: int) -> str:
    return " ".join(WORDS[(i * k) % len(WORDS)] for k in (1, 3, 7, 11, 13)) + f" item {i}"


async def median_us(call: Callable[[], Awaitable[Any]]) -> float:
    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        await call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


async def main() -> None:
    embedding = adapter()
    who = {"principal": "p3", "scope": "proj"}
    query = "Continue the database migration review for alice"
    huge = query + " x" * 500_000
    (vector,) = embedding.embed([query])
    with tempfile.TemporaryDirectory() as folder:
        async with MemoryStore(Path(folder) / "bench.db", embedding=embedding) as store:
            for p in range(PRINCIPALS):
                await store.add_memories(
                    MemoryRecord(
                        id=f"m{i}",
                        text=text(i),
                        principal=f"p{p}",
                        scope="proj",
                        created_at=float(i),
                    )
                    for i in range(PER_PRINCIPAL)
                )
                await store.add_person("Alice", principal=f"p{p}", scope="proj")
            arms: dict[str, Callable[[], Awaitable[Any]]] = {
                "recent (baseline)": lambda: store.recent_candidates(limit=20, **who),
                "sparse": lambda: store.sparse_candidates(query, limit=20, **who),
                "semantic": lambda: store.semantic_candidates(vector, limit=20, **who),
                "people": lambda: store.discover_people(query, **who),
                "sparse, 1 MB query": lambda: store.sparse_candidates(huge, limit=20, **who),
            }
            results = {name: await median_us(call) for name, call in arms.items()}
    base = results["recent (baseline)"]
    print(
        f"memory store: {PRINCIPALS} principals x {PER_PRINCIPAL} memories, "
        f"semantic model {embedding.name}, median of {CALLS} calls (asyncio)"
    )
    for name, us in results.items():
        print(f"  {name:<20} {us:10.0f} us   {us / base:6.2f}x baseline")


if __name__ == "__main__":
    anyio.run(main)
