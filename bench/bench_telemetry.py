"""The observer seam's cost: one attempt before the seam existed, with it off, and with the SDK.

Run from the repository root: ``python -m bench.bench_telemetry [--baseline REF]``.

- **before**: ``plugin/control`` as it was before the seam (read from git at ``REF``, by
  default the parent of the commit that added ``plugin/control/observe.py``), loaded as a
  separate package in this same process;
- **before (A/A)**: the same code again as a second side, so the table shows what noise alone
  looks like between two identical sides;
- **off**: today's code with no observer (the default);
- **otel SDK**: today's code with :class:`runtime_hooks.telemetry.OtelObserver` on the
  OpenTelemetry SDK (a tracer provider with no exporter, a meter provider with an in-memory
  reader): spans and metrics are really built and recorded.

Each figure is the median per-operation time over interleaved batches of ``async with
permit.attempt(): pass`` (and ``with permit.attempt_sync(): pass``), each batch on a fresh
permit; ratios divide two medians from this run.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import sniffio

from plugin import control
from plugin.control import AllowancePolicy, RoundKind, SystemClock, observe
from plugin.control.policy import MAX_COUNT

ROOT = Path(__file__).resolve().parents[1]
OPS, BATCHES, WARMUP = 2_000, 31, 2
BACKENDS = ("asyncio", "trio")
ROOMY = AllowancePolicy(max_searches=MAX_COUNT, max_rounds=MAX_COUNT, deadline_s=1e6)
"""Slots and rounds enough never to run out while benchmarking."""

SyncBatch = Callable[[int], int]
"""Run n operations; return the ns they took (setup outside the timed region)."""
AsyncBatch = Callable[[int], Awaitable[int]]


def _fmt(ns: float) -> str:
    return f"{ns / 1e3:.2f} us" if ns >= 1e3 else f"{ns:.0f} ns"


def _rotations(names: list[str]) -> Iterator[tuple[int, list[str]]]:
    for i in range(WARMUP + BATCHES):
        yield i, names[i % len(names):] + names[:i % len(names)]


def compare(sides: dict[str, SyncBatch], n: int) -> dict[str, float]:
    """Median ns per operation of each side, batches interleaved (order rotated), GC off."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for i, order in _rotations(list(sides)):
        for name in order:
            gc.collect()
            gc.disable()
            try:
                ns = sides[name](n) / n
            finally:
                gc.enable()
            if i >= WARMUP:
                samples[name].append(ns)
    return {name: statistics.median(s) for name, s in samples.items()}


async def acompare(sides: dict[str, AsyncBatch], n: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for i, order in _rotations(list(sides)):
        for name in order:
            gc.collect()
            gc.disable()
            try:
                ns = await sides[name](n) / n
            finally:
                gc.enable()
            if i >= WARMUP:
                samples[name].append(ns)
    return {name: statistics.median(s) for name, s in samples.items()}


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout


def default_baseline() -> str:
    added = _git("log", "--diff-filter=A", "--format=%H", "-n1", "--",
                 "plugin/control/observe.py").strip()
    if not added:
        raise SystemExit("no commit adds plugin/control/observe.py: pass --baseline REF")
    return added + "^"


def load_before(ref: str, folder: Path) -> ModuleType:
    """``plugin/control`` at ``ref`` as the package ``_control_before``."""
    package = folder / "_control_before"
    prefix = "plugin/control/"
    for name in _git("ls-tree", "-r", "--name-only", ref, prefix).split():
        target = package / name[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_git("show", f"{ref}:{name}"), encoding="utf-8")
    sys.path.insert(0, str(folder))
    return importlib.import_module("_control_before")


def _sdk_observer() -> Any:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from runtime_hooks.telemetry import OtelObserver

    return OtelObserver(tracer_provider=TracerProvider(),
                        meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]))


async def bench(before: ModuleType, folder: Path) -> list[str]:
    backend = sniffio.current_async_library()
    sdk = _sdk_observer()
    async with before.SqliteLedger(folder / f"before-{backend}.db") as old_ledger, \
            control.SqliteLedger(folder / f"now-{backend}.db") as ledger:
        old = before.RecallAllowance(old_ledger, policy=before.AllowancePolicy(
            max_searches=ROOMY.max_searches, max_rounds=ROOMY.max_rounds,
            deadline_s=ROOMY.deadline_s), clock=before.SystemClock())
        now = control.RecallAllowance(ledger, policy=ROOMY, clock=SystemClock())
        old_kind = before.RoundKind.DELIBERATE

        def async_side(allowance: Any, kind: Any, observer: Any) -> Any:
            async def batch(n: int) -> int:
                observe.set_observer(observer)
                try:
                    async with allowance.round("bench", kind, slots=n) as permit:
                        attempt = permit.attempt
                        start = time.perf_counter_ns()
                        for _ in itertools.repeat(None, n):
                            async with attempt():
                                pass
                        return time.perf_counter_ns() - start
                finally:
                    observe.set_observer(None)
            return batch

        m = await acompare({
            "before": async_side(old, old_kind, None),
            "before (A/A)": async_side(old, old_kind, None),
            "off": async_side(now, RoundKind.DELIBERATE, None),
            "otel SDK": async_side(now, RoundKind.DELIBERATE, sdk),
        }, OPS)

        # attempt_sync: the permits are reserved up front (outside the timed region).
        async def permits(allowance: Any, kind: Any) -> list[Any]:
            held = []
            for _ in range(WARMUP + BATCHES):
                round_ = allowance.round("bench-sync", kind, slots=OPS)
                held.append((round_, await round_.__aenter__()))
            return held

        def sync_side(held: list[Any], observer: Any) -> Any:
            queue = iter(held)

            def batch(n: int) -> int:
                _, permit = next(queue)
                observe.set_observer(observer)
                try:
                    attempt = permit.attempt_sync
                    start = time.perf_counter_ns()
                    for _ in itertools.repeat(None, n):
                        with attempt():
                            pass
                    return time.perf_counter_ns() - start
                finally:
                    observe.set_observer(None)
            return batch

        # Each side needs its own permits; rounds are left open until the end (no flush).
        old_held = await permits(old, old_kind)
        old_held2 = await permits(old, old_kind)
        off_held = await permits(now, RoundKind.DELIBERATE)
        sdk_held = await permits(now, RoundKind.DELIBERATE)
        s = compare({
            "before": sync_side(old_held, None), "before (A/A)": sync_side(old_held2, None),
            "off": sync_side(off_held, None), "otel SDK": sync_side(sdk_held, sdk),
        }, OPS)
        for round_, _ in [*old_held, *old_held2, *off_held, *sdk_held]:
            await round_.__aexit__(None, None, None)

    lines = []
    for label, medians in (("attempt()", m), ("attempt_sync()", s)):
        base = medians["before"]
        for side in ("before (A/A)", "off", "otel SDK"):
            lines.append(f"  {label + ' ' + backend:<24} {side:<13} {_fmt(medians[side]):>10}"
                         f"   before {_fmt(base):>10}   {medians[side] / base:6.3f}x")
    return lines


def seam_alone() -> float:
    """ns per attempt that the seam adds when off, measured in isolation (noise-free bound).

    What an attempt now does beyond the old code when no observer is installed: read
    ``observe.active`` and test it, call the extra ``_end`` method, and test ``_watch``.
    """
    class Holder:
        __slots__ = ("_watch",)

        def __init__(self) -> None:
            self._watch: object = None

        def end(self) -> None:
            if self._watch is not None:
                raise AssertionError

    holder = Holder()

    def seam(n: int) -> int:
        module, end = observe, holder.end
        start = time.perf_counter_ns()
        for _ in itertools.repeat(None, n):
            observer = module.active
            if observer is not None:
                raise AssertionError
            end()
        return time.perf_counter_ns() - start

    def empty(n: int) -> int:
        start = time.perf_counter_ns()
        for _ in itertools.repeat(None, n):
            pass
        return time.perf_counter_ns() - start

    m = compare({"seam": seam, "empty": empty}, 200_000)
    return max(0.0, m["seam"] - m["empty"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_telemetry")
    parser.add_argument("--baseline", default=None,
                        help="git ref of the code before the seam (default: found in history)")
    args = parser.parse_args(argv)
    ref = args.baseline or default_baseline()
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as name:
        folder = Path(name)
        before = load_before(ref, folder)
        lines = []
        for backend in BACKENDS:
            lines.extend(anyio.run(bench, before, folder, backend=backend))
    print(f"observer seam (Python {sys.version.split()[0]}; baseline {ref}; medians of "
          f"{BATCHES} interleaved batches of {OPS}; ratios against 'before' in this run)")
    for line in lines:
        print(line)
    print(f"  seam alone, off: {seam_alone():.0f} ns per attempt (read observe.active, one "
          f"extra call, two None tests), measured in isolation")


if __name__ == "__main__":
    main()
