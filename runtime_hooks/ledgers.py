"""Opening a ledger by its location, and finding its admin.

A location is a SQLite file path or a ``postgresql://`` DSN. This is the one place that maps a
location to a ledger class; the CLI and the bootstrap both go through it.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

import anyio

from plugin.control import Ledger, SqliteLedger
from plugin.control.ledger_admin import LedgerAdmin
from plugin.control.sqlite_admin import SqliteAdmin
from plugin.errors import LedgerError, LedgerPathError

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
POSTGRES_LEDGER = ("plugin.control.postgres_ledger", "PostgresLedger")
"""Where the PostgreSQL ledger lives (module, class); imported only for a DSN."""

_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")


def is_postgres(location: str | os.PathLike[str]) -> bool:
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


def redact_location(location: str | os.PathLike[str]) -> str:
    """The location for display: a DSN's password replaced by ``***``."""
    text = os.fspath(location)
    return _PASSWORD.sub(r"\1***@", text) if is_postgres(text) else text


def _postgres_class() -> Callable[[str], AbstractAsyncContextManager[Any]]:
    module_name, class_name = POSTGRES_LEDGER
    try:
        module = importlib.import_module(module_name)
        return cast(Callable[[str], AbstractAsyncContextManager[Any]],
                    getattr(module, class_name))
    except (ImportError, AttributeError) as exc:
        raise LedgerError(
            f"a postgresql:// ledger needs the PostgreSQL ledger (pip install "
            f"'recallbound[postgres]'), which is not available here: {exc}"
        ) from None


@asynccontextmanager
async def open_ledger(
    location: str | os.PathLike[str], *, must_exist: bool = False
) -> AsyncIterator[Ledger]:
    """Open the ledger at ``location`` for the block; ``must_exist`` refuses to create a file.

    Raises :class:`~plugin.errors.LedgerError` subclasses (a missing file with ``must_exist``
    is :class:`~plugin.errors.LedgerPathError`).
    """
    if is_postgres(location):
        async with _postgres_class()(os.fspath(location)) as ledger:
            yield cast(Ledger, ledger)
        return
    path = os.fspath(location)
    if must_exist and path != ":memory:" and not await anyio.Path(path).is_file():
        raise LedgerPathError(f"no ledger file at {path!r}")
    async with SqliteLedger(path) as ledger:
        yield ledger


def admin_for(ledger: Ledger) -> LedgerAdmin:
    """The admin of an opened ledger: ``SqliteAdmin`` for SQLite, else ``ledger.admin()``."""
    if isinstance(ledger, SqliteLedger):
        return SqliteAdmin(ledger)
    admin = getattr(ledger, "admin", None)
    if admin is None:
        raise LedgerError(f"{type(ledger).__name__} offers no admin (it needs an admin() method "
                          "returning a LedgerAdmin)")
    return cast(LedgerAdmin, admin())
