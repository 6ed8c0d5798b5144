"""Load: thousands of concurrent agent runs on one SQLite ledger, on asyncio and on trio.

``RECALLBOUND_STRESS=full`` runs the full size (10,000 runs per loop); CI runs 600.
Required: zero over-admission, zero permits left open, every attempt traced.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from plugin.control import AllowancePolicy, ManualClock, RecallAllowance, SqliteLedger

from .workload import check_invariants, load, size

pytestmark = [pytest.mark.anyio, pytest.mark.stress]

RUNS = size(600, 10_000)


async def test_concurrent_runs_never_over_admit(tmp_path: Path) -> None:
    policy = AllowancePolicy()
    run_ids = [f"run-{i}" for i in range(RUNS)]
    async with SqliteLedger(tmp_path / "ledger.db", timeout=60.0) as ledger:
        # A clock that does not move: the deadline must not be what limits the runs here.
        allowance = RecallAllowance(ledger, policy=policy, clock=ManualClock())
        report = await load(allowance, run_ids)
        assert report.runs == RUNS
        assert all(permit.closed for permit in report.permits)
        assert len(report.permits) == 2 * RUNS  # both rounds of every run were granted
        reserved, traced = await check_invariants(ledger, run_ids, policy)
        assert reserved == 4 * RUNS  # automatic 2 + deliberate the 2 left
        assert traced == report.taken == 4 * RUNS  # every slot used once, every one traced
