"""Durable reservations per second: PostgresLedger, SqliteLedger and raw psycopg, in one run.

Run from the repository root: ``python -m bench.bench_postgres`` (or ``python -m bench
postgres``). Needs the PostgreSQL server of ``RECALLBOUND_TEST_PG_DSN`` (default
``postgresql://root@127.0.0.1:5432/test``); it works in schemas of its own, dropped at the end.

**One process.** For each loop (asyncio, trio) and each number of concurrent runs (1, 1,000),
``C`` tasks each reserve rounds of runs of their own (a fresh run per reservation: every one
opens a run and commits durably). A batch is timed whole (``time.perf_counter``); the three
contenders' batches alternate, and each figure is the median over the batches:

- PostgreSQL: one ``PostgresLedger`` (the server's clock, ``synchronous_commit=on``; group
  commit: the reservations that arrive while a batch is in flight share the next one);
- SQLite: one ``SqliteLedger`` file, WAL, ``synchronous=FULL``, group commit;
- raw psycopg (the baseline): a pool of the same size, one conditional upsert per reservation
  in its own transaction (``synchronous_commit=on``): what a hand-written ledger would do.
  On trio, sync connections in worker threads (psycopg's async API does not run there).

Ratios: PostgreSQL / SQLite and PostgreSQL / raw psycopg (above 1: the ledger is faster).

**Other writes.** Trace writes (``record``, one attempt each) and ``retain`` calls per second,
1,000 runs at once; both group-commit together, as reservations do.

**A fleet.** 8 worker processes (asyncio, one ``PostgresLedger`` each) on one schema, started
together; each runs 1,000 tasks, task ``i`` of every process reserving rounds of run ``i``
(8 processes contend for each run). Reported: the total reservations (granted or refused) per
second from the common start to the last finish, p50/p99 latency of one ``reserve`` call, and
over-admission (slots granted beyond a run's limit, counted from the ledger and from the
workers' own grants; must be 0), plus ``ledger check``.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import psycopg
import psycopg_pool
import sniffio

from plugin import PostgresLedger
from plugin.control import (
    AllowancePolicy,
    AttemptOutcome,
    AttemptTrace,
    Reservation,
    RoundKind,
    SqliteLedger,
)

DSN = os.environ.get("RECALLBOUND_TEST_PG_DSN", "postgresql://root@127.0.0.1:5432/test")
POOL = 8
ROOMY = AllowancePolicy(max_searches=10**9, max_rounds=10**9, deadline_s=1e6)
CONCURRENCY = (1, 1000)
OPS = {1: 100, 1000: 3000}
"""Reservations per batch at each concurrency (spread evenly over the tasks)."""
BATCHES = 3
BACKENDS = ("asyncio", "trio")

FLEET_WORKERS = 8
FLEET_RUNS = 1000
FLEET_ROUNDS = 3
"""Rounds each task of each worker asks for, one after another."""
FLEET_POLICY = AllowancePolicy(max_searches=FLEET_WORKERS * FLEET_ROUNDS // 2,
                               max_rounds=FLEET_WORKERS * FLEET_ROUNDS, deadline_s=3600.0)
"""Half of the fleet's requests for a run can be granted (one slot each): the rest are refused."""

_ids = itertools.count()

_RAW_SCHEMA = """
CREATE TABLE IF NOT EXISTS {s}.runs (run_id text PRIMARY KEY, opened_wall float8 NOT NULL,
    deadline_wall float8 NOT NULL, max_searches bigint NOT NULL, rounds bigint NOT NULL,
    reserved bigint NOT NULL)
"""
_RAW_RESERVE = """
INSERT INTO {s}.runs AS r VALUES (%(r)s, %(now)s, %(now)s + 1e6, 1000000000, 1, 2)
ON CONFLICT (run_id) DO UPDATE SET rounds = r.rounds + 1, reserved = r.reserved + 2
WHERE r.reserved < r.max_searches AND %(now)s < r.deadline_wall
RETURNING rounds, reserved
"""


class RawPsycopg:
    """The baseline: one conditional upsert per reservation, autocommit, synchronous commit."""

    def __init__(self, schema: str) -> None:
        self._sql = _RAW_RESERVE.format(s=f'"{schema}"').encode()
        self._schema = schema
        self._pool: Any = None
        self._limiter = anyio.CapacityLimiter(POOL)

    async def __aenter__(self) -> RawPsycopg:
        kwargs = {"autocommit": True, "options": "-c synchronous_commit=on"}
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"'.encode())
            conn.execute(_RAW_SCHEMA.format(s=f'"{self._schema}"').encode())
        if sniffio.current_async_library() == "asyncio":
            self._pool = psycopg_pool.AsyncConnectionPool(
                DSN, min_size=POOL, max_size=POOL, kwargs=kwargs, open=False)
            await self._pool.open(wait=True)
        else:
            self._pool = psycopg_pool.ConnectionPool(
                DSN, min_size=POOL, max_size=POOL, kwargs=kwargs, open=False)
            await anyio.to_thread.run_sync(lambda: self._pool.open(wait=True))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if isinstance(self._pool, psycopg_pool.AsyncConnectionPool):
            await self._pool.close()
        else:
            await anyio.to_thread.run_sync(self._pool.close)

    async def reserve(self, run_id: str, *_: Any) -> Any:
        params = {"r": run_id, "now": time.time()}
        if isinstance(self._pool, psycopg_pool.AsyncConnectionPool):
            async with self._pool.connection() as conn:
                return await (await conn.execute(self._sql, params)).fetchone()

        def run() -> Any:
            with self._pool.connection() as conn:
                return conn.execute(self._sql, params).fetchone()

        return await anyio.to_thread.run_sync(run, limiter=self._limiter)


async def _batch(reserve: Callable[..., Awaitable[Any]], concurrency: int) -> float:
    """Reservations per second for one batch of ``OPS[concurrency]`` fresh runs."""
    per_task = OPS[concurrency] // concurrency

    async def task() -> None:
        for _ in range(per_task):
            await reserve(f"run-{next(_ids)}", RoundKind.AUTOMATIC, 2, ROOMY, time.time())

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(task)
    return per_task * concurrency / (time.perf_counter() - start)


async def measure(folder: Path, schema: str) -> list[tuple[int, float, float, float]]:
    """(concurrency, PostgreSQL, SQLite, raw psycopg median ops/s) on the running loop."""
    rows = []
    async with SqliteLedger(folder / "bench.sqlite3") as sqlite, PostgresLedger(
        DSN, schema=schema, max_size=POOL, min_size=POOL
    ) as postgres, RawPsycopg(schema + "_raw") as raw:
        for concurrency in CONCURRENCY:
            contenders = (postgres.reserve, sqlite.reserve, raw.reserve)
            for reserve in contenders:
                await _batch(reserve, concurrency)  # warm-up: pools filled
            figures: list[list[float]] = [[], [], []]
            for _ in range(BATCHES):
                for figure, reserve in zip(figures, contenders, strict=True):
                    figure.append(await _batch(reserve, concurrency))
            pg, lite, plain = (statistics.median(f) for f in figures)
            rows.append((concurrency, pg, lite, plain))
    return rows


WRITES = 2000
"""Trace writes (or retains) per batch, by 1,000 concurrent runs."""


async def _writes(ledger: Any, what: str) -> float:
    """Trace writes (``record``, one attempt each) or ``retain`` calls per second, 1,000 runs."""
    per_task = WRITES // 1000

    async def task() -> None:
        run_id = f"run-{next(_ids)}"
        for slot in range(1, per_task + 1):
            if what == "record":
                await ledger.record([AttemptTrace(
                    attempt_id=f"{run_id}-{slot}", run_id=run_id, round_index=1, slot=slot,
                    kind="deliberate", outcome=AttemptOutcome.OK, started_wall=time.time(),
                    elapsed_s=0.1)], [])
            else:
                await ledger.retain(run_id, [f"m{slot}"], limit=100)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(1000):
            tg.start_soon(task)
    return per_task * 1000 / (time.perf_counter() - start)


async def measure_writes(folder: Path, schema: str) -> list[tuple[str, float, float]]:
    """(what, PostgreSQL, SQLite median calls/s) of the other writes, 1,000 runs at once."""
    rows = []
    async with SqliteLedger(folder / "writes.sqlite3") as sqlite, PostgresLedger(
        DSN, schema=schema, max_size=POOL, min_size=POOL
    ) as postgres:
        for what in ("record", "retain"):
            figures: list[list[float]] = [[], []]
            for _ in range(BATCHES):
                for figure, ledger in zip(figures, (postgres, sqlite), strict=True):
                    figure.append(await _writes(ledger, what))
            rows.append((what, *(statistics.median(f) for f in figures)))
    return rows


# -- the fleet ---------------------------------------------------------------------------------


def _fleet_worker(schema: str, start: Any, results: Any) -> None:
    async def main() -> None:
        async with PostgresLedger(DSN, schema=schema, max_size=2, min_size=2) as ledger:
            latencies: list[float] = []
            granted: dict[str, int] = {}

            async def task(i: int) -> None:
                for _ in range(FLEET_ROUNDS):
                    began = time.perf_counter()
                    outcome = await ledger.reserve(f"run-{i}", RoundKind.DELIBERATE, 1,
                                                   FLEET_POLICY, 0.0)
                    latencies.append(time.perf_counter() - began)
                    if isinstance(outcome, Reservation):
                        granted[outcome.run_id] = granted.get(outcome.run_id, 0) + outcome.slots

            await anyio.to_thread.run_sync(start.wait)
            async with anyio.create_task_group() as tg:
                for i in range(FLEET_RUNS):
                    tg.start_soon(task, i)
            results.put((time.time(), latencies, granted))

    anyio.run(main)


def fleet(schema: str) -> dict[str, Any]:
    """Run the fleet (see the module) and return its figures."""
    context = multiprocessing.get_context("spawn")
    start, results = context.Event(), context.Queue()

    async def create() -> None:
        async with PostgresLedger(DSN, schema=schema):
            pass

    anyio.run(create)
    workers = [context.Process(target=_fleet_worker, args=(schema, start, results))
               for _ in range(FLEET_WORKERS)]
    for worker in workers:
        worker.start()
    time.sleep(3.0)  # every worker opened its pool and waits at the start line
    began = time.time()
    start.set()
    outcomes = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    ended = max(done for done, _, _ in outcomes)
    latencies = sorted(lat for _, lats, _ in outcomes for lat in lats)
    granted: dict[str, int] = {}
    for _, _, grants in outcomes:
        for run_id, slots in grants.items():
            granted[run_id] = granted.get(run_id, 0) + slots

    async def inspect() -> tuple[int, tuple[str, ...]]:
        async with PostgresLedger(DSN, schema=schema) as ledger:
            admin = ledger.admin()
            over = sum(max(0, r.reserved - r.max_searches)
                       for r in await admin.runs(limit=FLEET_RUNS * 2))
            return over, (await admin.check()).problems

    over_ledger, problems = anyio.run(inspect)
    limit = FLEET_POLICY.max_searches
    return {
        "reservations": len(latencies),
        "per_second": len(latencies) / (ended - began),
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "over_admitted_ledger": over_ledger,
        "over_admitted_workers": sum(max(0, g - limit) for g in granted.values()),
        "granted": sum(granted.values()),
        "problems": problems,
    }


def _drop(*schemas: str) -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())


def main() -> None:
    schema = f"rb_bench_{secrets.token_hex(4)}"
    fleet_schema = schema + "_fleet"
    print(f"  load average before: {Path('/proc/loadavg').read_text().split()[:3]}")
    print(f"  durable reservations per second (median of {BATCHES} batches, a fresh run each;"
          f" pools of {POOL}, same host)")
    print(f"  {'loop':<8} {'runs':>5} {'PostgreSQL':>11} {'SQLite':>9} {'raw psycopg':>12} "
          f"{'PG / SQLite':>12} {'PG / raw':>9}")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-postgres-") as name:
            for backend in BACKENDS:
                folder = Path(name) / backend
                folder.mkdir()
                for concurrency, pg, lite, raw in anyio.run(measure, folder,
                                                            f"{schema}_{backend}",
                                                            backend=backend):
                    print(f"  {backend:<8} {concurrency:>5} {pg:>9.0f}/s {lite:>7.0f}/s "
                          f"{raw:>10.0f}/s {pg / lite:>11.2f}x {pg / raw:>8.2f}x")
            print(f"\n  other writes, 1,000 runs at once (median of {BATCHES} batches)")
            print(f"  {'loop':<8} {'write':<7} {'PostgreSQL':>11} {'SQLite':>9} "
                  f"{'PG / SQLite':>12}")
            for backend in BACKENDS:
                folder = Path(name) / backend
                for what, pg, lite in anyio.run(measure_writes, folder,
                                                f"{schema}_{backend}_w", backend=backend):
                    print(f"  {backend:<8} {what:<7} {pg:>9.0f}/s {lite:>7.0f}/s "
                          f"{pg / lite:>11.2f}x")
        figures = fleet(fleet_schema)
        print(f"\n  fleet: {FLEET_WORKERS} processes x {FLEET_RUNS} runs x {FLEET_ROUNDS} rounds "
              f"on one PostgreSQL ledger (asyncio, pools of 2)")
        print(f"  {figures['reservations']} reservations ({figures['granted']} slots granted) "
              f"at {figures['per_second']:.0f}/s; latency p50 {figures['p50_ms']:.1f} ms, "
              f"p99 {figures['p99_ms']:.1f} ms")
        print(f"  over-admission: {figures['over_admitted_ledger']} (ledger), "
              f"{figures['over_admitted_workers']} (workers' grants); "
              f"ledger check: {list(figures['problems']) or 'ok'}")
        print(f"  load average after: {Path('/proc/loadavg').read_text().split()[:3]}")
    finally:
        _drop(*(f"{schema}_{b}{suffix}" for b in BACKENDS for suffix in ("", "_raw", "_w")),
              fleet_schema)


if __name__ == "__main__":
    main()
