"""Several processes share one ledger file; runs resume on a different process mid-way.

``RECALLBOUND_STRESS=full``: 4 workers x 1,000 runs; CI: 4 x 150. Each run's automatic round
happens in one worker and its deliberate round in another (a resume), two of the workers on
asyncio and two on trio, all at once. The invariants are checked on the file afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugin.control import AllowancePolicy, SqliteLedger

from .workload import check_invariants, size

pytestmark = [pytest.mark.anyio, pytest.mark.stress, pytest.mark.slow]

WORKERS = 4
PER_WORKER = size(150, 1000)
WALL = 1_700_000_000.0
ROOT = Path(__file__).resolve().parents[2]


def _start(
    path: Path, backend: str, run_ids: list[str], *, automatic: bool, deliberate: bool
) -> subprocess.Popen[str]:
    args = {
        "path": str(path), "backend": backend, "run_ids": run_ids, "wall": WALL,
        "automatic": automatic, "deliberate": deliberate,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.stress._worker", "runs", json.dumps(args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )


def _finish(procs: list[subprocess.Popen[str]]) -> int:
    taken = 0
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        taken += json.loads(out.strip().splitlines()[-1])["taken"]
    return taken


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the parent only reads the file


async def test_workers_on_one_file_never_over_admit_across_resumes(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    groups = [[f"run-{w}-{i}" for i in range(PER_WORKER)] for w in range(WORKERS)]
    backends = ["asyncio", "trio"] * (WORKERS // 2)
    # Each group's automatic rounds run in worker w; the runs are then resumed by worker
    # w + 1 (a different process, on the other loop) for their deliberate rounds; a third
    # pass, by worker w + 2, tries the whole run again and must be refused throughout.
    taken = _finish([
        _start(path, backends[w], groups[w], automatic=True, deliberate=False)
        for w in range(WORKERS)
    ])
    taken += _finish([
        _start(path, backends[(w + 1) % WORKERS], groups[w], automatic=False, deliberate=True)
        for w in range(WORKERS)
    ])
    again = _finish([
        _start(path, backends[(w + 2) % WORKERS], groups[w], automatic=True, deliberate=True)
        for w in range(WORKERS)
    ])
    assert again == 0
    run_ids = [run_id for group in groups for run_id in group]
    async with SqliteLedger(path) as ledger:
        reserved, traced = await check_invariants(ledger, run_ids, AllowancePolicy())
    assert reserved == 4 * len(run_ids)
    assert traced == taken == 4 * len(run_ids)
