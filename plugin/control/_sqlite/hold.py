"""This process's hold on its database files, so that reading a file's header never drops the
locks of a connection that has the file open.

Closing any descriptor of a file drops every POSIX lock the process holds on that file, the
locks of its open SQLite connections included: another process could then switch the file's
journal mode, or checkpoint and remove its write-ahead log under them, and the file is damaged
or loses commits (SQLite's "How To Corrupt An SQLite Database File", section 2.2). A connection
holds its file from before it opens (by the real path it names) and, once open, by the file
itself (device and inode, whatever name reaches it), until it is closed or collected;
:func:`read_header` reads no file this process holds, and a connection of a file whose header
is being read waits for the read to end before it opens. The lock guards counters only: no
file is touched while it is held, so a read that stalls holds up no other file's open or close.
"""

from __future__ import annotations

import collections
import os
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

K = TypeVar("K")

_OPENING: collections.Counter[str] = collections.Counter()
"""Real paths of this process's connections that are opening now (no file to name yet)."""
_OPEN: collections.Counter[tuple[int, int]] = collections.Counter()
"""(device, inode) of the files this process's connections have open."""
_READING: collections.Counter[str] = collections.Counter()
"""Real paths whose header is being read now."""
_LOCK = threading.Condition()


def _drop(counts: collections.Counter[K], key: K) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]


class FileHold:
    """One connection's hold on its database file; :meth:`release` is idempotent, and does
    nothing in a process that ``fork`` made (which holds nothing). Made in a worker thread:
    it may wait for a header read of the same file to end."""

    __slots__ = ("__weakref__", "_file", "_path", "_pid", "_released")

    def __init__(self, path: str) -> None:
        self._path = os.path.realpath(path)
        self._file: tuple[int, int] | None = None
        self._pid = os.getpid()
        self._released = False
        with _LOCK:
            _LOCK.wait_for(lambda: not _READING[self._path])
            _OPENING[self._path] += 1

    def opened(self) -> None:
        """The connection is open: hold the file it opened, by device and inode (a file it
        cannot find stays held by its path)."""
        try:
            info = os.stat(self._path)
        except OSError:
            return
        with _LOCK:
            if self._released or self._file is not None or os.getpid() != self._pid:
                return
            self._file = (info.st_dev, info.st_ino)
            _OPEN[self._file] += 1
            _drop(_OPENING, self._path)

    def release(self) -> None:
        with _LOCK:
            if self._released or os.getpid() != self._pid:
                return
            self._released = True
            if self._file is None:
                _drop(_OPENING, self._path)
            else:
                _drop(_OPEN, self._file)


def _forget_in_child() -> None:
    """A process that ``fork`` made holds nothing: POSIX locks are not inherited (and the
    connections it inherits refuse to work), and a lock another thread held is not held here."""
    global _LOCK
    _LOCK = threading.Condition()
    _OPENING.clear()
    _OPEN.clear()
    _READING.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def read_header(path: str, size: int) -> bytes | None:
    """The first ``size`` bytes of the regular file at ``path``, or None when it cannot be
    read or this process holds it (it was read when its first connection opened), so no
    descriptor of a held file is ever closed here."""
    real = os.path.realpath(path)
    try:
        info = os.stat(path)
    except OSError:  # missing or unreadable: SQLite's own open says which
        return None
    with _LOCK:
        if (info.st_dev, info.st_ino) in _OPEN or real in _OPENING:
            return None
        _READING[real] += 1
    try:
        with open(path, "rb") as file:
            return file.read(size)
    except OSError:
        return None
    finally:
        with _LOCK:
            _drop(_READING, real)
            _LOCK.notify_all()


def forked(opened_by: int) -> sqlite3.InterfaceError:
    """The error of a connection used in a process that ``fork`` made of the one that opened
    it: its driver's thread is not there (aiosqlite would wait for it forever), and SQLite
    forbids carrying a connection across ``fork``."""
    return sqlite3.InterfaceError(
        f"this connection was opened by process {opened_by}, not this one: a process made "
        "by fork must open the database again")


async def close_in_owner(
    opened_by: int, hold: FileHold | None, close: Callable[[], Awaitable[object]]
) -> None:
    """Close a connection in the process that opened it, then release its hold (closed, or
    never to be used again). In a process that ``fork`` made it is left alone: the parent's
    connection, whose thread is not here, and which the parent closes."""
    if os.getpid() != opened_by:
        return
    try:
        await close()
    finally:
        if hold is not None:
            hold.release()
