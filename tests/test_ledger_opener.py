"""The one SQLite opener that the ledger and the memory store share, on asyncio and trio.

Switching a file to WAL needs an exclusive lock: while another connection reads the file the
switch fails busy (once SQLite's busy handler gives up). Both the ledger and the store open
through :func:`plugin.control._sqlite.switch_to_wal`, which tries the switch again. Here the
first attempt finds a reader holding the file (a short busy timeout); the reader lets go as
soon as that attempt has failed (no sleep, no timing), and the open must succeed in WAL.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import plugin.memory.store.database as store_database
from plugin.control import SqliteLedger, _sqlite
from plugin.memory.store import MemoryStore

pytestmark = pytest.mark.anyio


class _ReleasingOnBusy:
    """A connection whose first failed switch to WAL releases the reader that blocked it."""

    def __init__(self, conn: _sqlite.Connection, reader: sqlite3.Connection,
                 attempts: list[str]) -> None:
        self._conn = conn
        self._reader = reader
        self._attempts = attempts

    async def fetchall(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        try:
            return await self._conn.fetchall(sql, params)
        except sqlite3.OperationalError:
            if sql.startswith("PRAGMA journal_mode=WAL"):
                self._attempts.append("busy")
                if self._reader.in_transaction:
                    self._reader.execute("COMMIT")  # the reader lets go; a retry succeeds
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _patch(monkeypatch: pytest.MonkeyPatch, module: Any, reader: sqlite3.Connection,
           attempts: list[str]) -> None:
    connect = _sqlite.connect

    async def releasing(path: Any, *, timeout: float) -> Any:
        return _ReleasingOnBusy(await connect(path, timeout=timeout), reader, attempts)

    monkeypatch.setattr(module, "connect", releasing)


def _journal_mode(path: Path) -> str:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    conn.close()
    return mode


@pytest.mark.parametrize("opener", ["store", "ledger"])
async def test_a_busy_switch_to_wal_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opener: str
) -> None:
    path = tmp_path / f"{opener}.db"
    sqlite3.connect(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN")
    holder.execute("SELECT count(*) FROM sqlite_schema").fetchall()  # a read lock, no table
    attempts: list[str] = []
    _patch(monkeypatch, store_database if opener == "store" else _sqlite, holder, attempts)
    opened = MemoryStore(path, timeout=0.1) if opener == "store" else SqliteLedger(path,
                                                                                  timeout=0.1)
    try:
        async with opened:
            pass
    finally:
        holder.close()
    assert attempts == ["busy"]  # the first switch found the file busy, the retry did not
    assert _journal_mode(path) == "wal"
