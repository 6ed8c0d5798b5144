"""What the allowance costs an agent loop: enforced hooks vs the legacy (unenforced) path.

Both sides run the same planning, the same store and the same searches; the enforced side adds
the durable reservation (one ``synchronous=FULL`` commit per round), the permit and the traces.
Measured in the same run, alternating, on asyncio:

    python -m bench.bench_hooks
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from itertools import count
from pathlib import Path
from typing import Any

import anyio
from attrs import evolve

from plugin import AllowancePolicy
from runtime_hooks.bootstrap import RecallConfig, Semantic, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed
from runtime_hooks.hooks import RecallHooks, ToolCall

ROUNDS = 60

async def _median_pair(
    enforced: Callable[[], Awaitable[Any]], legacy: Callable[[], Awaitable[Any]]
) -> tuple[float, float]:
    """Median microseconds of each, timed one call at a time, alternating (fsync drifts)."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(5):  # warm-up
        await enforced()
        await legacy()
    for _ in range(ROUNDS):
        for side, call in enumerate((enforced, legacy)):
            start = time.perf_counter_ns()
            await call()
            times[side].append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(times[0]), statistics.median(times[1])

async def main() -> None:
    runs = count()
    calls = [ToolCall(call_id=f"c{i}", arguments={"query": q}) for i, q in
             enumerate(["invoice backfill dry-run", "currency rounding", "cutover date"])]
    with tempfile.TemporaryDirectory() as folder:
        base = RecallConfig(ledger_path=Path(folder) / "l.db", store_path=Path(folder) / "m.db",
                            semantic=Semantic.HASHING, query_planning="task_context",
                            policy=AllowancePolicy())

        async def admit(_: str) -> bool:
            return True

        async with open_hooks(evolve(base, admission=admit)) as enforced, open_hooks(
            evolve(base, admission=admit, legacy=True)
        ) as legacy:
            await seed(enforced.retriever.store)  # type: ignore[attr-defined]

            def prepare(hooks: RecallHooks) -> Callable[[], Awaitable[Any]]:
                return lambda: hooks.prepare(STATE, run_id=f"p{next(runs)}", scope=SCOPE,
                                             principal=PRINCIPAL)

            def dispatch(hooks: RecallHooks) -> Callable[[], Awaitable[Any]]:
                return lambda: hooks.dispatch(calls, run_id=f"d{next(runs)}", scope=SCOPE,
                                              principal=PRINCIPAL)

            rows = [
                ("prepare (automatic round: base + delta)",
                 *await _median_pair(prepare(enforced), prepare(legacy))),
                ("dispatch (3 parallel search calls)",
                 *await _median_pair(dispatch(enforced), dispatch(legacy))),
            ]
    print(f"hooks on asyncio, demo store, medians of {ROUNDS} alternating calls")
    print(f"  {'phase':42} {'enforced':>10} {'legacy':>10} {'ratio':>7}")
    for name, on, off in rows:
        print(f"  {name:42} {on:>8.0f}us {off:>8.0f}us {on / off:>6.2f}x")

if __name__ == "__main__":
    anyio.run(main)
