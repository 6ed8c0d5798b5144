"""Ledger locations: which database a string names, and the one redaction of its password.

A location is one of:

- a PostgreSQL URI, ``postgresql://`` or ``postgres://`` (its query may carry ``schema=NAME``,
  recallbound's own parameter, taken out before the DSN reaches libpq);
- a libpq key=value connection string, ``host=db.internal dbname=fleet user=app`` (parsed by
  psycopg's own parser, so it needs the ``postgres`` extra; it has no ``schema`` keyword, the
  ledger's schema is then the default ``recallbound``);
- anything else is a SQLite file path (or a ``file:`` URI, or ``:memory:``).

A value that looks like a connection string (a ``scheme://``, a leading ``word=``) and cannot
be used as one is a :class:`~plugin.errors.LedgerConfigError`, never a SQLite file name: a
worker that silently opened a file of its own would grant a fleet's run its allowance again.
To name a SQLite file whose name starts with ``word=``, write ``./word=...``.

:func:`redact` is the one redaction every output uses (``config show``, the ledger CLI, logs,
error messages): a password never appears, in any form.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any, Literal

import attrs

from plugin.errors import LedgerConfigError

__all__ = ["LedgerLocation", "POSTGRES_SCHEMES", "SCHEMA_PARAMETER", "parse_location",
           "password_of", "redact"]

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
SCHEMA_PARAMETER = "schema"
"""The DSN query parameter that names the ledger's schema (recallbound's, not libpq's)."""

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_KEYWORD = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*=")
_POSTGRESISH = re.compile(r"(?i)\s*postgres(ql)?\b")

# What a password looks like in a DSN or a message: a URI's userinfo (``//user:secret@``), a
# ``password=`` keyword or query parameter (quoted or not).
_URI_PASSWORD = re.compile(r"(://[^:/@?#\s]*:)[^\s]*@")
_KEYWORD_PASSWORD = re.compile(
    r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&#]*)")
_QUOTED = re.compile(r'"[^"]*"')
_SECRET_ENV = "PGPASSWORD"
_HIDDEN = "***"


@attrs.frozen(kw_only=True)
class LedgerLocation:
    """A parsed ledger location: a SQLite ``path``, or a PostgreSQL ``dsn`` (+ ``schema``)."""

    kind: Literal["sqlite", "postgres"]
    target: str
    """The SQLite path, or the DSN for libpq (the ``schema`` parameter taken out)."""
    schema: str | None = None


def _form(text: str) -> str:
    """What an unusable location is, for an error, without its text (it may hold a password)."""
    scheme = _SCHEME.match(text.strip())
    if scheme is not None and not _KEYWORD.match(text):
        return f"a {scheme.group(0)} URI"
    return "a key=value string"


def _conninfo_to_dict(dsn: str) -> dict[str, Any]:
    """psycopg's own parser; without the ``postgres`` extra a connection string is an error."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise LedgerConfigError(
            f"the ledger ({_form(dsn)}) is a PostgreSQL connection string, which needs the "
            f"postgres extra (pip install 'recallbound[postgres]')") from None
    try:
        return conninfo_to_dict(dsn)
    except Exception as exc:  # psycopg.ProgrammingError: libpq could not parse it
        # libpq quotes the fragment it stumbled on, which may be a password: never shown.
        message = _QUOTED.sub('"..."', " ".join(str(exc).split()))
        raise LedgerConfigError(
            f"the ledger ({_form(dsn)}) looks like a PostgreSQL connection string but "
            f"cannot be used as one: {redact(message)}") from None


def _split_schema(dsn: str) -> tuple[str, str | None]:
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


def parse_location(location: str | os.PathLike[str]) -> LedgerLocation:
    """Which ledger ``location`` names (see the module doc).

    Raises :class:`~plugin.errors.LedgerConfigError` (a ``ConfigError``) for a value that looks
    like a connection string and cannot be used as one; its message never holds a password.
    """
    if not isinstance(location, str):
        return LedgerLocation(kind="sqlite", target=os.fspath(location))
    text = location.strip()
    if text.startswith(POSTGRES_SCHEMES):
        dsn, schema = _split_schema(text)
        _conninfo_to_dict(dsn)
        return LedgerLocation(kind="postgres", target=dsn, schema=schema)
    if _URI.match(text) and not text.lower().startswith("file:"):
        raise LedgerConfigError(
            f"the ledger ({_form(text)}) is a URI recallbound cannot open: a ledger is a "
            f"postgresql:// or postgres:// DSN, a libpq key=value string, or a SQLite file path")
    if _KEYWORD.match(text):
        _conninfo_to_dict(text)
        return LedgerLocation(kind="postgres", target=text)
    if _POSTGRESISH.match(text) and _SCHEME.match(text):
        raise LedgerConfigError(
            f"the ledger ({_form(text)}) looks like a PostgreSQL DSN but is not one: write "
            f"postgresql://host/dbname")
    return LedgerLocation(kind="sqlite", target=location)


def password_of(dsn: str) -> str | None:
    """The password a DSN carries (either form), or ``None``; never raises."""
    try:
        from psycopg.conninfo import conninfo_to_dict
        value = conninfo_to_dict(dsn).get("password")
    except Exception:
        return None
    return value if isinstance(value, str) and value else None


def _secrets(dsn: str | None = None) -> tuple[str, ...]:
    found = [os.environ.get(_SECRET_ENV, "")]
    if dsn is not None:
        found.append(password_of(dsn) or "")
    return tuple(found)


def redact(text: str | os.PathLike[str], *, secrets: Iterable[str | None] = ()) -> str:
    """``text`` (a DSN, or any message) with every password replaced by ``***``.

    Hidden: a URI's userinfo password, a ``password=`` keyword or query parameter, each of
    ``secrets`` and the value of ``PGPASSWORD`` wherever they appear (also percent-encoded).
    """
    shown = os.fspath(text)
    shown = _URI_PASSWORD.sub(rf"\1{_HIDDEN}@", shown)
    shown = _KEYWORD_PASSWORD.sub(rf"\1{_HIDDEN}", shown)
    literal = {s for s in (*secrets, *_secrets()) if s}
    for secret in sorted(literal, key=len, reverse=True):
        for form in {secret, urllib.parse.quote(secret, safe=""),
                     urllib.parse.quote_plus(secret)}:
            shown = shown.replace(form, _HIDDEN)
    return shown
