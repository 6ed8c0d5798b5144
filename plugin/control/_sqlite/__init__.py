"""One SQL code path over two drivers, picked once by the running async library.

asyncio runs SQL through aiosqlite; trio (where aiosqlite cannot run: it completes asyncio
futures from its thread) runs it on a plain :mod:`sqlite3` connection driven by anyio's worker
threads, one call at a time. Both connections use ``isolation_level=None`` so that
transactions are explicit (``BEGIN IMMEDIATE`` … ``COMMIT``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import sniffio

# Primary result codes (sqlite3 exposes them as names only from Python 3.11 on).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26

Params: TypeAlias = "Sequence[Any] | Mapping[str, Any]"
Row: TypeAlias = "tuple[Any, ...]"


class Connection(Protocol):
    """An async SQLite connection; every method is one hop to the connection's thread."""

    async def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        """Execute one statement and return all of its rows."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        """Execute one statement once per parameter set."""
        ...

    async def executescript(self, script: str) -> None:
        """Execute several statements (no parameters)."""
        ...

    async def close(self) -> None:
        """Close the connection; idempotent."""
        ...


async def connect(path: str | Path, *, timeout: float) -> Connection:
    """Open ``path`` with the driver for the running async library.

    ``timeout`` is SQLite's busy timeout in seconds: how long a statement waits for another
    connection's lock before failing with ``database is locked``.
    """
    if sniffio.current_async_library() == "asyncio":
        from ._asyncio import connect as connect_asyncio

        return await connect_asyncio(path, timeout=timeout)
    from ._threaded import connect as connect_threaded

    return await connect_threaded(path, timeout=timeout)


def _matches(
    exc: BaseException, kind: type[sqlite3.Error], codes: tuple[int, ...], words: tuple[str, ...]
) -> bool:
    """Whether ``exc`` is ``kind`` with a primary result code in ``codes``.

    ``sqlite_errorcode`` exists from Python 3.11; before that the message is all there is.
    """
    if not isinstance(exc, kind):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in codes
    return any(word in str(exc) for word in words)


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's SQLITE_BUSY/SQLITE_LOCKED."""
    return _matches(exc, sqlite3.OperationalError, (_SQLITE_BUSY, _SQLITE_LOCKED),
                    ("locked", "busy"))


def is_corrupt(exc: BaseException) -> bool:
    """Whether ``exc`` says the file is not a database or its pages are damaged."""
    return _matches(exc, sqlite3.DatabaseError, (_SQLITE_NOTADB, _SQLITE_CORRUPT),
                    ("not a database", "malformed"))
