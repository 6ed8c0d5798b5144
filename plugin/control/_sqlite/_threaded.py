"""The trio (and any-loop) driver: a ``sqlite3`` connection confined to one worker at a time."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from . import Params, Row

T = TypeVar("T")


class ThreadedConnection:
    """:class:`~plugin.control._sqlite.Connection` over ``sqlite3`` and anyio worker threads.

    The connection is shared across anyio's worker threads (``check_same_thread=False``) but a
    :class:`anyio.CapacityLimiter` of one lets only one of them touch it at a time.
    """

    def __init__(self, conn: sqlite3.Connection, release: Callable[[], None]) -> None:
        self._conn = conn
        self._release = release
        self._limiter = anyio.CapacityLimiter(1)
        self._closed = False

    async def _run(self, fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn, limiter=self._limiter)

    async def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        conn = self._conn
        return await self._run(lambda: [tuple(r) for r in conn.execute(sql, params).fetchall()])

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        conn = self._conn
        materialized = list(rows)
        await self._run(lambda: conn.executemany(sql, materialized))

    async def executescript(self, script: str) -> None:
        conn = self._conn
        await self._run(lambda: conn.executescript(script))

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        return await self._run(lambda: fn(conn))

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                await self._run(self._conn.close)
            finally:
                self._release()  # closed, or never to be used again


async def connect(
    path: str | Path, *, timeout: float, release: Callable[[], None]
) -> ThreadedConnection:
    def open_() -> sqlite3.Connection:
        return sqlite3.connect(
            path, timeout=timeout, isolation_level=None, check_same_thread=False
        )

    return ThreadedConnection(await anyio.to_thread.run_sync(open_), release)
