"""What a hostile search result costs recallbound's own work: one dispatch per shape.

A retriever returns, at once, one of: a million items, one 100 MB text, or 20,000 items of
5 KB. The hooks examine the first ``ContextCaps.examined`` items and cut each text to the byte
cap before any per-character work, so each dispatch should take about what an ordinary result
does. Prints the median wall time of a few dispatches per shape, and the ordinary result's for
comparison, on asyncio, over a SQLite ledger:

    python -m bench.bench_hostile_results
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import anyio

from plugin import ManualClock, SearchRequest, SimpleRetriever
from plugin.memory.store import Evidence
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.hooks import ToolCall

SHAPES: dict[str, Callable[[], list[Evidence]]] = {
    "ordinary (8 items)": lambda: [Evidence(id=f"m{i}", text="cutover on friday")
                                   for i in range(8)],
    "1e6 items": lambda: [Evidence(id="m-same", text="cutover on friday")] * 1_000_000,
    "one 100 MB text": lambda: [Evidence(id="m-huge", text="cutover " * 12_500_000)],
    "20,000 x 5 KB": lambda: [Evidence(id=f"m{i}", text="cutover " + "x" * 5_000)
                              for i in range(20_000)],
}
REPEATS = 5


async def main() -> None:
    items: list[Evidence] = []

    async def search(request: SearchRequest) -> list[Evidence]:
        return items

    with tempfile.TemporaryDirectory() as folder:
        config = RecallConfig(ledger_path=Path(folder) / "ledger.db",
                              store_path=Path(folder) / "memory.db")
        async with open_hooks(config, retriever=SimpleRetriever(search),
                              clock=ManualClock(wall=1_800_000_000.0)) as hooks:
            print(f"dispatch wall time, median of {REPEATS}, asyncio, SQLite ledger")
            for name, make in SHAPES.items():
                items = make()
                times = []
                for _ in range(REPEATS):
                    started = time.perf_counter()
                    (result,) = await hooks.dispatch(
                        [ToolCall(call_id="c0", arguments={"query": "cutover"})],
                        run_id=f"run-{uuid.uuid4()}", scope="atlas", principal="ana")
                    times.append(time.perf_counter() - started)
                    assert result.status == "ok", result
                print(f"  {name:<20} {statistics.median(times) * 1000:9.1f} ms")


if __name__ == "__main__":
    anyio.run(main)
