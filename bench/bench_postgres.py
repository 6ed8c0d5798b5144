"""Durable reservations per second: PostgresLedger against SqliteLedger, in one run.

Run from the repository root: ``python -m bench.bench_postgres`` (or ``python -m bench
postgres``). Needs the PostgreSQL server of ``RECALLBOUND_TEST_PG_DSN`` (default
``postgresql://root@127.0.0.1:5432/test``); it works in a schema of its own, dropped at the end.

For each loop (asyncio, trio) and each number of concurrent runs (1, 64, 1,000), ``C`` tasks
each reserve rounds of runs of their own (a fresh run per reservation: every one opens a run
and commits durably). A batch is timed whole (``time.perf_counter``); the two ledgers' batches
alternate, and each figure is the median over the batches. Ratio = PostgreSQL / SQLite
reservations per second (above 1: PostgreSQL is faster).

- SQLite: one ``SqliteLedger`` file, WAL, ``synchronous=FULL`` (one connection per process: its
  transactions are serialized by the ledger's lock, as in production).
- PostgreSQL: one ``PostgresLedger`` (pool of ``POOL`` connections, ``synchronous_commit=on``,
  the server's clock), server on the same host.

A second table is the driver choice on asyncio: psycopg's ``AsyncConnection`` (what asyncio
uses) against sync connections through anyio worker threads (what trio must use, psycopg's
async API not running there), same ledger, same SQL, batches alternating.
"""

from __future__ import annotations

import itertools
import os
import secrets
import statistics
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import anyio

from plugin import PostgresLedger
from plugin.control import AllowancePolicy, RoundKind, SqliteLedger, _postgres

DSN = os.environ.get("RECALLBOUND_TEST_PG_DSN", "postgresql://root@127.0.0.1:5432/test")
POOL = 16
ROOMY = AllowancePolicy(max_searches=10**9, max_rounds=10**9, deadline_s=1e6)
CONCURRENCY = (1, 64, 1000)
OPS = {1: 150, 64: 640, 1000: 1000}
"""Reservations per batch at each concurrency (spread evenly over the tasks)."""
BATCHES = 5
BACKENDS = ("asyncio", "trio")

_ids = itertools.count()


async def _batch(ledger: Any, concurrency: int) -> float:
    """Reservations per second for one batch of ``OPS[concurrency]`` fresh runs."""
    per_task = OPS[concurrency] // concurrency

    async def task() -> None:
        for _ in range(per_task):
            await ledger.reserve(f"run-{next(_ids)}", RoundKind.AUTOMATIC, 2, ROOMY, time.time())

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(task)
    return per_task * concurrency / (time.perf_counter() - start)


async def measure(folder: Path, schema: str) -> list[tuple[int, float, float]]:
    """(concurrency, PostgreSQL median ops/s, SQLite median ops/s) on the running loop."""
    rows = []
    async with SqliteLedger(folder / "bench.sqlite3") as sqlite, PostgresLedger(
        DSN, schema=schema, max_size=POOL, min_size=POOL
    ) as postgres:
        for concurrency in CONCURRENCY:
            await _batch(postgres, concurrency)  # warm-up: pool filled, statements prepared
            await _batch(sqlite, concurrency)
            pg, lite = [], []
            for _ in range(BATCHES):
                pg.append(await _batch(postgres, concurrency))
                lite.append(await _batch(sqlite, concurrency))
            rows.append((concurrency, statistics.median(pg), statistics.median(lite)))
    return rows


async def _threaded_on_asyncio(schema: str) -> PostgresLedger:
    """A PostgresLedger opened with the threaded (trio) driver although asyncio runs."""
    ledger = PostgresLedger(DSN, schema=schema, max_size=POOL, min_size=POOL)
    real = _postgres.sniffio
    _postgres.sniffio = types.SimpleNamespace(  # type: ignore[assignment]
        current_async_library=lambda: "trio"
    )
    try:
        await ledger.open()
    finally:
        _postgres.sniffio = real
    return ledger


async def measure_drivers(schema: str) -> list[tuple[int, float, float]]:
    """(concurrency, AsyncConnection median ops/s, threaded median ops/s) on asyncio."""
    rows = []
    threaded = await _threaded_on_asyncio(schema)
    try:
        async with PostgresLedger(DSN, schema=schema, max_size=POOL, min_size=POOL) as native:
            for concurrency in CONCURRENCY[:2]:
                await _batch(native, concurrency)
                await _batch(threaded, concurrency)
                a, t = [], []
                for _ in range(BATCHES):
                    a.append(await _batch(native, concurrency))
                    t.append(await _batch(threaded, concurrency))
                rows.append((concurrency, statistics.median(a), statistics.median(t)))
    finally:
        await threaded.aclose()
    return rows


def _drop(schema: str) -> None:
    import psycopg

    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())


def main() -> None:
    schema = f"rb_bench_{secrets.token_hex(4)}"
    print(f"  durable reservations per second (median of {BATCHES} batches, a fresh run each;"
          f" PostgreSQL pool {POOL}, same host)")
    print(f"  {'loop':<8} {'concurrent runs':>15} {'PostgreSQL':>12} {'SQLite':>10} "
          f"{'PG / SQLite':>12}")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-postgres-") as name:
            for backend in BACKENDS:
                folder = Path(name) / backend
                folder.mkdir()
                for concurrency, pg, lite in anyio.run(measure, folder, schema, backend=backend):
                    print(f"  {backend:<8} {concurrency:>15} {pg:>10.0f}/s {lite:>8.0f}/s "
                          f"{pg / lite:>11.2f}x")
        print("\n  driver on asyncio: psycopg AsyncConnection vs sync connections in threads")
        print(f"  {'concurrent runs':>15} {'async':>10} {'threads':>10} {'async / threads':>16}")
        for concurrency, native, threaded in anyio.run(measure_drivers, schema):
            print(f"  {concurrency:>15} {native:>8.0f}/s {threaded:>8.0f}/s "
                  f"{native / threaded:>15.2f}x")
    finally:
        _drop(schema)


if __name__ == "__main__":
    main()
