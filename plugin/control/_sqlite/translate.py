"""One translator from a SQLite driver error to the typed storage error, by cause.

The ledger and the memory store each name their classes (a :class:`Family`); the cause is
read here once, for both: locked, full, corrupt, cannot open, or another failure.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import attrs

from plugin.errors import RecallboundError

from ..dsn import redact
from . import is_cantopen, is_corrupt, is_full, is_locked


@attrs.frozen
class Family:
    """One store's error classes, by cause (the ledger's, or the memory store's)."""

    name: str
    """How messages name the store: ``ledger``, ``memory store``."""
    failed: type[RecallboundError]
    unavailable: type[RecallboundError]
    locked: type[RecallboundError]
    full: type[RecallboundError]
    corrupt: type[RecallboundError]


def translate(exc: BaseException, family: Family, path: str,
              timeout: float | None = None) -> RecallboundError:
    """The typed error of ``family`` for the driver error ``exc`` raised on ``path``."""
    where = f"{family.name} {redact(os.fspath(path))!r}"
    if is_locked(exc):
        limit = "its busy timeout" if timeout is None else f"{timeout}s"
        return family.locked(f"{where} stayed locked beyond {limit}: {exc}")
    if is_full(exc):
        return family.full(f"{where} cannot grow (the disk or its page limit is full): {exc}")
    if is_corrupt(exc):
        return family.corrupt(f"{where} is not a readable SQLite database or is damaged: "
                              f"{exc}")
    if isinstance(exc, sqlite3.OperationalError) and "no such" in str(exc):
        return family.corrupt(f"{where}: a table or column is missing: {exc}")
    if isinstance(exc, UnicodeDecodeError) or (isinstance(exc, sqlite3.OperationalError) and any(
            words in str(exc) for words in ("decode to UTF-8", "overflow"))):
        # text that is not UTF-8, or numbers whose sum overflows: values no writer stored
        return family.corrupt(f"{where} holds a damaged value: {exc}")
    if is_cantopen(exc):
        return family.unavailable(f"{where} cannot be opened ({_why_not(path)}): {exc}")
    return family.failed(f"{where} failed: {exc}")


def _why_not(path: str) -> str:
    """The likely reason a database file cannot be opened, for its error message."""
    file = Path(path)
    if file.exists():
        return "the file exists: is it readable and writable by this user?"
    if not file.parent.is_dir():
        return "its folder does not exist"
    if not os.access(file.parent, os.W_OK | os.X_OK):
        return "its folder is not writable by this user"
    return "does its folder exist?"
