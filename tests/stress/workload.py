"""The stress workload, shared by tests/stress and bench/bench_stress.py.

One *agent run* is what the hooks do for a turn with automatic recall and six parallel search
calls: an automatic round (a base attempt, then a delta, a People-to-belief read) and a
deliberate round of six parallel calls, each of which also tries a nested belief read. Every
slot taken is counted here, so the ledger's traces can be checked against what really ran.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterable

import anyio
import attrs

from plugin.control import (
    AllowancePolicy,
    AttemptKind,
    AttemptOutcome,
    Ledger,
    Permit,
    RecallAllowance,
    RecallBudgetExceeded,
    RoundKind,
)

SCALE = os.environ.get("RECALLBOUND_STRESS", "ci")
"""``ci`` (the reduced sizes CI runs) or ``full`` (the full sizes each test names)."""


def size(ci: int, full: int) -> int:
    """The size for this scale."""
    return full if SCALE == "full" else ci


@attrs.define
class LoadReport:
    """What a load run did, as the workload itself saw it."""

    runs: int = 0
    taken: int = 0
    """Slots taken (attempts started), counted by the workload."""
    refused_rounds: int = 0
    permits: list[Permit] = attrs.Factory(list)
    round_latencies: list[float] = attrs.Factory(list)
    """Seconds from asking for a round to holding its permit."""
    elapsed: float = 0.0

    @property
    def runs_per_second(self) -> float:
        return self.runs / self.elapsed if self.elapsed else 0.0

    def latency_ms(self, q: float) -> float:
        ordered = sorted(self.round_latencies)
        if not ordered:
            return 0.0
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def median_ms(self) -> float:
        return 1000 * statistics.median(self.round_latencies) if self.round_latencies else 0.0


async def _attempt(permit: Permit, kind: AttemptKind, report: LoadReport) -> bool:
    try:
        async with permit.attempt(kind):
            report.taken += 1
            await anyio.sleep(0)
    except RecallBudgetExceeded:
        return False
    return True


async def agent_run(
    allowance: RecallAllowance,
    run_id: str,
    report: LoadReport,
    *,
    automatic: bool = True,
    deliberate: bool = True,
) -> None:
    """One agent run: an automatic round, then a deliberate round of six parallel calls.

    ``automatic=False`` / ``deliberate=False`` run half of it (a run resumed elsewhere).
    """
    if automatic:
        await _automatic(allowance, run_id, report)
    if deliberate:
        await _deliberate(allowance, run_id, report)
    report.runs += 1


async def _automatic(allowance: RecallAllowance, run_id: str, report: LoadReport) -> None:
    start = time.perf_counter()
    try:
        async with allowance.round(run_id, RoundKind.AUTOMATIC) as permit:
            report.round_latencies.append(time.perf_counter() - start)
            report.permits.append(permit)
            if await _attempt(permit, AttemptKind.BASE, report):
                await _attempt(permit, AttemptKind.DELTA, report)
    except RecallBudgetExceeded:
        report.refused_rounds += 1


async def _deliberate(allowance: RecallAllowance, run_id: str, report: LoadReport) -> None:
    async def call(permit: Permit) -> None:
        try:
            async with permit.attempt(AttemptKind.DELIBERATE):
                report.taken += 1
                await anyio.sleep(0)
                await _attempt(permit, AttemptKind.NESTED, report)
        except RecallBudgetExceeded:
            pass

    start = time.perf_counter()
    try:
        async with allowance.round(run_id, RoundKind.DELIBERATE, slots=6) as permit:
            report.round_latencies.append(time.perf_counter() - start)
            report.permits.append(permit)
            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(call, permit)
    except RecallBudgetExceeded:
        report.refused_rounds += 1


async def load(allowance: RecallAllowance, run_ids: Iterable[str]) -> LoadReport:
    """Every run at once, on this loop."""
    report = LoadReport()
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for run_id in run_ids:
            tg.start_soon(agent_run, allowance, run_id, report)
    report.elapsed = time.perf_counter() - start
    return report


async def check_invariants(
    ledger: Ledger, run_ids: Iterable[str], policy: AllowancePolicy
) -> tuple[int, int]:
    """Assert the allowance held for every run; return (reserved, traced attempts) in all."""
    reserved = traced = 0
    for run_id in run_ids:
        usage = await ledger.usage(run_id)
        assert usage.executed <= usage.reserved <= policy.max_searches, usage
        assert usage.rounds <= policy.max_rounds, usage
        attempts = await ledger.attempts(run_id)
        slots = [a.slot for a in attempts]
        assert len(slots) == len(set(slots)), attempts  # every slot taken once
        assert all(1 <= s <= usage.reserved for s in slots), (slots, usage)
        assert all(a.outcome is not AttemptOutcome.IN_FLIGHT for a in attempts), attempts
        reserved += usage.reserved
        traced += len(attempts)
    return reserved, traced
