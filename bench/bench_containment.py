"""What running a search in a task of its own costs: ``plugin.memory.detached.within``.

Run from the repository root: ``python -m bench.bench_containment [--calls N]``. A search or a
belief read runs in its attempt in a task of its own (so one that will not be cancelled cannot
hold its caller). The baseline, in the same run: the same trivial call (one checkpoint)
awaited in the caller's own task, as searches were before. Both are timed N calls at a time,
five rounds interleaved, on asyncio and on trio; the medians per call and their ratio are
printed. A hooks turn takes milliseconds (``bench_hooks``): this is what each of its searches
adds to it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import anyio

from plugin.memory.detached import within


async def _call() -> int:
    await anyio.sleep(0)
    return 1


async def _apart() -> object:
    return await within(_call, math.inf)


async def _measure(calls: int) -> tuple[float, float]:
    timed: dict[str, list[float]] = {"in task": [], "apart": []}
    for _ in range(5):
        for name, fn in (("in task", _call), ("apart", _apart)):
            start = time.perf_counter()
            for _ in range(calls):
                await fn()
            timed[name].append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(timed["in task"]), statistics.median(timed["apart"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_containment")
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    for backend in ("asyncio", "trio"):
        base, apart = anyio.run(_measure, args.calls, backend=backend)
        print(f"{backend:8} in the caller's task {base:6.1f} us a call, in a task of its own "
              f"{apart:6.1f} us (+{apart - base:.1f} us, x{apart / base:.2f})")


if __name__ == "__main__":
    main()
