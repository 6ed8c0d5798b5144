"""The semantic arm's word-level match: what it costs beside the cosine alone.

``python -m bench words`` (or ``python -m bench.bench_words --sizes 500,2000,4000``). For each
size N, a store holds N memories of one cell (12 words each, drawn from a 5,000-word vocabulary
with a Zipf law, so the cell's vocabulary grows with N as a real one does), embedded with the
packaged WordLlama model (the hashing adapter, which has no word-level match, when the
``semantic`` extra is missing: the module then says so and stops). One query of five fragments
(about 30 words) is searched 200 times each way, alternately: the cosine alone
(``words=None``) and cosine mixed with the word match (the default share). Reported: the
median and p95 of each in milliseconds, their ratio, and, apart, the first call with the word
match (it builds the cell's word index: its texts read back and its vocabulary embedded), and
the median of 20 searches each right after a memory was written (the index is rebuilt; the
words seen before are not embedded again). Then, over ``--cells`` cells of 3 memories each
searched once in turn (each search builds and keeps that cell's word index), the median search
of cells 11 to 210 (past the first words embedded) and of the last 200, and their ratio:
keeping one more cell's index must not cost more when many are kept (a ratio near 1).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np

from plugin.control.clock import ManualClock
from plugin.memory import wordllama_adapter
from plugin.memory.store import MemoryStore, MemoryWrite, WordQuery

CELL = {"principal": "bench", "scope": "words"}
ROUNDS = 200
FRAGMENTS = (
    ("Write the retry and alerting settings for the nightly export job", 1.0),
    ("Is the upload safe to retry after a partial transfer", 2.0),
    ("Exports must land before six in the morning", 1.0),
    ("Marta Kowal", 2.0),
    ("Move the invoice exports from cron to the scheduler", 0.6),
)


def _texts(count: int, seed: int = 7) -> list[str]:
    rng = np.random.default_rng(seed)
    vocabulary = [f"w{i}x" for i in range(5_000)]
    ranks = np.minimum(rng.zipf(1.3, size=(count, 12)) - 1, len(vocabulary) - 1)
    return [" ".join(vocabulary[r] for r in row) for row in ranks]


def _ms(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[int(0.95 * (len(ordered) - 1))] * 1e3


async def _size(count: int, folder: Path) -> None:
    adapter = wordllama_adapter.WordLlamaAdapter.load()
    async with MemoryStore(folder / f"w{count}.db", embedding=adapter,
                           clock=ManualClock(wall=1_000.0)) as store:
        await store.remember_many(MemoryWrite(text=text, **CELL) for text in _texts(count))
        vector = adapter.embed([" ".join(text for text, _ in FRAGMENTS)])[0]
        words = WordQuery(FRAGMENTS, 0.5)
        await store.semantic_candidates(vector, limit=40, **CELL)  # the cached matrix
        started = time.perf_counter()
        await store.semantic_candidates(vector, limit=40, words=words, **CELL)
        first = (time.perf_counter() - started) * 1e3
        alone: list[float] = []
        mixed: list[float] = []
        for _ in range(ROUNDS):
            for samples, asked in ((alone, None), (mixed, words)):
                started = time.perf_counter()
                await store.semantic_candidates(vector, limit=40, words=asked, **CELL)
                samples.append(time.perf_counter() - started)
        written: list[float] = []
        for i in range(20):  # a memory written, then a search: the index is rebuilt
            await store.remember(_texts(1, seed=1_000 + i)[0], **CELL)
            started = time.perf_counter()
            await store.semantic_candidates(vector, limit=40, words=words, **CELL)
            written.append(time.perf_counter() - started)
        (alone_p50, alone_p95), (mixed_p50, mixed_p95) = _ms(alone), _ms(mixed)
        print(f"   {count:>6} memories  cosine {alone_p50:6.2f} ms (p95 {alone_p95:6.2f})   "
              f"with words {mixed_p50:6.2f} ms (p95 {mixed_p95:6.2f})   "
              f"ratio {mixed_p50 / alone_p50:5.2f}x   first with words {first:7.1f} ms   "
              f"after a write {_ms(written)[0]:6.1f} ms")


async def _cells(cells: int, folder: Path) -> None:
    adapter = wordllama_adapter.WordLlamaAdapter.load()
    who = [{"principal": f"p{c}", "scope": "words"} for c in range(cells)]
    texts = _texts(3 * cells)
    async with MemoryStore(folder / "cells.db", embedding=adapter,
                           clock=ManualClock(wall=1_000.0)) as store:
        await store.remember_many(MemoryWrite(text=text, **who[i // 3])
                                  for i, text in enumerate(texts))
        vector = adapter.embed([" ".join(text for text, _ in FRAGMENTS)])[0]
        words = WordQuery(FRAGMENTS, 0.5)
        samples: list[float] = []
        for cell in who:
            started = time.perf_counter()
            await store.semantic_candidates(vector, limit=40, words=words, **cell)
            samples.append(time.perf_counter() - started)
    first, last = _ms(samples[10:210])[0], _ms(samples[-200:])[0]
    print(f"   {cells:>6} cells searched in turn  cells 11-210 {first:6.2f} ms   "
          f"last 200 {last:6.2f} ms   ratio {last / first:5.2f}x")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="500,2000,4000")
    parser.add_argument("--cells", type=int, default=5_000)
    arguments = parser.parse_args()
    sizes = [int(size) for size in arguments.sizes.split(",")]
    if not wordllama_adapter.available():
        print("   (the semantic extra is not installed: no word-level match to measure)")
        return
    print(f"   one semantic search, median of {ROUNDS}, alternating (cosine alone, with words)")
    with tempfile.TemporaryDirectory() as folder:
        for count in sizes:
            await _size(count, Path(folder))
        await _cells(arguments.cells, Path(folder))


if __name__ == "__main__":
    anyio.run(main)
