"""The stress run's throughput on asyncio vs trio, measured in one run.

Run from the repository root (it imports the workload of ``tests/stress``)::

    python -m bench.bench_stress                 # 2,000 concurrent runs per loop, 3 repeats
    python -m bench.bench_stress --runs 10000    # the full load size

Each repeat runs the stress workload (:func:`tests.stress.workload.load`: every agent run at
once, each an automatic round of a base and a delta attempt, then a deliberate round of six
parallel calls each with a nested read) on a fresh temporary SQLite ledger file with a
:class:`~plugin.ManualClock` (the deadline never limits a run), once on each loop, the loops'
order alternating between repeats. Reported per loop: the medians over the repeats of runs per
second and of each repeat's p50 / p99 round latency (from asking for a round to holding its
permit); and the trio / asyncio ratio of the medians. Both loops are observations; the bench
only checks that every run finished with both rounds granted and every permit closed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import anyio
import attrs

from plugin.control import AllowancePolicy, ManualClock, RecallAllowance, SqliteLedger
from tests.stress.workload import LoadReport, load

BACKENDS = ("asyncio", "trio")


@attrs.frozen
class Sample:
    """One repeat on one loop."""

    runs_per_second: float
    p50_ms: float
    p99_ms: float


async def one_load(path: Path, runs: int) -> Sample:
    """Every run at once on this loop, on a fresh ledger file."""
    run_ids = [f"run-{i}" for i in range(runs)]
    async with SqliteLedger(path, timeout=60.0) as ledger:
        allowance = RecallAllowance(ledger, policy=AllowancePolicy(), clock=ManualClock())
        report: LoadReport = await load(allowance, run_ids)
    # Not the stress test's full invariant check (tests/stress does that): only that the
    # figures count what they claim to, every run done and both of its rounds granted.
    if report.runs != runs or len(report.permits) != 2 * runs or report.refused_rounds:
        raise RuntimeError(f"the load did not complete: {report.runs} runs, "
                           f"{len(report.permits)} permits, {report.refused_rounds} refused")
    if not all(permit.closed for permit in report.permits):
        raise RuntimeError("a permit was left open")
    return Sample(report.runs_per_second, report.median_ms(), report.latency_ms(0.99))


def run(runs: int, repeats: int) -> dict[str, list[Sample]]:
    samples: dict[str, list[Sample]] = {backend: [] for backend in BACKENDS}
    with tempfile.TemporaryDirectory(prefix="bench-stress-") as name:
        for repeat in range(repeats):
            order = BACKENDS if repeat % 2 == 0 else BACKENDS[::-1]
            for backend in order:
                path = Path(name) / f"ledger-{backend}-{repeat}.db"
                samples[backend].append(anyio.run(one_load, path, runs, backend=backend))
    return samples


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_stress")
    parser.add_argument("--runs", type=int, default=2_000, help="concurrent runs per loop")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(list(argv))
    samples = run(args.runs, args.repeats)
    medians = {
        backend: Sample(
            statistics.median(s.runs_per_second for s in got),
            statistics.median(s.p50_ms for s in got),
            statistics.median(s.p99_ms for s in got),
        )
        for backend, got in samples.items()
    }
    print(f"stress load (Python {sys.version.split()[0]}): {args.runs:,} concurrent agent runs "
          f"per loop (automatic round + deliberate round of 6 calls with nested reads), one "
          f"temporary SQLite ledger each, ManualClock; medians of {args.repeats} repeats")
    print(f"  {'loop':<8} {'runs/s':>9} {'p50 round':>11} {'p99 round':>11}   runs/s per repeat")
    for backend in BACKENDS:
        m = medians[backend]
        each = " ".join(f"{s.runs_per_second:.0f}" for s in samples[backend])
        print(f"  {backend:<8} {m.runs_per_second:>9.0f} {m.p50_ms:>8.1f} ms {m.p99_ms:>8.1f} ms"
              f"   {each}")
    a, t = medians["asyncio"], medians["trio"]
    print(f"  trio / asyncio: runs/s {t.runs_per_second / a.runs_per_second:.2f}x, "
          f"p50 {t.p50_ms / a.p50_ms:.2f}x, p99 {t.p99_ms / a.p99_ms:.2f}x  (observation)")


if __name__ == "__main__":
    main(sys.argv[1:])
