"""Group commit: durable round reservations per second, batched vs one commit each.

``python -m bench.bench_group_commit``. For each loop and each concurrency (1, 64, 1,000 runs
reserving at once) the same workload runs against two ledger files in this run: one with group
commit (the default) and one with ``group_commit=False`` (one ``BEGIN IMMEDIATE … COMMIT`` and
one fsync per reservation). Each side is measured ``REPEATS`` times, the sides interleaved;
the table shows median reservations per second, the ratio, and the median latency of one
reservation (submission to durable answer). Target at 1,000 concurrent runs: >= 3x; at 1 run
the two must be alike (a lone run never waits for a batch).
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

from plugin.control import AllowancePolicy, RoundKind, SqliteLedger

CONCURRENCY = (1, 64, 1000)
REPEATS = 5
ROUNDS_PER_TASK = {1: 200, 64: 8, 1000: 2}
"""How many reservations each concurrent task makes in one measurement."""


async def _measure(ledger: SqliteLedger, tasks: int, fresh: itertools.count[int]) -> tuple[
    float, float
]:
    """(reservations per second, median latency in ms) for ``tasks`` concurrent reservers."""
    per_task = ROUNDS_PER_TASK[tasks]
    latencies: list[float] = []
    policy = AllowancePolicy()

    async def reserver() -> None:
        for _ in range(per_task):
            start = time.perf_counter()
            await ledger.reserve(
                f"run-{next(fresh)}", RoundKind.AUTOMATIC, 2, policy, time.time
            )
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(tasks):
            tg.start_soon(reserver)
    elapsed = time.perf_counter() - start
    return tasks * per_task / elapsed, statistics.median(latencies) * 1000


async def bench(folder: Path, backend: str) -> list[str]:
    rows = []
    fresh = itertools.count()
    async with SqliteLedger(folder / f"group-{backend}.db") as grouped, SqliteLedger(
        folder / f"single-{backend}.db", group_commit=False
    ) as single:
        for tasks in CONCURRENCY:
            results: dict[str, list[tuple[float, float]]] = {"group": [], "single": []}
            for i in range(REPEATS):
                order = [("group", grouped), ("single", single)]
                for name, ledger in order[i % 2:] + order[: i % 2]:
                    results[name].append(await _measure(ledger, tasks, fresh))
            g_rate = statistics.median(r for r, _ in results["group"])
            s_rate = statistics.median(r for r, _ in results["single"])
            g_lat = statistics.median(lat for _, lat in results["group"])
            s_lat = statistics.median(lat for _, lat in results["single"])
            target = ">= 3x" if tasks == 1000 else ("~1x" if tasks == 1 else "")
            verdict = ""
            if tasks == 1000:
                verdict = "PASS" if g_rate >= 3 * s_rate else "MISS"
            rows.append(
                f"  {backend:<8} {tasks:>6}  {g_rate:>10.0f}/s {s_rate:>10.0f}/s "
                f"{g_rate / s_rate:>7.2f}x  {g_lat:>8.2f} ms {s_lat:>8.2f} ms  "
                f"{target:<6} {verdict}"
            )
    return rows


def main() -> None:
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-group-") as name:
        for backend in ("asyncio", "trio"):
            rows.extend(anyio.run(bench, Path(name), backend, backend=backend))
    print(f"group commit (Python {sys.version.split()[0]}; medians of {REPEATS} runs, "
          "sides interleaved)")
    print(f"  {'loop':<8} {'runs':>6}  {'grouped':>12} {'one each':>12} {'ratio':>8}  "
          f"{'latency g':>11} {'latency 1':>11}  target")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
