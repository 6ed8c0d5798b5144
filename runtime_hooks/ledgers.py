"""Opening a ledger by its location, and finding its admin.

A location is a SQLite file path, a ``postgresql://`` (``postgres://``) DSN, or a libpq
key=value connection string (``host=db.internal dbname=fleet``); which one is decided once, by
:func:`plugin.control.dsn.parse_location`, and a value that looks like a connection string but
cannot be used as one is a :class:`~plugin.errors.LedgerConfigError`, never a file name. This
is the one place that maps a location to a ledger class; the CLI, the configuration and the
bootstrap all go through it.

A URI DSN may name the ledger's PostgreSQL schema in one query parameter of its own, ``schema``
(``postgresql://db.internal/app?schema=recall_fleet``; default ``recallbound``). It is taken
out before the DSN reaches libpq (which knows no such parameter); every other parameter
(``sslmode``, ``connect_timeout``, …) is passed on unchanged.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sqlite3
import stat
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

import anyio

from plugin.control import Ledger, SqliteLedger
from plugin.control.dsn import POSTGRES_SCHEMES as POSTGRES_SCHEMES
from plugin.control.dsn import SCHEMA_PARAMETER as SCHEMA_PARAMETER
from plugin.control.dsn import parse_location, shown_location
from plugin.control.ledger_admin import LedgerAdmin
from plugin.errors import LedgerConfigError, LedgerCorruptError, LedgerError, LedgerPathError

POSTGRES_LEDGER = ("plugin.control.postgres_ledger", "PostgresLedger")
"""Where the PostgreSQL ledger lives (module, class); imported only for a DSN."""


def sqlite_file(location: str | os.PathLike[str]) -> str | None:
    """The file a SQLite location names, as SQLite opens it: a path as it is, a ``file:`` URI's
    path (percent-decoded, its query and any ``//localhost`` authority taken off; relative to
    the working folder when relative); None for a database in memory."""
    text = os.fspath(location)
    if text == ":memory:":
        return None
    if not text.startswith("file:"):
        return text
    path, _, query = text[len("file:"):].partition("#")[0].partition("?")
    if "mode=memory" in query.split("&") or path in ("", ":memory:"):
        return None
    if path.startswith("//"):  # an authority: empty or localhost (SQLite refuses others)
        path = "/" + path[2:].partition("/")[2]
    return urllib.parse.unquote(path)


def redact_location(location: str | os.PathLike[str]) -> str:
    """The location for display: a DSN's password (any form) replaced by ``***``, and a text
    that looks like a connection string but is not one shown by its form alone."""
    return shown_location(location)


def split_postgres_location(dsn: str) -> tuple[str, str | None]:
    """``(dsn for libpq, schema or None)``: the ``schema`` query parameter taken out.

    Raises :class:`~plugin.errors.LedgerConfigError` when it is given twice or empty, or the
    DSN cannot be used (the schema name itself is validated by the ledger).
    """
    parsed = parse_location(dsn)
    return parsed.target, parsed.schema


def _postgres_class() -> Callable[..., AbstractAsyncContextManager[Any]]:
    module_name, class_name = POSTGRES_LEDGER
    try:
        module = importlib.import_module(module_name)
        return cast(Callable[..., AbstractAsyncContextManager[Any]],
                    getattr(module, class_name))
    except (ImportError, AttributeError) as exc:
        raise LedgerConfigError(
            f"a PostgreSQL ledger needs the PostgreSQL ledger (pip install "
            f"'recallbound[postgres]'), which is not available here: {exc}"
        ) from None


@asynccontextmanager
async def open_ledger(
    location: str | os.PathLike[str], *, must_exist: bool = False
) -> AsyncIterator[Ledger]:
    """Open the ledger at ``location`` for the block; ``must_exist`` refuses to create one.

    Raises :class:`~plugin.errors.LedgerError` subclasses (with ``must_exist``, a missing file
    or a missing PostgreSQL schema is :class:`~plugin.errors.LedgerPathError`).
    """
    parsed = parse_location(location)
    if parsed.kind == "postgres":
        options: dict[str, Any] = {"create": not must_exist}
        if parsed.schema is not None:
            options["schema"] = parsed.schema
        async with _postgres_class()(parsed.target, **options) as ledger:
            yield cast(Ledger, ledger)
        return
    path = os.fspath(location)
    file = sqlite_file(path)  # a file: URI names its path, as SQLite opens it
    if must_exist and file is None:
        raise LedgerPathError(f"{path!r} is a database in memory: it holds no ledger to read")
    if must_exist and file is not None:
        await anyio.to_thread.run_sync(_refuse_non_ledger, path, file)
    async with SqliteLedger(path) as ledger:
        yield ledger


def _refuse_non_ledger(location: str, path: str) -> None:
    """A missing file, a folder, an empty file or a SQLite database with no table is never
    opened where a ledger must exist: opening would turn it into a ledger."""
    if os.path.isdir(path):
        raise LedgerPathError(f"{path!r} is a directory, not a ledger file")
    try:
        status = os.stat(path)
    except OSError:
        raise LedgerPathError(f"no ledger file at {location!r}") from None
    if not stat.S_ISREG(status.st_mode):  # a device or a pipe reads as endless or empty
        raise LedgerPathError(f"{path!r} is not a regular file, not a ledger file")
    size = status.st_size
    if size == 0 or _no_tables(path):
        what = "empty (0 bytes)" if size == 0 else "a SQLite database with no tables"
        raise LedgerCorruptError(f"{path!r} is {what}, not a recallbound ledger; no command "
                                 f"creates a ledger")


def _no_tables(path: str) -> bool:
    """Whether ``path`` is a SQLite database holding no table (read only; anything else, a
    ledger or not, is left to the ledger's own checks)."""
    try:
        with contextlib.closing(sqlite3.connect(
                f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro", uri=True)) as db:
            return bool(db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0)
    except (sqlite3.Error, UnicodeDecodeError):  # damaged: the ledger's own checks say how
        return False


def admin_for(ledger: Ledger) -> LedgerAdmin:
    """The admin of an opened ledger: ``ledger.admin()`` (every ledger of recallbound has one)."""
    admin = getattr(ledger, "admin", None)
    if admin is None:
        raise LedgerError(f"{type(ledger).__name__} offers no admin (it needs an admin() method "
                          "returning a LedgerAdmin)")
    return cast(LedgerAdmin, admin())
