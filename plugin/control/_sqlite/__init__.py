"""One SQL code path over two drivers, picked once by the running async library.

asyncio runs SQL through aiosqlite; trio (where aiosqlite cannot run: it completes asyncio
futures from its thread) runs it on a plain :mod:`sqlite3` connection driven by anyio's worker
threads, one call at a time. Both connections use ``isolation_level=None`` so that
transactions are explicit (``BEGIN IMMEDIATE`` … ``COMMIT``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias, TypeVar

import anyio
import anyio.to_thread
import sniffio

from .hold import FileHold, read_header

# Primary result codes (sqlite3 exposes them as names only from Python 3.11 on).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN = 5, 6, 11, 13, 14
_SQLITE_NOTADB = 26

T = TypeVar("T")
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

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the connection's own thread with the raw ``sqlite3`` connection.

        One hop for a whole unit of work (a group commit); ``fn`` must not block on the loop.
        """
        ...


async def connect(path: str | Path, *, timeout: float) -> Connection:
    """Open ``path`` with the driver for the running async library.

    ``timeout`` is SQLite's busy timeout in seconds: how long a statement waits for another
    connection's lock before failing with ``database is locked``.
    """
    hold = None
    if path != ":memory:" and not str(path).startswith("file:"):
        hold = await anyio.to_thread.run_sync(FileHold, str(path))  # it may wait for a read
    try:
        if sniffio.current_async_library() == "asyncio":
            from ._asyncio import connect as connect_asyncio

            return await connect_asyncio(path, timeout=timeout, hold=hold)
        from ._threaded import connect as connect_threaded

        return await connect_threaded(path, timeout=timeout, hold=hold)
    except BaseException:
        if hold is not None:
            hold.release()
        raise


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
    """Whether ``exc`` says the file is not a database or its pages are damaged. Python 3.10's
    driver says so with a bare ``DatabaseError`` (no code, no message) for a schema whose text
    is not UTF-8."""
    if type(exc) is sqlite3.DatabaseError and not str(exc):
        return True
    return _matches(exc, sqlite3.DatabaseError, (_SQLITE_NOTADB, _SQLITE_CORRUPT),
                    ("not a database", "malformed"))


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the database's page limit) is full."""
    return _matches(exc, sqlite3.OperationalError, (_SQLITE_FULL,), ("is full",))


def is_cantopen(exc: BaseException) -> bool:
    """Whether ``exc`` says SQLite could not open the file."""
    return _matches(exc, sqlite3.OperationalError, (_SQLITE_CANTOPEN,), ("unable to open",))


async def path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a database file (a folder, in a missing folder, a name the file
    system refuses: too long, a lone surrogate), or None.

    Checked before SQLite opens it: a clearer message, and no failed ``aiosqlite.connect``
    whose worker thread may call back into an event loop that has closed meanwhile.
    """
    if path == ":memory:" or path.startswith("file:"):
        return None
    candidate = anyio.Path(path)
    try:
        if await candidate.is_dir():
            return "is a folder, not a file"
        if not await (await candidate.absolute()).parent.is_dir():
            return "its folder does not exist"
        with contextlib.suppress(FileNotFoundError):
            info = await candidate.stat()
            if not stat.S_ISREG(info.st_mode):
                return "is not a regular file"  # a pipe or a device: its reads could wait forever
            if info.st_nlink > 1:
                # SQLite names a file's log and lock files after the name it was given: two
                # processes using two names of one file would each keep their own, and write
                # over each other.
                return (f"has {info.st_nlink} names (hard links): SQLite keeps a log per name, "
                        "so they would damage it, and a hard-linked copy is no backup of a "
                        "file that changes in place; keep one name (copy it instead)")
        os.fsencode(path)  # a lone surrogate: SQLite could not be given the name
    except OSError as exc:  # a name too long
        return f"cannot be a file name: {exc.strerror}"
    except UnicodeError:
        return "cannot be a file name: it holds a lone surrogate"
    return None


_HEADER = b"SQLite format 3\x00"


def _foreign(path: str) -> bool:
    start = read_header(path, len(_HEADER))
    return bool(start) and start != _HEADER


async def not_a_database(path: str) -> bool:
    """Whether ``path`` is a file that holds something but not a SQLite header. SQLite takes
    a file shorter than its header for an empty database and would write one over it; such a
    file is refused instead, as a longer foreign file is."""
    if path == ":memory:" or path.startswith("file:"):
        return False
    return await anyio.to_thread.run_sync(_foreign, path)


FileIdentity: TypeAlias = "tuple[str, int, int]"
"""A database file's absolute path, device and inode."""


def file_identity(path: str) -> FileIdentity | None:
    """The file at ``path`` as opened (the path made absolute once, so a later change of
    folder names no other file), or None for an in-memory database or a ``file:`` URI."""
    if path == ":memory:" or path.startswith("file:"):
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    return os.path.abspath(path), info.st_dev, info.st_ino


def still_there(opened: FileIdentity | None) -> bool:
    """Whether the file opened as ``opened`` is still the one at its path. SQLite goes on
    writing to a file deleted or replaced while open: what it commits there no other
    connection, process or later open would see."""
    return opened is None or file_identity(opened[0]) == opened


async def switch_to_wal(conn: Connection, *, timeout: float) -> str:
    """Switch ``conn``'s file to WAL and return the journal mode it is in now.

    A journal-mode switch needs an exclusive lock: while another connection reads the file it
    fails busy (once SQLite's busy handler gives up, or at once), where an ordinary statement
    would have waited its turn; several processes opening one file retry here for up to a
    second beyond ``timeout`` (the busy timeout), then fail with SQLite's own "database is
    locked" error. Shielded.
    """
    try:
        with anyio.fail_after(timeout + 1.0, shield=True):
            while True:
                try:
                    return str((await conn.fetchall("PRAGMA journal_mode=WAL"))[0][0])
                except sqlite3.OperationalError as exc:
                    if not is_locked(exc):
                        raise
                    await anyio.sleep(0.01)
    except TimeoutError:
        raise sqlite3.OperationalError(
            f"database is locked by another connection beyond the busy timeout ({timeout:g} s) "
            "while switching to WAL"
        ) from None


@contextlib.asynccontextmanager
async def immediate(
    conn: Connection, lock: anyio.Lock, *, begin: str = "BEGIN IMMEDIATE"
) -> AsyncIterator[Connection]:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` on ``conn``, one task at a time, shielded.

    ``begin="BEGIN"`` opens a read transaction instead: one consistent snapshot, no write lock.

    ``lock`` serializes the tasks sharing ``conn`` (a transaction must never interleave with
    another task's statements). Once begun, the transaction is shielded from cancellation: a
    task cancelled between ``BEGIN IMMEDIATE`` and ``COMMIT`` would leave the write lock held.
    Any error rolls back and propagates unchanged (callers translate ``sqlite3`` errors).
    """
    async with lock:
        with anyio.CancelScope(shield=True):
            await conn.fetchall(begin)
            try:
                yield conn
                await conn.fetchall("COMMIT")
            except BaseException:
                # The connection may already have rolled back (or be gone): report the cause.
                with contextlib.suppress(sqlite3.Error):
                    await conn.fetchall("ROLLBACK")
                raise


class ThreadSession:
    """A transaction's statements, run at once on the connection's own thread.

    Its methods are coroutines that never suspend, so a transaction written against the async
    session runs unchanged inside :func:`transaction`, in one hop to that thread.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    async def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        return [tuple(row) for row in self._conn.execute(sql, params).fetchall()]

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        self._conn.executemany(sql, rows)


def _complete(awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable``, which must finish without suspending."""
    steps = awaitable.__await__()
    try:
        steps.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    steps.close()
    raise RuntimeError("a one-hop transaction awaited something other than its session")


async def run_transaction(
    conn: Connection, lock: anyio.Lock, body: Callable[[sqlite3.Connection], T], *,
    begin: str = "BEGIN IMMEDIATE", synced: bool = True,
) -> T:
    """``body(raw)`` between ``begin`` and ``COMMIT``, all in one hop to the connection's thread.

    As :func:`immediate` (one task at a time under ``lock``, shielded, any error rolls back and
    propagates unchanged), but a transaction of many statements costs one thread hop, not one
    per statement. ``body`` runs on that thread with the raw connection and must not block on
    the loop.

    ``synced=False`` commits without syncing the file (``synchronous=NORMAL`` for this one
    transaction, the connection's own level before and after): in WAL mode the commit is
    visible to every connection at once and survives the process, and the next synced commit
    on the file makes it durable too (the log is synced as a whole, in order).
    """

    def run(raw: sqlite3.Connection) -> T:
        level = None if synced else int(raw.execute("PRAGMA synchronous").fetchone()[0])
        if level is not None:
            raw.execute("PRAGMA synchronous=NORMAL")
        try:
            return within(raw, body, begin=begin)
        finally:
            if level is not None:
                raw.execute(f"PRAGMA synchronous={level}")

    async with lock:
        with anyio.CancelScope(shield=True):
            result = await conn.run(run)
    return result


class Busy(Exception):
    """Another connection holds the file's write lock: nothing was run."""


def open_now(path: str) -> sqlite3.Connection:
    """A connection on ``path`` for :func:`transaction_now`: it never waits for a lock (busy
    timeout 0), commits without a sync of its own (``synchronous=NORMAL``: durable with the
    next synced commit on the file, which syncs the log as a whole), and leaves checkpoints
    to the file's other connections (so a commit never copies the log into the file)."""
    raw = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    try:
        raw.execute("PRAGMA synchronous=NORMAL")
        raw.execute("PRAGMA wal_autocheckpoint=0")
    except BaseException:
        raw.close()
        raise
    return raw


def transaction_now(raw: sqlite3.Connection, fn: Callable[[ThreadSession], Awaitable[T]]) -> T:
    """``fn`` in one ``BEGIN IMMEDIATE`` transaction on ``raw``, on the calling thread, at once.

    For a short transaction that writes no more than a few rows (a run's opening): it costs
    its statements and a write to the log, not a trip to a worker thread and back. Raises
    :class:`Busy` when another connection holds the write lock (nothing ran: take the
    ordinary path, which waits its turn). Any other error rolls back and propagates unchanged.
    ``raw`` comes from :func:`open_now` and is used by one task at a time (``fn`` never
    suspends, so a call runs whole between two awaits of the loop).
    """
    try:
        return within(raw, lambda held: _complete(fn(ThreadSession(held))))
    except sqlite3.OperationalError as exc:
        if is_locked(exc):  # only BEGIN can be: the write lock, once held, is ours
            raise Busy from exc
        raise


def within(raw: sqlite3.Connection, body: Callable[[sqlite3.Connection], T], *,
           begin: str = "BEGIN IMMEDIATE") -> T:
    """``body(raw)`` between ``begin`` and ``COMMIT`` on the calling thread; any error rolls
    back and propagates unchanged."""
    raw.execute(begin)
    try:
        result = body(raw)
        raw.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            raw.execute("ROLLBACK")
        raise
    return result


async def transaction(
    conn: Connection, lock: anyio.Lock, fn: Callable[[ThreadSession], Awaitable[T]], *,
    begin: str = "BEGIN IMMEDIATE", synced: bool = True,
) -> T:
    """:func:`run_transaction` for a transaction written against the async session: ``fn``
    may await only the session it is given."""
    return await run_transaction(conn, lock, lambda raw: _complete(fn(ThreadSession(raw))),
                                 begin=begin, synced=synced)
