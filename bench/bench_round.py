"""A full automatic round against the reference store, at each store size.

Run from the repository root::

    python -m bench.bench_round                                   # 1k and 10k per principal
    python -m bench.bench_round --sizes 1000,10000,100000 --keep /tmp/bench-stores

**What is timed.** ``RecallHooks.prepare``, the hook a loop calls before each turn: plan the
task-context query (admission asked), embed it in a worker thread (semantic mode), reserve the
automatic round durably in a SQLite ledger file (``synchronous=FULL``), the base search (People
lookup, sparse arm, semantic arm, recent arm, fusion, render, source recovery), the delta
attempt when People are named, and the render of the context. The hooks are wired from the same
pieces ``open_hooks`` uses, on asyncio, with the system clock.

**Stores.** The scaling stores of ``bench_store`` (its builder, reused; with ``--keep`` the same
files serve both benches): N memories for each of 10 principals, one scope, texts of 8 words from
a per-principal Zipf vocabulary, and **random unit vectors** of 256 dimensions. The query is
embedded by the hashing adapter (``HashingEmbedding.like_wordllama()``, 256 dimensions) under
the stored vectors' model name, so the round pays a real embedding call and the store scores the
whole principal's cell as it would for WordLlama. Because random vectors and hashed queries are
unrelated, the retriever's similarity floor is lowered (``min_similarity=-1``): every semantic
candidate then reaches fusion and rendering, as a model whose neighbours are relevant would
make it, rather than being dropped before them. Working states name 3-4 words each in
objective, next action, two tasks and an open question, drawn from the principal's 500 most
frequent words (so the sparse arm has matches).

**Measured in one run.** Per size: the round in *sparse* mode (no adapter) and in
*sparse+semantic* mode, and, for scale, the store's semantic and sparse arms alone with the same
queries. Every cell is timed one call at a time, all cells interleaved (order rotated) after a
warm-up (the first semantic call builds the cached matrix). p50 and p95 in milliseconds; the
baseline is the same cell on the smallest store (1k per principal unless ``--sizes`` says
otherwise), measured in this run. The only target here is a semantic p50 <= 10 ms at
100k memories per principal (the semantic arm); every other figure is an observation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from itertools import count
from pathlib import Path
from typing import Any

import anyio
import attrs
import numpy as np
import numpy.typing as npt

from plugin.control import AllowancePolicy, RecallAllowance, SqliteLedger, SystemClock
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.pipeline import ContextCaps, MemoryRetriever
from plugin.memory.planning import QueryPlanner, QueryStrategy, compose_task_context
from plugin.memory.preparation import QueryPreparation
from plugin.memory.state import Task, WorkingState
from plugin.memory.store import MemoryStore
from plugin.memory.terms import content_terms
from runtime_hooks.hooks import RecallHooks

from .bench_store import PRINCIPAL, SCOPE, RandomUnit, scale_store, vocabulary_of

SEMANTIC_TARGET_MS = 10.0
TARGET_SIZE = 100_000
WARMUP = 3
CAPS = ContextCaps()


@attrs.frozen
class QueryEmbedding:
    """The hashing adapter, named as the stored random vectors' model (same width)."""

    stored: RandomUnit = attrs.field(factory=lambda: RandomUnit(256))
    inner: HashingEmbedding = attrs.field(factory=HashingEmbedding.like_wordllama)

    def __attrs_post_init__(self) -> None:
        if self.stored.dimensions != self.inner.dimensions:
            raise ValueError("the query adapter must be as wide as the stored vectors")

    @property
    def name(self) -> str:
        return self.stored.name

    @property
    def dimensions(self) -> int:
        return self.inner.dimensions

    @property
    def token_limit(self) -> int:
        return self.inner.token_limit

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return self.inner.embed(texts)


def working_states(count_: int) -> list[WorkingState]:
    """States naming the principal's frequent words, a different draw each."""
    words = vocabulary_of(int(PRINCIPAL[1:]))[:500]
    rng = np.random.default_rng(23)

    def some(n: int) -> str:
        return " ".join(words[int(i)] for i in rng.choice(len(words), size=n, replace=False))

    return [
        WorkingState(
            "Continue",
            objective=some(3),
            next_action=some(4),
            tasks=(Task(some(3), done=True), Task(some(3))),
            open_questions=(some(3) + "?",),
        )
        for _ in range(count_)
    ]


async def admit(_: str) -> bool:
    return True


def hooks_on(allowance: RecallAllowance, store: MemoryStore, semantic: bool) -> RecallHooks:
    """The hooks as ``open_hooks`` wires them, with the similarity floor lowered (see above)."""
    planner = QueryPlanner(QueryStrategy.TASK_CONTEXT, admission=admit)
    return RecallHooks(
        allowance=allowance,
        preparer=QueryPreparation(planner, store.embedding if semantic else None),
        retriever=MemoryRetriever(store, min_similarity=-1.0),
        caps=CAPS,
    )


Call = Callable[[int], Awaitable[Any]]
"""One timed call for the i-th working state."""


def round_call(
    hooks: RecallHooks, states: list[WorkingState], semantic: bool, tag: str
) -> Call:
    runs = count()  # a fresh run for every call: the ledger is shared by every cell

    async def call(i: int) -> None:
        context = await hooks.prepare(states[i], run_id=f"{tag}-{next(runs)}", scope=SCOPE,
                                      principal=PRINCIPAL)
        # The figures must be of a granted, searched round with the arms they claim.
        if not context.slots or context.notice is not None:
            raise RuntimeError(f"the round was not run: {context.notice}")
        withheld = [n for n in context.notes if n.startswith("semantic arm withheld")]
        if semantic and withheld:
            raise RuntimeError(f"the semantic arm did not run: {withheld}")

    return call


def arm_calls(store: MemoryStore, states: list[WorkingState]) -> tuple[Call, Call]:
    texts = [compose_task_context(s, scope=SCOPE, principal=PRINCIPAL).text for s in states]
    vectors = QueryEmbedding().embed(texts)
    sparse_texts = [" ".join(content_terms(text)) for text in texts]

    async def semantic(i: int) -> None:
        await store.semantic_candidates(vectors[i], principal=PRINCIPAL, scope=SCOPE,
                                        limit=CAPS.candidates_per_arm)

    async def sparse(i: int) -> None:
        await store.sparse_candidates(sparse_texts[i], principal=PRINCIPAL, scope=SCOPE,
                                      limit=CAPS.candidates_per_arm)

    return semantic, sparse


CELLS = ("round, sparse", "round, sparse+semantic", "semantic arm alone", "sparse arm alone")


Times = dict[tuple[int, str], list[float]]
"""Milliseconds per call of each (size, cell)."""


async def measure(sizes: Sequence[int], calls: int, folder: Path) -> Times:
    """Time every (size, cell), all cells interleaved."""
    states = working_states(WARMUP + calls)
    paths = {size: await scale_store(folder, size) for size in sizes}
    cells: dict[tuple[int, str], Call] = {}
    with tempfile.TemporaryDirectory(prefix="bench-round-ledger-") as ledger_folder:
        async with AsyncExitStack() as stack:
            ledger = await stack.enter_async_context(
                SqliteLedger(Path(ledger_folder) / "ledger.db", timeout=30.0)
            )
            allowance = RecallAllowance(ledger, policy=AllowancePolicy(), clock=SystemClock())
            for size in sizes:
                store = await stack.enter_async_context(
                    MemoryStore(paths[size], embedding=QueryEmbedding())
                )
                semantic_arm, sparse_arm = arm_calls(store, states)
                for cell, semantic in ((CELLS[0], False), (CELLS[1], True)):
                    hooks = hooks_on(allowance, store, semantic)
                    tag = f"{size}-{'semantic' if semantic else 'sparse'}"
                    cells[(size, cell)] = round_call(hooks, states, semantic, tag)
                cells[(size, CELLS[2])] = semantic_arm
                cells[(size, CELLS[3])] = sparse_arm
            keys = list(cells)
            times: Times = {key: [] for key in keys}
            for i in range(WARMUP + calls):
                shift = i % len(keys)
                for key in keys[shift:] + keys[:shift]:
                    start = time.perf_counter()
                    await cells[key](i)
                    if i >= WARMUP:
                        times[key].append((time.perf_counter() - start) * 1e3)
    return times


def p50_p95(ms: list[float]) -> tuple[float, float]:
    ordered = sorted(ms)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def report(times: Times, sizes: Sequence[int], calls: int) -> None:
    base_size = min(sizes)
    print(f"automatic round (RecallHooks.prepare, task_context, SQLite ledger file) against the "
          f"reference store, {len(sizes)} sizes x 10 principals; stored vectors random unit "
          f"(256 d), query embedded by the hashing adapter; asyncio, Python "
          f"{sys.version.split()[0]}; {calls} calls per cell, all cells interleaved; "
          f"baseline: the same cell at {base_size:,} per principal, this run")
    print(f"  {'per principal':>13}  {'measurement':<24} {'p50':>9} {'p95':>9} "
          f"{'baseline p50':>13} {'ratio':>7}  target")
    for size in sizes:
        for cell in CELLS:
            p50, p95 = p50_p95(times[(size, cell)])
            base, _ = p50_p95(times[(base_size, cell)])
            target = ""
            if cell == "semantic arm alone" and size == TARGET_SIZE:
                verdict = "PASS" if p50 <= SEMANTIC_TARGET_MS else "MISS"
                target = f"p50 <= {SEMANTIC_TARGET_MS:g} ms  {verdict}"
            print(f"  {size:>13,}  {cell:<24} {p50:>6.2f} ms {p95:>6.2f} ms "
                  f"{base:>10.2f} ms {p50 / base:>6.2f}x  {target}")


async def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_round")
    parser.add_argument("--sizes", default="1000,10000",
                        help="memories per principal, comma-separated (100000 takes a 5 GB "
                             "store, ~11 min to build: keep it with --keep)")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--keep", type=Path, help="folder to keep (and reuse) the stores in")
    args = parser.parse_args(list(argv))
    sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    if args.keep is not None:
        os.makedirs(args.keep, exist_ok=True)
        times = await measure(sizes, args.calls, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-round-") as folder:
            times = await measure(sizes, args.calls, Path(folder))
    report(times, sizes, args.calls)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
