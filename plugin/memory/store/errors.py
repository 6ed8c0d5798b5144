"""What can go wrong with the store: its typed errors, and how a driver error maps onto them."""

from __future__ import annotations

import sqlite3

from ...control._sqlite.translate import Family
from ...control._sqlite.translate import translate as translate_sqlite
from ...errors import MemoryStoreError

__all__ = [
    "InvalidMemoryError",
    "MemoryConflictError",
    "MemoryOwnershipError",
    "MemoryStoreClosedError",
    "MemoryStoreCorruptError",
    "MemoryStoreFullError",
    "MemoryStoreLockedError",
    "MemoryStorePathError",
    "translate",
]


class MemoryStorePathError(MemoryStoreError, FileNotFoundError):
    """The store's folder does not exist, or its file cannot be opened."""


class MemoryStoreLockedError(MemoryStoreError):
    """The store stayed locked by another connection beyond the busy timeout."""


class MemoryStoreCorruptError(MemoryStoreError):
    """The file is not a recallbound memory store, or its pages are damaged."""


class MemoryStoreFullError(MemoryStoreError):
    """The store's disk (or its page limit) is full: nothing was committed."""


class MemoryStoreClosedError(MemoryStoreError, RuntimeError):
    """The store was used outside its ``async with`` block."""


class MemoryConflictError(MemoryStoreError, ValueError):
    """An item with this id already exists for this principal and scope."""


class MemoryOwnershipError(MemoryConflictError):
    """A write named a memory id that another principal or scope holds: nothing was written.

    ``id`` is the id; the message never says whose it is.
    """

    def __init__(self, id: str) -> None:
        super().__init__(f"memory id {id!r} belongs to another principal or scope")
        self.id = id


class MemoryIdTakenError(MemoryConflictError):
    """A write named a memory id that a belief or a source of the same cell holds (an id
    names one item of a cell): nothing was written. ``id`` is the id."""

    def __init__(self, id: str) -> None:
        super().__init__(f"memory id {id!r} is held by a belief or a source of this cell")
        self.id = id


class InvalidMemoryError(MemoryStoreError, ValueError):
    """A value handed to a write method is malformed (the message names the field)."""


_FAMILY = Family("memory store", MemoryStoreError, MemoryStorePathError,
                 MemoryStoreLockedError, MemoryStoreFullError, MemoryStoreCorruptError)


def translate(exc: sqlite3.Error | UnicodeDecodeError, *, path: str,
              timeout: float) -> MemoryStoreError:
    """The typed store error for a driver error raised on the store at ``path``."""
    if isinstance(exc, sqlite3.IntegrityError):
        return MemoryConflictError(
            f"memory store {path!r}: an item with this id already exists ({exc})")
    translated = translate_sqlite(exc, _FAMILY, path, timeout)
    assert isinstance(translated, MemoryStoreError)
    return translated
