"""A ledger file deleted or replaced while a process has it open.

SQLite keeps writing to the file it opened, even once that file has no name: reservations
committed there are lost to every other process and to the next open, so the run's allowance
would be granted again. The ledger refuses instead, with a typed error, and issues no permit.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plugin import AllowancePolicy, ManualClock, RecallAllowance, RoundKind, SqliteLedger
from plugin.errors import LedgerUnavailableError

pytestmark = pytest.mark.anyio


async def _round(ledger: SqliteLedger, run_id: str) -> None:
    allowance = RecallAllowance(ledger, policy=AllowancePolicy(), clock=ManualClock(wall=1e9))
    async with allowance.round(run_id, RoundKind.DELIBERATE, slots=1):
        pass


@pytest.mark.parametrize("fault", ["deleted", "replaced"])
async def test_a_ledger_file_gone_from_its_path_refuses_the_reservation(
    tmp_path: Path, fault: str
) -> None:
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path) as ledger:
        await _round(ledger, "before")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        if fault == "replaced":
            async with SqliteLedger(path) as other:
                assert (await other.usage("before")).rounds == 0
        with pytest.raises(LedgerUnavailableError, match="no longer"):
            await _round(ledger, "after")
    if fault == "replaced":
        async with SqliteLedger(path) as ledger:
            await _round(ledger, "after")  # a new file at the path works as a ledger
            assert (await ledger.usage("after")).rounds == 1
    else:
        assert not os.path.exists(path)


async def test_a_ledger_opened_by_a_relative_path_survives_a_change_of_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is known by the absolute path it had at open: a process that changes its
    working folder later still writes to it."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    async with SqliteLedger("ledger.db") as ledger:
        monkeypatch.chdir(tmp_path / "b")
        await _round(ledger, "moved")
        assert (await ledger.usage("moved")).rounds == 1
    assert not (tmp_path / "b" / "ledger.db").exists()
