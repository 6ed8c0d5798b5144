"""The asyncio driver: aiosqlite."""

from __future__ import annotations

import os
import sqlite3
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import aiosqlite
import anyio
import anyio.to_thread

from . import Params, Row
from .hold import FileHold, close_in_owner, forked

T = TypeVar("T")


class AiosqliteConnection:
    """:class:`~plugin.control._sqlite.Connection` over an :class:`aiosqlite.Connection`."""

    def __init__(self, conn: aiosqlite.Connection, hold: FileHold | None) -> None:
        self._conn = conn
        self._hold = hold
        self._pid = os.getpid()
        self._closed = False
        if hold is not None:
            hold.opened()
            # aiosqlite's thread keeps an unclosed connection alive: collected, it is closed
            weakref.finalize(conn, hold.release)

    def _here(self) -> aiosqlite.Connection:
        if os.getpid() != self._pid:
            raise forked(self._pid)
        return self._conn

    async def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        rows = await self._here().execute_fetchall(sql, params)
        return [tuple(row) for row in rows]

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        await self._here().executemany(sql, rows)

    async def executescript(self, script: str) -> None:
        await self._here().executescript(script)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        # aiosqlite runs every call on the connection's one thread; ``_execute`` is how its own
        # methods get there (stable since aiosqlite 0.17; tests exercise it on every run).
        conn = self._here()
        result: T = await conn._execute(lambda: fn(conn._conn))  # type: ignore[no-untyped-call]
        return result

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await close_in_owner(self._pid, self._hold, self._conn.close)


async def connect(
    path: str | Path, *, timeout: float, hold: FileHold | None
) -> AiosqliteConnection:
    pending = aiosqlite.connect(path, timeout=timeout, isolation_level=None)
    try:
        conn = await pending
    except BaseException:
        # aiosqlite stops its worker thread on a failed connect, but the thread may still be
        # about to call back into the loop; wait for it so nothing outlives this call.
        await anyio.to_thread.run_sync(pending._thread.join)
        raise
    return AiosqliteConnection(conn, hold)
