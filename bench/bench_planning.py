"""Query-planning benchmark: compose cost for a typical state, and independence from size.

Run from the repository root: ``python -m bench.bench_planning``. States are built before
timing (building a 100,000-task state validates every task, which is O(n) by design); only
composing is timed. Prints medians of per-call times over many batches, and the ratio of a
state with 100,000 tasks and facts to one with 8 (target <= 1.5x: only the first-eight windows
are read) and of a typical compose to the 20 us target.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

from plugin.memory.planning import RecallQuery, compose_baseline, compose_task_context
from plugin.memory.state import Fact, Task, WorkingState

BATCH = 200
BATCHES = 150
TARGET_TYPICAL_US = 20.0
TARGET_RATIO = 1.5


def typical_state() -> WorkingState:
    return WorkingState(
        "Continue",
        objective="Ship the v2 release notes with a migration guide",
        next_action="Draft the migration section for the configuration changes",
        tasks=[
            Task("Collect changelog entries since v1.9", done=True),
            Task("Draft the migration section"),
            Task("Ask Alice to review the API changes"),
            Task("Update the docs landing page"),
            Task("Tag the release candidate"),
        ],
        open_questions=[
            "Does v2 still support Python 3.9?",
            "Who signs off on the release?",
            "When does the feature freeze start?",
        ],
        constraints=[
            "No breaking changes without a deprecation period",
            "Keep the notes under two pages",
            "Use plain English",
        ],
        facts=[
            Fact("Alice maintains the public API", ["Alice"]),
            Fact("Bob runs the CI pipeline", ["Bob", "CI"]),
            Fact("The release train leaves on Fridays", ["release train"]),
            Fact("Carol writes the docs", ["Carol"]),
            Fact("Dave owns the config loader", ["Dave", "config loader"]),
            Fact("Eve approved the v2 scope", ["Eve"]),
        ],
    )


def sized_state(n: int) -> WorkingState:
    """n tasks and n facts; the first eight of each are the same whatever n."""
    return WorkingState(
        "Continue",
        objective="Clear the backlog",
        next_action="Triage the oldest ticket",
        tasks=[Task(f"Ticket {i}: fix the flaky test", done=i % 3 == 0) for i in range(n)],
        open_questions=["Which tickets block the release?", "Who is on call?"],
        constraints=["Do not touch the payment code", "Small commits"],
        facts=[Fact(f"Person {i} reported a bug", [f"Person {i}"]) for i in range(n)],
    )


def median_us(call: Callable[[], RecallQuery]) -> float:
    """Median per-call time in microseconds over BATCHES batches of BATCH calls."""
    for _ in range(BATCH):  # warm up
        call()
    samples = []
    gc.disable()
    try:
        for _ in range(BATCHES):
            start = time.perf_counter_ns()
            for _ in range(BATCH):
                call()
            samples.append((time.perf_counter_ns() - start) / BATCH / 1000)
    finally:
        gc.enable()
    return statistics.median(samples)


def main() -> None:
    typical = typical_state()
    small = sized_state(8)
    large = sized_state(100_000)
    assert compose_task_context(small) == compose_task_context(large)

    results = {
        "compose_task_context, typical state": median_us(lambda: compose_task_context(typical)),
        "compose_baseline, typical state": median_us(lambda: compose_baseline(typical)),
        "compose_task_context, 8 tasks + 8 facts": median_us(lambda: compose_task_context(small)),
        "compose_task_context, 100,000 tasks + 100,000 facts": median_us(
            lambda: compose_task_context(large)
        ),
    }
    width = max(map(len, results))
    print(f"median per call ({BATCHES} batches x {BATCH} calls)")
    for name, value in results.items():
        print(f"  {name:<{width}}  {value:8.2f} us")
    typical_us = results["compose_task_context, typical state"]
    baseline_us = results["compose_baseline, typical state"]
    ratio = (
        results["compose_task_context, 100,000 tasks + 100,000 facts"]
        / results["compose_task_context, 8 tasks + 8 facts"]
    )
    print(f"task_context / baseline (typical):  {typical_us / baseline_us:.2f}x")
    print(f"100,000 / 8 (task_context):         {ratio:.2f}x  (target <= {TARGET_RATIO}x)")
    print(
        f"typical task_context vs target:     {typical_us / TARGET_TYPICAL_US:.2f}x of "
        f"{TARGET_TYPICAL_US:.0f} us"
    )


if __name__ == "__main__":
    main()
