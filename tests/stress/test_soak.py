"""Soak: memory, file descriptors and threads stay flat over many rounds.

``RECALLBOUND_STRESS=full``: 100,000 rounds per loop; CI: 12,000. Rounds run 64 at a time on
one SQLite ledger (fresh runs, an attempt each). After a warm-up quarter, RSS may grow by at
most a few MiB (SQLite's page cache and allocator noise, the process-wide anchors reaching
their cap); descriptors and threads not at all.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import anyio
import pytest

from plugin.control import AllowancePolicy, ManualClock, RecallAllowance, RoundKind, SqliteLedger

from .workload import size

pytestmark = [pytest.mark.anyio, pytest.mark.stress]

ROUNDS = size(12_000, 100_000)
WIDTH = 64
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


async def test_resources_stay_flat(tmp_path: Path) -> None:
    policy = AllowancePolicy(max_searches=1, max_rounds=1, automatic_slots=1)
    samples: list[tuple[int, int, int]] = []
    async with SqliteLedger(tmp_path / "ledger.db", timeout=60.0) as ledger:
        allowance = RecallAllowance(ledger, policy=policy, clock=ManualClock())

        async def rounds(ids: range) -> None:
            for i in ids:
                async with allowance.round(f"soak-{i}", RoundKind.AUTOMATIC) as permit:
                    async with permit.attempt():
                        pass

        done = 0
        step = ROUNDS // 8
        while done < ROUNDS:
            async with anyio.create_task_group() as tg:
                for lane in range(WIDTH):
                    tg.start_soon(rounds, range(done + lane, done + step, WIDTH))
            done += step
            samples.append((_rss(), _fds(), threading.active_count()))
        assert (await ledger.usage(f"soak-{ROUNDS - 1}")).executed == 1
    warm = samples[1]
    last = samples[-1]
    assert last[1] == warm[1], samples  # descriptors
    assert last[2] <= warm[2], samples  # threads (anyio's idle workers may retire)
    assert last[0] - warm[0] < 8 * 2**20, [s[0] // 2**20 for s in samples]  # RSS, bytes
