"""Opening a ledger by its location, and finding its admin.

A location is a SQLite file path or a ``postgresql://`` (``postgres://``) DSN. This is the one
place that maps a location to a ledger class; the CLI, the configuration and the bootstrap all
go through it.

A DSN may name the ledger's PostgreSQL schema in one query parameter of its own, ``schema``
(``postgresql://db.internal/app?schema=recall_fleet``; default ``recallbound``). It is taken
out before the DSN reaches libpq (which knows no such parameter); every other parameter
(``sslmode``, ``connect_timeout``, …) is passed on unchanged.
"""

from __future__ import annotations

import importlib
import os
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

import anyio

from plugin.control import Ledger, SqliteLedger
from plugin.control.ledger_admin import LedgerAdmin
from plugin.errors import LedgerConfigError, LedgerError, LedgerPathError

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
POSTGRES_LEDGER = ("plugin.control.postgres_ledger", "PostgresLedger")
"""Where the PostgreSQL ledger lives (module, class); imported only for a DSN."""

SCHEMA_PARAMETER = "schema"
"""The DSN query parameter that names the ledger's schema (recallbound's, not libpq's)."""

_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")
_PASSWORD_PARAMETER = re.compile(r"([?&]password=)[^&#]*")


def is_postgres(location: str | os.PathLike[str]) -> bool:
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


def redact_location(location: str | os.PathLike[str]) -> str:
    """The location for display: a DSN's password replaced by ``***``."""
    text = os.fspath(location)
    if not is_postgres(text):
        return text
    return _PASSWORD_PARAMETER.sub(r"\1***", _PASSWORD.sub(r"\1***@", text))


def split_postgres_location(dsn: str) -> tuple[str, str | None]:
    """``(dsn for libpq, schema or None)``: the ``schema`` query parameter taken out.

    Raises :class:`~plugin.errors.LedgerConfigError` when it is given twice or empty (the
    schema name itself is validated by the ledger).
    """
    base, mark, rest = dsn.partition("?")
    if not mark:
        return dsn, None
    query, hash_, fragment = rest.partition("#")
    kept: list[str] = []
    schemas: list[str] = []
    for item in query.split("&"):
        key, _, value = item.partition("=")
        if urllib.parse.unquote_plus(key) == SCHEMA_PARAMETER:
            schemas.append(urllib.parse.unquote_plus(value))
        elif item:
            kept.append(item)
    if len(schemas) > 1:
        raise LedgerConfigError(f"the ledger DSN names the {SCHEMA_PARAMETER!r} parameter "
                                f"{len(schemas)} times; give it once")
    if schemas and not schemas[0]:
        raise LedgerConfigError(f"the ledger DSN's {SCHEMA_PARAMETER!r} parameter is empty")
    query = "&".join(kept)
    rebuilt = base + ("?" + query if query else "") + hash_ + fragment
    return rebuilt, schemas[0] if schemas else None


def _postgres_class() -> Callable[..., AbstractAsyncContextManager[Any]]:
    module_name, class_name = POSTGRES_LEDGER
    try:
        module = importlib.import_module(module_name)
        return cast(Callable[..., AbstractAsyncContextManager[Any]],
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
    """Open the ledger at ``location`` for the block; ``must_exist`` refuses to create one.

    Raises :class:`~plugin.errors.LedgerError` subclasses (with ``must_exist``, a missing file
    or a missing PostgreSQL schema is :class:`~plugin.errors.LedgerPathError`).
    """
    if is_postgres(location):
        dsn, schema = split_postgres_location(os.fspath(location))
        options: dict[str, Any] = {"create": not must_exist}
        if schema is not None:
            options["schema"] = schema
        async with _postgres_class()(dsn, **options) as ledger:
            yield cast(Ledger, ledger)
        return
    path = os.fspath(location)
    if must_exist and path != ":memory:" and not await anyio.Path(path).is_file():
        raise LedgerPathError(f"no ledger file at {path!r}")
    async with SqliteLedger(path) as ledger:
        yield ledger


def admin_for(ledger: Ledger) -> LedgerAdmin:
    """The admin of an opened ledger: ``ledger.admin()`` (every ledger of recallbound has one)."""
    admin = getattr(ledger, "admin", None)
    if admin is None:
        raise LedgerError(f"{type(ledger).__name__} offers no admin (it needs an admin() method "
                          "returning a LedgerAdmin)")
    return cast(LedgerAdmin, admin())
