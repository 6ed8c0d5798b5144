"""A database file this process holds open, opened once more: its locks must hold.

Closing any descriptor of a file drops every POSIX lock the process holds on it, those of its
open SQLite connections too. Another process could then take the file's exclusive lock while
this one reads and writes it: switch its journal mode, or checkpoint and remove the
write-ahead log under it, and the file is damaged or loses commits. Opening a store or a
ledger checks the file's header first; that check must never close a descriptor of a file
this process holds open. Here another process tries to switch the journal mode, which needs
the exclusive lock: while this process holds the file open, it must be refused.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plugin import SqliteLedger
from plugin.memory import MemoryStore
from plugin.memory.store.errors import MemoryStoreCorruptError

from ._loops import LOOPS

pytestmark = pytest.mark.anyio

_SWITCH = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
try:
    print(conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0])
except sqlite3.OperationalError as exc:
    print("refused:", exc)
"""


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


def _another_process_switches_the_journal(path: Path) -> str:
    done = subprocess.run([sys.executable, "-c", _SWITCH, str(path)], capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout.strip()


OPENERS: dict[str, Callable[[Path], Any]] = {
    "store": lambda path: MemoryStore(path),
    "ledger": lambda path: SqliteLedger(path),
}


@pytest.mark.parametrize("kind", sorted(OPENERS))
async def test_opening_a_file_again_keeps_the_first_connections_locks(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / f"{kind}.sqlite3"
    opener = OPENERS[kind]
    async with opener(path):
        assert _another_process_switches_the_journal(path).startswith("refused")
        async with opener(path):
            pass
        assert _another_process_switches_the_journal(path).startswith("refused")
        async with opener(path), opener(tmp_path / ".." / tmp_path.name / f"{kind}.sqlite3"):
            assert _another_process_switches_the_journal(path).startswith("refused")
        assert _another_process_switches_the_journal(path).startswith("refused")
    # closed everywhere in this process: its header is checked again, and nothing holds it
    assert _another_process_switches_the_journal(path) == "delete"


async def test_a_foreign_file_is_still_refused_after_a_store_was_closed(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite3"
    async with MemoryStore(path):
        pass
    path.unlink()
    path.write_bytes(b"not a database at all")
    with pytest.raises(MemoryStoreCorruptError, match="not a SQLite database"):
        async with MemoryStore(path):
            pass
    assert path.read_bytes() == b"not a database at all"
