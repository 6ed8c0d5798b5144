"""The asyncio driver: aiosqlite."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import aiosqlite
import anyio
import anyio.to_thread

from . import Params, Row


class AiosqliteConnection:
    """:class:`~plugin.control._sqlite.Connection` over an :class:`aiosqlite.Connection`."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn
        self._closed = False

    async def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        rows = await self._conn.execute_fetchall(sql, params)
        return [tuple(row) for row in rows]

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        await self._conn.executemany(sql, rows)

    async def executescript(self, script: str) -> None:
        await self._conn.executescript(script)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._conn.close()


async def connect(path: str | Path, *, timeout: float) -> AiosqliteConnection:
    pending = aiosqlite.connect(path, timeout=timeout, isolation_level=None)
    try:
        conn = await pending
    except BaseException:
        # aiosqlite stops its worker thread on a failed connect, but the thread may still be
        # about to call back into the loop; wait for it so nothing outlives this call.
        await anyio.to_thread.run_sync(pending._thread.join)
        raise
    return AiosqliteConnection(conn)
