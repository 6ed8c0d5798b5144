"""What can go wrong with the store: its typed errors, and how a driver error maps onto them."""

from __future__ import annotations

import sqlite3

from ...control._sqlite import is_cantopen, is_corrupt, is_full, is_locked
from ...errors import (
    MemoryStoreError,
    StorageClosedError,
    StorageCorruptError,
    StorageFullError,
    StorageLockedError,
    StorageUnavailableError,
)

__all__ = [
    "InvalidMemoryError",
    "MemoryConflictError",
    "MemoryStoreClosedError",
    "MemoryStoreCorruptError",
    "MemoryStoreFullError",
    "MemoryStoreLockedError",
    "MemoryStorePathError",
    "translate",
]


class MemoryStorePathError(MemoryStoreError, StorageUnavailableError, FileNotFoundError):
    """The store's folder does not exist, or its file cannot be opened."""


class MemoryStoreLockedError(MemoryStoreError, StorageLockedError):
    """The store stayed locked by another connection beyond the busy timeout."""


class MemoryStoreCorruptError(MemoryStoreError, StorageCorruptError):
    """The file is not a recallbound memory store, or its pages are damaged."""


class MemoryStoreFullError(MemoryStoreError, StorageFullError):
    """The store's disk (or its page limit) is full: nothing was committed."""


class MemoryStoreClosedError(MemoryStoreError, StorageClosedError):
    """The store was used outside its ``async with`` block."""


class MemoryConflictError(MemoryStoreError, ValueError):
    """An item with this id already exists for this principal and scope."""


class InvalidMemoryError(MemoryStoreError, ValueError):
    """A value handed to a write method is malformed (the message names the field)."""


def translate(exc: sqlite3.Error, *, path: str, timeout: float) -> MemoryStoreError:
    """The typed store error for a driver error raised on the store at ``path``."""
    where = f"memory store {path!r}"
    if is_locked(exc):
        return MemoryStoreLockedError(f"{where} stayed locked beyond {timeout}s: {exc}")
    if is_full(exc):
        return MemoryStoreFullError(f"{where} cannot grow: {exc}")
    if is_corrupt(exc):
        return MemoryStoreCorruptError(f"{where} is not a database or is damaged: {exc}")
    if is_cantopen(exc):
        return MemoryStorePathError(f"{where} cannot be opened (does its folder exist?)")
    if isinstance(exc, sqlite3.IntegrityError):
        return MemoryConflictError(f"{where}: an item with this id already exists ({exc})")
    return MemoryStoreError(f"{where} failed: {exc}")
