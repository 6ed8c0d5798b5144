"""Control-core benchmarks: slots, attempts and durable reservations, against baselines.

Run from the repository root: ``python -m bench.bench_control`` (or ``python -m bench``).
Every figure is the median over several batches of the per-operation time (each batch: many
operations timed with :func:`time.perf_counter_ns`, after a warm-up), and every ratio divides
two medians measured in this same run, batches of the two sides interleaved. Reservations
(about 0.3 ms, dominated by fsync, whose cost drifts) are timed one by one instead, the two
sides alternating operation by operation:

- taking a slot (``permit._take``) vs a bare ``threading.Lock`` + counter check (target <= 3x),
  and vs ``anyio.CapacityLimiter`` ``acquire_nowait``/``release`` (target: faster);
- one ``async with permit.attempt(): pass`` (slot, cancel scope, trace buffered in memory),
  target <= 15 us median on asyncio; shown beside a bare ``CancelScope`` for scale;
- one durable round reservation (``SqliteLedger.reserve`` on a file, a fresh run each time) vs
  the raw transaction through the same thread hop (``BEGIN IMMEDIATE``; ``UPDATE … RETURNING``;
  ``COMMIT`` in WAL with ``synchronous=FULL``: aiosqlite on asyncio, ``sqlite3`` with
  ``anyio.to_thread.run_sync`` and a ``CapacityLimiter(1)`` on trio), target <= 1.5x.
"""

from __future__ import annotations

import gc
import itertools
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import anyio.to_thread
import attrs
import sniffio

from plugin.control import (
    AllowancePolicy,
    AttemptKind,
    RecallAllowance,
    RoundKind,
    SqliteLedger,
    SystemClock,
)
from plugin.control.policy import MAX_COUNT

HUGE = MAX_COUNT
"""Slots and rounds enough never to run out while benchmarking."""
ROOMY = AllowancePolicy(max_searches=HUGE, max_rounds=HUGE, deadline_s=1e6)

SLOT_OPS, SLOT_BATCHES = 20_000, 25
ATTEMPT_OPS, ATTEMPT_BATCHES = 2_000, 21
RESERVE_OPS, RESERVE_WARMUP = 1500, 50
WARMUP = 2

BACKENDS = ("asyncio", "trio")


@attrs.frozen
class Row:
    name: str
    ns: float
    baseline: str = ""
    baseline_ns: float | None = None
    target: str = ""
    ok: bool | None = None

    def render(self) -> str:
        ratio = "" if self.baseline_ns is None else f"{self.ns / self.baseline_ns:7.2f}x"
        base = "" if self.baseline_ns is None else f"{self.baseline} {_fmt(self.baseline_ns)}"
        verdict = "" if self.ok is None else ("PASS" if self.ok else "MISS")
        return (
            f"  {self.name:<40} {_fmt(self.ns):>10}  {base:<36} {ratio:>8}  "
            f"{self.target:<9} {verdict}"
        )


def _fmt(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.0f} ns"


# -- timing ----------------------------------------------------------------------------------

SyncBatch = Callable[[int], int]
"""Run n operations; return the ns they took (setup outside the timed region)."""
AsyncBatch = Callable[[int], Awaitable[int]]


def _timed(batch: SyncBatch, n: int) -> float:
    gc.collect()
    gc.disable()
    try:
        return batch(n) / n
    finally:
        gc.enable()


async def _atimed(batch: AsyncBatch, n: int) -> float:
    gc.collect()
    gc.disable()
    try:
        return await batch(n) / n
    finally:
        gc.enable()


def compare(sides: dict[str, SyncBatch], n: int, batches: int) -> dict[str, float]:
    """Median ns per operation of each side, batches interleaved (order rotated)."""
    names = list(sides)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(WARMUP + batches):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            ns = _timed(sides[name], n)
            if i >= WARMUP:
                samples[name].append(ns)
    return {name: statistics.median(s) for name, s in samples.items()}


async def acompare(sides: dict[str, AsyncBatch], n: int, batches: int) -> dict[str, float]:
    names = list(sides)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(WARMUP + batches):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            ns = await _atimed(sides[name], n)
            if i >= WARMUP:
                samples[name].append(ns)
    return {name: statistics.median(s) for name, s in samples.items()}


# -- taking a slot ---------------------------------------------------------------------------


def _lock_counter(limit: int) -> Callable[[], int]:
    lock = threading.Lock()
    taken = 0

    def take() -> int:
        nonlocal taken
        with lock:
            if taken >= limit:
                raise RuntimeError("no slot left")
            taken += 1
            return taken

    return take


async def bench_slots(folder: Path) -> list[Row]:
    backend = _library()
    async with SqliteLedger(folder / f"slots-{backend}.sqlite3") as ledger:
        enforced = RecallAllowance(ledger, policy=ROOMY, clock=SystemClock())
        legacy = RecallAllowance.legacy(ledger, clock=SystemClock())
        async with enforced.round("slots", RoundKind.DELIBERATE, slots=HUGE) as permit, \
                legacy.round("slots-legacy", RoundKind.DELIBERATE, slots=1) as unbounded:
            kind = AttemptKind.DELIBERATE
            take, take_legacy = permit._take, unbounded._take
            baseline = _lock_counter(HUGE)
            limiter = anyio.CapacityLimiter(1)
            acquire, release = limiter.acquire_nowait, limiter.release

            def permit_batch(n: int) -> int:
                start = time.perf_counter_ns()
                for _ in itertools.repeat(None, n):
                    take(kind)
                return time.perf_counter_ns() - start

            def legacy_batch(n: int) -> int:
                start = time.perf_counter_ns()
                for _ in itertools.repeat(None, n):
                    take_legacy(kind)
                return time.perf_counter_ns() - start

            def lock_batch(n: int) -> int:
                start = time.perf_counter_ns()
                for _ in itertools.repeat(None, n):
                    baseline()
                return time.perf_counter_ns() - start

            def limiter_batch(n: int) -> int:
                start = time.perf_counter_ns()
                for _ in itertools.repeat(None, n):
                    acquire()
                    release()
                return time.perf_counter_ns() - start

            m = compare(
                {"permit": permit_batch, "legacy": legacy_batch, "lock": lock_batch,
                 "limiter": limiter_batch},
                SLOT_OPS, SLOT_BATCHES,
            )
    return [
        Row(f"take a slot ({backend})", m["permit"], "Lock+counter", m["lock"], "<= 3x",
            m["permit"] <= 3 * m["lock"]),
        Row(f"take a slot ({backend})", m["permit"], "CapacityLimiter", m["limiter"],
            "< 1x", m["permit"] < m["limiter"]),
        Row(f"take a slot, legacy permit ({backend})", m["legacy"], "Lock+counter", m["lock"]),
    ]


def _library() -> str:
    return sniffio.current_async_library()


# -- one attempt -----------------------------------------------------------------------------


async def bench_attempt(folder: Path) -> list[Row]:
    backend = _library()
    async with SqliteLedger(folder / f"attempts-{backend}.sqlite3") as ledger:
        allowance = RecallAllowance(ledger, policy=ROOMY, clock=SystemClock())

        async def attempt_batch(n: int) -> int:
            # A fresh permit per batch, so that the buffered traces never pile up; reserving
            # it and writing its traces when the round ends are outside the timed region.
            async with allowance.round("attempts", RoundKind.DELIBERATE, slots=n) as permit:
                attempt = permit.attempt
                start = time.perf_counter_ns()
                for _ in itertools.repeat(None, n):
                    async with attempt():
                        pass
                return time.perf_counter_ns() - start

        async def scope_batch(n: int) -> int:
            current_time = anyio.current_time
            start = time.perf_counter_ns()
            for _ in itertools.repeat(None, n):
                with anyio.CancelScope(deadline=current_time() + 1e6):
                    pass
            return time.perf_counter_ns() - start

        m = await acompare(
            {"attempt": attempt_batch, "scope": scope_batch}, ATTEMPT_OPS, ATTEMPT_BATCHES
        )
    target = 15_000.0
    return [
        Row(f"attempt, no I/O ({backend})", m["attempt"], "bare CancelScope", m["scope"],
            "<= 15 us" if backend == "asyncio" else "", m["attempt"] <= target
            if backend == "asyncio" else None),
    ]


# -- one durable reservation -----------------------------------------------------------------

_RAW = (
    "BEGIN IMMEDIATE",
    "UPDATE t SET n = n + 1 WHERE id = 1 RETURNING n",
    "COMMIT",
)
_RAW_SETUP = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO t VALUES (1, 0)",
)


async def _raw_asyncio(path: Path) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Any]]:
    conn = await aiosqlite.connect(path, isolation_level=None)
    for sql in _RAW_SETUP:
        await conn.execute(sql)

    async def once() -> None:
        await conn.execute(_RAW[0])
        await conn.execute_fetchall(_RAW[1])
        await conn.execute(_RAW[2])

    return once, conn.close


async def _raw_trio(path: Path) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Any]]:
    limiter = anyio.CapacityLimiter(1)
    conn = await anyio.to_thread.run_sync(
        lambda: sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    )
    for sql in _RAW_SETUP:
        await anyio.to_thread.run_sync(conn.execute, sql, limiter=limiter)

    def run(sql: str) -> list[Any]:
        return conn.execute(sql).fetchall()

    async def once() -> None:
        for sql in _RAW:
            await anyio.to_thread.run_sync(run, sql, limiter=limiter)

    async def close() -> None:
        await anyio.to_thread.run_sync(conn.close, limiter=limiter)

    return once, close


async def alternate(
    sides: dict[str, Callable[[], Awaitable[Any]]], n: int, warmup: int
) -> dict[str, float]:
    """Median ns of single operations, the sides alternating one operation at a time.

    For I/O-bound operations whose cost drifts (fsync), so that both sides see the same
    conditions; each operation is long enough to time on its own.
    """
    names = list(sides)
    samples: dict[str, list[int]] = {name: [] for name in names}
    gc.collect()
    gc.disable()
    try:
        for i in range(warmup + n):
            for name in names[i % 2:] + names[:i % 2]:
                op = sides[name]
                start = time.perf_counter_ns()
                await op()
                elapsed = time.perf_counter_ns() - start
                if i >= warmup:
                    samples[name].append(elapsed)
    finally:
        gc.enable()
    return {name: float(statistics.median(s)) for name, s in samples.items()}


async def bench_reserve(folder: Path) -> list[Row]:
    backend = _library()
    raw_once, raw_close = await (_raw_asyncio if backend == "asyncio" else _raw_trio)(
        folder / f"raw-{backend}.sqlite3"
    )
    fresh = (f"run-{i}" for i in itertools.count())
    policy = AllowancePolicy()
    clock = SystemClock()
    try:
        async with SqliteLedger(folder / f"reserve-{backend}.sqlite3") as ledger:

            async def reserve_once() -> None:
                await ledger.reserve(next(fresh), RoundKind.AUTOMATIC, 2, policy, clock.wall())

            m = await alternate(
                {"ledger": reserve_once, "raw": raw_once}, RESERVE_OPS, RESERVE_WARMUP
            )
    finally:
        await raw_close()
    hop = "aiosqlite" if backend == "asyncio" else "sqlite3+to_thread"
    return [
        Row(f"durable reservation ({backend})", m["ledger"], f"raw txn, {hop}", m["raw"],
            "<= 1.5x", m["ledger"] <= 1.5 * m["raw"]),
    ]


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-control-") as name:
        folder = Path(name)

        async def section() -> list[Row]:
            return [
                *await bench_slots(folder),
                *await bench_attempt(folder),
                *await bench_reserve(folder),
            ]

        for backend in BACKENDS:
            rows.extend(anyio.run(section, backend=backend))
    print(
        f"control core (Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}; "
        f"medians per operation; ratios from this run)"
    )
    print(f"  {'measurement':<40} {'median':>10}  {'baseline':<36} {'ratio':>8}  {'target':<9}")
    order = {"take": 0, "atte": 1, "dura": 2}
    for row in sorted(rows, key=lambda r: order[r.name[:4]]):
        print(row.render())


if __name__ == "__main__":
    main()
