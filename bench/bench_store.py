"""Memory-store benchmark: the cost of each arm, and how the candidate arms scale.

Run from the repository root::

    python -m bench.bench_store                              # arms, and scaling at 1k
    python -m bench.bench_store --sizes 1000,10000,100000    # the full scaling table
    python -m bench.bench_store --no-arms --sparse-only --sizes 1000,10000,100000
                                                             # the sparse arm's targets only

**Arms.** Seeds a temporary store with 1,000 memories for each of 10 principals (so every read
filters 90% of the rows away) and times each read method on asyncio. The baseline, measured in
the same run, is ``recent_candidates`` (one indexed SELECT). The semantic arm uses the packaged
WordLlama model when installed (the ``semantic`` extra) and the hashing adapter otherwise.

**Scaling.** For each size N, one store file holds N memories for each of 10 principals, built
directly with ``executemany`` in one transaction (through the store's own schema and triggers),
because embedding a million texts with a real model would take the whole run. Texts are 8
words drawn from a 5,000-word vocabulary with a Zipf law whose word order differs per principal
(so principals have different vocabularies, as real ones do). Vectors are random unit vectors
(not WordLlama, not the hashing adapter), at 64 and at 256 dimensions (WordLlama's size); the
queries are stored vectors plus noise, so each has real near neighbours. Reported per size,
medians over the calls (p95 beside them):

- semantic, *full scan*: today's path before the cache, verbatim: load every visible vector of
  the cell from SQLite, score it with numpy, sort in Python;
- semantic, *cached matrix*: the store's arm now: a per-(principal, scope, model) float32 matrix
  cached in memory, invalidated by a generation the write triggers move; the first (cold) call
  builds it and is reported apart; recall@10 of the cached arm against the full scan;
- semantic, *after an added memory*: another connection adds a memory with its vector, then
  a query (the matrix appends the new rows); *after a changed vector*: another connection
  rewrites a stored vector, then a query (the matrix is rebuilt from SQLite);
- sparse: the store's arm (one term index for every cell, bm25 with the cell's own statistics),
  and overlap@10 between its ranking and a bm25 computed independently over the principal's
  rows alone (a fresh FTS5 table of just them, same tokenizer); beside it, in the same run, the
  version-1 layout (one table-wide index over every principal's rows, no stemming, rebuilt
  from the same rows in a side file) with the same two figures;
- the store's size on disk per memory (file and write-ahead log).

**Cells.** ``--cells 10,1000,100000`` runs :mod:`bench.bench_cells`: what the number of
(principal, scope) cells costs, each operation against its figure at the smallest C of the
same run.

The sparse arm runs ``--sparse-calls`` queries (200), each on every size in turn, so a load
spike on this shared machine hits all sizes alike. The sparse targets, checked at the end when
the sizes include them: at 10,000 memories per principal the arm costs at most 2.5x its 1,000
figure (p50s of this run), its overlap@10 is at
least 0.95 at every size, and its p50 at 100,000 is at most 10 ms. ``--sparse-only`` builds the
stores without vectors (a 100,000-per-principal store then takes a minute or two, not ten) and
skips the semantic rows.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import numpy as np
import numpy.typing as npt

from bench.bench_cells import cells
from plugin.control._sqlite import Connection, connect
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.fts import TOKENIZER, fts5_match_expression
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.store import MemoryRecord, MemoryStore
from plugin.memory.store.schema import index_logged

PRINCIPALS = 10
PER_PRINCIPAL = 1_000
CALLS = 50
WORDS = [
    *("release", "migration", "database", "review", "budget", "deploy", "pipeline", "alice"),
    *("bob", "notes", "design", "schema", "cache", "latency", "index", "query", "trio"),
    *("asyncio", "permit", "ledger", "slot", "deadline"),
]
SCALE_DIMENSIONS = (64, 256)
VOCABULARY = 5_000
WORDS_PER_TEXT = 8
PRINCIPAL = "p3"
SCOPE = "proj"


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


async def arms() -> None:
    embedding = adapter()
    who = {"principal": PRINCIPAL, "scope": SCOPE}
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
                        scope=SCOPE,
                        created_at=float(i),
                    )
                    for i in range(PER_PRINCIPAL)
                )
                await store.add_person("Alice", principal=f"p{p}", scope=SCOPE)
            calls: dict[str, Callable[[], Awaitable[Any]]] = {
                "recent (baseline)": lambda: store.recent_candidates(limit=20, **who),
                "sparse": lambda: store.sparse_candidates(query, limit=20, **who),
                "semantic": lambda: store.semantic_candidates(vector, limit=20, **who),
                "people": lambda: store.discover_people(query, **who),
                "sparse, 1 MB query": lambda: store.sparse_candidates(huge, limit=20, **who),
            }
            results = {name: await median_us(call) for name, call in calls.items()}
    base = results["recent (baseline)"]
    print(
        f"memory store: {PRINCIPALS} principals x {PER_PRINCIPAL} memories, "
        f"semantic model {embedding.name}, median of {CALLS} calls (asyncio)"
    )
    for name, us in results.items():
        print(f"  {name:<20} {us:10.0f} us   {us / base:6.2f}x baseline")


# -- scaling ------------------------------------------------------------------------------------


@attrs.frozen
class RandomUnit:
    """An adapter that only names a model and its width: the bench stores vectors directly."""

    dimensions: int
    token_limit: int = 256

    @property
    def name(self) -> str:
        return f"random-unit-{self.dimensions}"

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        raise NotImplementedError("the bench stores its vectors directly")


def unit_rows(rng: np.random.Generator, count: int, dimensions: int) -> npt.NDArray[np.float32]:
    rows = rng.standard_normal((count, dimensions), dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


def vocabulary_of(principal: int) -> list[str]:
    """The words in this principal's order of frequency (a Zipf law over the permutation)."""
    order = np.random.default_rng(1000 + principal).permutation(VOCABULARY)
    return [f"w{int(i)}" for i in order]


def zipf_texts(rng: np.random.Generator, words: list[str], count: int) -> list[str]:
    ranks = np.arange(1, VOCABULARY + 1, dtype=np.float64)
    weights = 1.0 / ranks
    weights /= weights.sum()
    picks = rng.choice(VOCABULARY, size=(count, WORDS_PER_TEXT), p=weights)
    return [" ".join(words[int(j)] for j in row) for row in picks]


async def build(path: Path, per_principal: int, *, vectors: bool = True) -> None:
    """A store of ``per_principal`` memories for each of 10 principals, two vector models
    unless ``vectors`` is false; every cell's full-text index replayed from the store's log."""
    partial = path.with_name(path.name + ".partial")  # renamed once complete: --keep reuses it
    for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
        leftover.unlink(missing_ok=True)
    async with MemoryStore(partial):  # the store's schema, triggers included
        pass
    rng = np.random.default_rng(per_principal)
    conn = sqlite3.connect(partial, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for p in range(PRINCIPALS):
            texts = zipf_texts(rng, vocabulary_of(p), per_principal)
            first = p * per_principal + 1
            conn.executemany(
                "INSERT INTO memories (seq, principal, scope, id, text, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    (first + i, f"p{p}", SCOPE, f"m{i}", texts[i], float(i))
                    for i in range(per_principal)
                ),
            )
            for dimensions in SCALE_DIMENSIONS if vectors else ():
                model = RandomUnit(dimensions).name
                rows = unit_rows(rng, per_principal, dimensions).astype("<f4")
                conn.executemany(
                    "INSERT INTO embeddings (memory_seq, model, vector) VALUES (?, ?, ?)",
                    ((first + i, model, rows[i].tobytes()) for i in range(per_principal)),
                )
        index_logged(conn)  # what the store's own writes do in their transaction
        conn.execute("COMMIT")
    finally:
        conn.close()
    partial.rename(path)


async def full_scan(
    conn: Connection, vector: npt.NDArray[np.float32], model: RandomUnit, limit: int
) -> list[str]:
    """Today's semantic arm before the cache, verbatim: load every vector, score, sort."""
    rows = await conn.fetchall(
        "SELECT m.id, m.text, m.principal, m.scope, m.created_at, m.cites, e.vector "
        "FROM memories AS m JOIN embeddings AS e ON e.memory_seq = m.seq "
        "WHERE m.principal = ? AND m.scope = ? AND e.model = ?",
        (PRINCIPAL, SCOPE, model.name),
    )
    width = model.dimensions * 4
    rows = [row for row in rows if isinstance(row[6], bytes) and len(row[6]) == width]
    matrix = np.frombuffer(b"".join(row[6] for row in rows), dtype="<f4").reshape(
        len(rows), model.dimensions
    )
    scores = matrix @ vector
    order = sorted(range(len(rows)), key=lambda i: (-float(scores[i]), rows[i][0]))
    return [rows[i][0] for i in order[:limit]]


def stats(times: list[float]) -> str:
    ordered = sorted(times)
    p50 = statistics.median(ordered) * 1e3
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1e3
    return f"{p50:8.2f} ms (p95 {p95:7.2f})"


async def timed(call: Callable[[], Awaitable[Any]], calls: int) -> tuple[list[float], list[Any]]:
    times, results = [], []
    for _ in range(calls):
        start = time.perf_counter()
        results.append(await call())
        times.append(time.perf_counter() - start)
    return times, results


async def semantic_scale(path: Path, per_principal: int, calls: int) -> None:
    rng = np.random.default_rng(7)
    conn = await connect(path, timeout=30.0)
    await conn.fetchall("PRAGMA foreign_keys=ON")  # as the store's own connection has it
    try:
        for dimensions in SCALE_DIMENSIONS:
            model = RandomUnit(dimensions)
            async with MemoryStore(path, embedding=model) as store:
                seqs = await conn.fetchall(
                    "SELECT e.vector FROM embeddings AS e JOIN memories AS m "
                    "ON m.seq = e.memory_seq WHERE m.principal = ? AND e.model = ? "
                    "ORDER BY m.seq LIMIT ?",
                    (PRINCIPAL, model.name, calls),
                )
                stored = np.frombuffer(b"".join(row[0] for row in seqs), dtype="<f4")
                noise = unit_rows(rng, calls, dimensions) * 0.5
                queries = stored.reshape(calls, dimensions) + noise
                queries /= np.linalg.norm(queries, axis=1, keepdims=True)
                queries = queries.astype(np.float32)

                async def semantic(
                    vector: npt.NDArray[np.float32], store: MemoryStore = store
                ) -> list[str]:
                    found = await store.semantic_candidates(
                        vector, principal=PRINCIPAL, scope=SCOPE, limit=10
                    )
                    return [e.id for e in found]

                cold_start = time.perf_counter()
                await semantic(queries[0])
                cold = time.perf_counter() - cold_start
                cached_times, cached = [], []
                for q in queries:
                    start = time.perf_counter()
                    cached.append(await semantic(q))
                    cached_times.append(time.perf_counter() - start)
                scan_calls = max(5, calls // 5) if per_principal >= 100_000 else calls
                scan_times, scanned = [], []
                for q in queries[:scan_calls]:
                    start = time.perf_counter()
                    scanned.append(await full_scan(conn, q, model, 10))
                    scan_times.append(time.perf_counter() - start)
                hits = sum(
                    len(set(got) & set(want)) for got, want in zip(cached, scanned, strict=False)
                )
                recall = hits / (10 * len(scanned))
                appended, rebuilt = [], []
                # Kept, not deleted afterwards: SQLite would hand a deleted top seq out again,
                # and a vector at a reused seq is (rightly) a rebuild, not an append.
                run = time.time_ns()
                for i in range(max(3, calls // 10)):
                    # Another connection adds a memory with its vector: the matrix appends it.
                    await conn.fetchall("BEGIN IMMEDIATE")
                    await conn.fetchall(
                        "INSERT INTO memories (principal, scope, id, text, created_at) "
                        "VALUES (?, ?, ?, 'bench write', 0)",
                        (PRINCIPAL, SCOPE, f"bench-write-{run}-{i}"),
                    )
                    await conn.fetchall(
                        "INSERT INTO embeddings (memory_seq, model, vector) SELECT seq, ?, ? "
                        "FROM memories WHERE principal = ? AND scope = ? AND id = ?",
                        (
                            model.name,
                            unit_rows(rng, 1, dimensions).astype("<f4").tobytes(),
                            PRINCIPAL,
                            SCOPE,
                            f"bench-write-{run}-{i}",
                        ),
                    )
                    await conn.fetchall("COMMIT")
                    start = time.perf_counter()
                    await semantic(queries[i])
                    appended.append(time.perf_counter() - start)
                for i in range(max(3, calls // 10)):
                    # Another connection changes a stored vector: the matrix is rebuilt.
                    await conn.fetchall("BEGIN IMMEDIATE")
                    await conn.fetchall(
                        "UPDATE embeddings SET vector = vector WHERE model = ? AND memory_seq = "
                        "(SELECT seq FROM memories WHERE principal = ? AND id = ?)",
                        (model.name, PRINCIPAL, f"m{i}"),
                    )
                    await conn.fetchall("COMMIT")
                    start = time.perf_counter()
                    await semantic(queries[i])
                    rebuilt.append(time.perf_counter() - start)
            print(f"  semantic d={dimensions:<3} full scan (today)    {stats(scan_times)}")
            print(
                f"  semantic d={dimensions:<3} cached matrix        {stats(cached_times)}"
                f"   cold {cold * 1e3:7.1f} ms   recall@10 vs full scan {recall:.3f}"
            )
            print(f"  semantic d={dimensions:<3} after an added memory{stats(appended)}")
            print(f"  semantic d={dimensions:<3} after a changed vector{stats(rebuilt)}")
    finally:
        await conn.close()


@attrs.frozen
class SparseFigures:
    """The sparse arm at one size: p50 and p95 in ms, overlap@10 with a per-principal bm25."""

    p50: float
    p95: float
    overlap: float


def percentiles(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return (
        statistics.median(ordered) * 1e3,
        ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1e3,
    )


def per_principal_bm25(path: Path, queries: list[str], tokenizer: str) -> list[list[str]]:
    """The top 10 of each query by a bm25 over the principal's rows alone (a fresh table)."""
    own = sqlite3.connect(":memory:")
    source = sqlite3.connect(path)
    try:
        own.execute(f"CREATE VIRTUAL TABLE t USING fts5(text, tokenize = '{tokenizer}')")
        own.executemany(
            "INSERT INTO t (rowid, text) VALUES (?, ?)",
            source.execute(
                "SELECT seq, text FROM memories WHERE principal = ? AND scope = ? ORDER BY seq",
                (PRINCIPAL, SCOPE),
            ),
        )
        id_of = dict(
            source.execute(
                "SELECT seq, id FROM memories WHERE principal = ? AND scope = ?",
                (PRINCIPAL, SCOPE),
            ).fetchall()
        )
        return [
            [
                id_of[row[0]]
                for row in own.execute(
                    "SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank, rowid LIMIT 10",
                    (fts5_match_expression(query),),
                )
            ]
            for query in queries
        ]
    finally:
        own.close()
        source.close()


def overlap_at_10(ranked: list[list[str]], reference: list[list[str]]) -> float:
    shares = [
        len(set(got) & set(want)) / len(want)
        for got, want in zip(ranked, reference, strict=True)
        if want
    ]
    return statistics.mean(shares)


V1_LAYOUT = """
CREATE TABLE memories (seq INTEGER PRIMARY KEY, principal TEXT, scope TEXT, id TEXT, text TEXT);
CREATE VIRTUAL TABLE memories_fts USING fts5(
    text, content = 'memories', content_rowid = 'seq',
    tokenize = 'unicode61 remove_diacritics 2'
);
"""


def v1_layout(path: Path) -> Path:
    """A side file with the version-1 sparse layout over the same rows (built once)."""
    side = path.with_name(path.stem + "-v1-layout.db")
    if side.exists():
        return side
    partial = side.with_name(side.name + ".partial")
    partial.unlink(missing_ok=True)
    conn = sqlite3.connect(partial, isolation_level=None)
    try:
        conn.executescript(V1_LAYOUT)
        conn.execute("ATTACH DATABASE ? AS store", (str(path),))
        conn.execute("BEGIN")
        conn.execute(
            "INSERT INTO memories SELECT seq, principal, scope, id, text FROM store.memories"
        )
        conn.execute("INSERT INTO memories_fts (memories_fts) VALUES ('rebuild')")
        conn.execute("COMMIT")
    finally:
        conn.close()
    partial.rename(side)
    return side


async def v1_sparse(path: Path, queries: list[str]) -> tuple[list[float], list[list[str]]]:
    """The version-1 sparse query, verbatim, over the version-1 layout of the same rows."""
    conn = await connect(v1_layout(path), timeout=30.0)
    try:
        it = iter(queries)

        async def query() -> list[str]:
            rows = await conn.fetchall(
                "SELECT m.id, memories_fts.rank "
                "FROM memories_fts JOIN memories AS m ON m.seq = memories_fts.rowid "
                "WHERE memories_fts MATCH ? AND m.principal = ? AND m.scope = ? "
                "ORDER BY memories_fts.rank, m.seq LIMIT ?",
                (fts5_match_expression(next(it)), PRINCIPAL, SCOPE, 10),
            )
            return [row[0] for row in rows]

        return await timed(query, len(queries))
    finally:
        await conn.close()


def sparse_queries(calls: int) -> list[str]:
    """3 words from the measured principal's own top 500, as a working state names them."""
    words = vocabulary_of(3)
    rng = np.random.default_rng(11)
    return [" ".join(words[int(j)] for j in rng.choice(500, size=3)) for _ in range(calls)]


async def sparse_timings(
    paths: dict[int, Path], queries: list[str]
) -> dict[int, tuple[list[float], list[list[str]]]]:
    """Each query on every size in turn (interleaved: load drifts hit all sizes alike)."""
    results: dict[int, tuple[list[float], list[list[str]]]] = {
        size: ([], []) for size in paths
    }
    async with contextlib.AsyncExitStack() as stack:
        stores = {
            size: await stack.enter_async_context(MemoryStore(path))
            for size, path in paths.items()
        }
        for store in stores.values():  # warm: connection, schema, first pages
            await store.sparse_candidates(queries[0], principal=PRINCIPAL, scope=SCOPE, limit=10)
        for query in queries:
            for size, store in stores.items():
                start = time.perf_counter()
                found = await store.sparse_candidates(
                    query, principal=PRINCIPAL, scope=SCOPE, limit=10
                )
                results[size][0].append(time.perf_counter() - start)
                results[size][1].append([e.id for e in found])
    return results


async def sparse_report(
    path: Path, queries: list[str], times: list[float], ranked: list[list[str]]
) -> SparseFigures:
    """Print the store's sparse figures at one size, and the version-1 layout's beside them."""
    old_times, old_ranked = await v1_sparse(path, queries)
    now = SparseFigures(
        *percentiles(times), overlap_at_10(ranked, per_principal_bm25(path, queries, TOKENIZER))
    )
    old = SparseFigures(
        *percentiles(old_times),
        overlap_at_10(
            old_ranked, per_principal_bm25(path, queries, "unicode61 remove_diacritics 2")
        ),
    )
    for name, figures in (("sparse, one term index", now), ("sparse, v1 table-wide", old)):
        print(
            f"  {name:<26} {figures.p50:8.2f} ms (p95 {figures.p95:7.2f})"
            f"   overlap@10 with per-principal bm25 {figures.overlap:.3f}"
        )
    return now


async def scale_store(folder: Path, size: int, *, vectors: bool = True) -> Path:
    """The scaling store of ``size`` memories per principal in ``folder``: built unless there.

    Shared with ``bench_round`` (the same file name), so one ``--keep`` folder serves both.
    """
    path = folder / (f"scale-{size}.db" if vectors else f"scale-{size}-sparse.db")
    if not path.exists():
        start = time.perf_counter()
        await build(path, size, vectors=vectors)
        print(
            f"N = {size:,} per principal ({size * PRINCIPALS:,} rows; "
            f"built in {time.perf_counter() - start:.0f} s, "
            f"{path.stat().st_size / 2**20:.0f} MiB)"
        )
    else:
        print(f"N = {size:,} per principal ({size * PRINCIPALS:,} rows; reused {path})")
    print(f"  store size: {file_bytes(path) / (size * PRINCIPALS):,.0f} bytes per memory "
          f"({'with' if vectors else 'without'} vectors)")
    return path


async def scaling(
    sizes: Sequence[int], calls: int, folder: Path, *, vectors: bool, sparse_calls: int
) -> None:
    print(
        f"\nscaling: {PRINCIPALS} principals x N memories, one scope; random unit vectors; "
        f"{calls} calls per row, medians (p95); limit 10; asyncio; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    paths: dict[int, Path] = {}
    for size in sizes:
        paths[size] = await scale_store(folder, size, vectors=vectors)
        if vectors:
            await semantic_scale(paths[size], size, calls)
    queries = sparse_queries(sparse_calls)
    timings = await sparse_timings(paths, queries)
    sparse: dict[int, SparseFigures] = {}
    print(f"sparse arm: {sparse_calls} queries, each on every size in turn; medians (p95)")
    for size, path in paths.items():
        print(f"N = {size:,} per principal")
        sparse[size] = await sparse_report(path, queries, *timings[size])
    print(f"sparse targets (this run; load average {os.getloadavg()[0]:.1f}):")
    if 1_000 in sparse and 10_000 in sparse:
        ratio = sparse[10_000].p50 / sparse[1_000].p50
        print(f"  p50 at 10,000 / p50 at 1,000   {ratio:6.2f}x   (target <= 2.5x)")
    worst = min(figures.overlap for figures in sparse.values())
    print(f"  overlap@10, lowest of the sizes {worst:6.3f}    (target >= 0.95)")
    if 100_000 in sparse:
        print(f"  p50 at 100,000                 {sparse[100_000].p50:6.2f} ms (target <= 10 ms)")


def file_bytes(path: Path) -> int:
    """The store's size on disk: the file and its write-ahead log."""
    return sum(
        candidate.stat().st_size
        for candidate in (path, Path(f"{path}-wal"))
        if candidate.exists()
    )


async def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_store")
    parser.add_argument("--sizes", default="1000", help="memories per principal, comma-separated")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--keep", type=Path, help="folder to keep (and reuse) the stores in")
    parser.add_argument("--no-arms", action="store_true", help="only the scaling table")
    parser.add_argument(
        "--sparse-only", action="store_true", help="stores without vectors, no semantic rows"
    )
    parser.add_argument("--cells", default="", help="cell counts to measure, comma-separated")
    parser.add_argument("--sparse-calls", type=int, default=200, help="sparse queries per size")
    args = parser.parse_args(list(argv))
    if not args.no_arms:
        await arms()
    if args.cells:
        await cells([int(c) for c in args.cells.split(",") if c])
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes:
        return
    if args.keep is not None:
        os.makedirs(args.keep, exist_ok=True)
        await scaling(
            sizes,
            args.calls,
            args.keep,
            vectors=not args.sparse_only,
            sparse_calls=args.sparse_calls,
        )
        return
    with tempfile.TemporaryDirectory() as folder:
        await scaling(
            sizes,
            args.calls,
            Path(folder),
            vectors=not args.sparse_only,
            sparse_calls=args.sparse_calls,
        )


if __name__ == "__main__":
    import sys

    anyio.run(main, sys.argv[1:])
