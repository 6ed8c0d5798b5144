"""The trio (and any-loop) driver: a ``sqlite3`` connection confined to one worker at a time."""

from __future__ import annotations

import os
import sqlite3
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from . import Params, Row
from .hold import FileHold, close_in_owner, forked

T = TypeVar("T")


class ThreadedConnection:
    """:class:`~plugin.control._sqlite.Connection` over ``sqlite3`` and anyio worker threads.

    The connection is shared across anyio's worker threads (``check_same_thread=False``) but a
    :class:`anyio.CapacityLimiter` of one lets only one of them touch it at a time.
    """

    def __init__(self, conn: sqlite3.Connection, hold: FileHold | None) -> None:
        self._conn = conn
        self._hold = hold
        self._pid = os.getpid()
        self._limiter = anyio.CapacityLimiter(1)
        self._closed = False
        if hold is not None:
            hold.opened()
            weakref.finalize(self, hold.release)  # collected, its connection is closed too

    async def _run(self, fn: Callable[[], T]) -> T:
        if os.getpid() != self._pid:
            raise forked(self._pid)
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
            await close_in_owner(self._pid, self._hold, lambda: self._run(self._conn.close))


async def connect(
    path: str | Path, *, timeout: float, hold: FileHold | None
) -> ThreadedConnection:
    def open_() -> sqlite3.Connection:
        return sqlite3.connect(
            path, timeout=timeout, isolation_level=None, check_same_thread=False
        )

    return ThreadedConnection(await anyio.to_thread.run_sync(open_), hold)
