"""A ledger URI's own ``?schema=`` parameter: where a URI's query begins, the schema taken out
of it before libpq sees the DSN, and what a schema name may be."""

from __future__ import annotations

import re
import urllib.parse

from plugin.errors import LedgerConfigError

SCHEMA_PARAMETER = "schema"
"""recallbound's own query parameter of a ledger URI (libpq never sees it)."""

URI_START = re.compile(r"(?i)[ \t\n\r\f\v]*postgres(?:ql)?://")
USERINFO = re.compile(r"[^@/]*@")
"""A URI's userinfo, just past ``://``: libpq looks for an ``@`` before any ``/``."""
FOREIGN_DSN = re.compile(
    r"(?i)\s*(?:jdbc|pgsql|[a-z][a-z0-9+.\-]*postgres[a-z0-9+.\-]*|postgres[a-z0-9+.\-]*):")
"""A scheme no ledger opens but a PostgreSQL DSN's look-alikes use (``jdbc:postgresql:``,
PHP's ``pgsql:``, ``postgresql+psycopg://``, ``POSTGRES://``): an error, never a file name."""
SCHEMELESS_URI = re.compile(
    r"(?i)\s*(?:postgres(?:ql)?[^\w\s/]?//|//)?[^/:@\s]+:[^/@\s]*@[^/@\s]"
    r"|\s*postgres(?:ql)?[^\w\s/]?//|\s*//[^/@\s]+@"
    r"|\s*(?:[^/:@\s]+@)?[a-z0-9.\-]{2,}:\d{4,5}(?:/\S*)?\s*$")
"""A URI whose scheme was lost or mistyped (``root:pw@host/db``, ``//root:pw@host/db``,
``postgresql//…``, ``postgresql;//…``): its first part is a user and a password before an
``@``, which no file name means; or it is the scheme's name before ``//`` (``postgres//host``,
``postgresql///db``), a network path with a user (``//app@host/db``), or a host and a port
(``db.internal:5432``, ``app@db.internal:5432/fleet``: a port of four or five digits). An
error, never a file name (opening it as one would quote the password, or make each worker a
ledger of its own); a file of such a name is written ``./name``."""


def query_mark(dsn: str) -> int:
    """Where a URI's query begins (its ``?``), or -1.

    libpq reads the userinfo up to the first ``@`` before any ``/`` (a password may hold a raw
    ``?`` or ``#``); the query is everything after the next ``?``. It knows no fragment: a
    ``#`` is an ordinary character of the value it is in.
    """
    scheme = URI_START.match(dsn)
    if scheme is None:
        return -1  # a key=value string has no query: a ``?`` is part of a value
    userinfo = USERINFO.match(dsn, scheme.end())
    return dsn.find("?", userinfo.end() if userinfo is not None else scheme.end())


def at_in_path(uri: str) -> bool:
    """Whether the URI ``uri`` holds a raw ``@`` in its path (from the first ``/`` past its
    authority to its query): libpq reads it as the database name, so a user and password
    written there (``postgresql:///user:secret@host/db``, or a password holding a raw ``/``)
    would be read, and repeated by the server, as one. A database name writes it ``%40``."""
    start = uri.find("//") + 2
    userinfo = USERINFO.match(uri, start)
    slash = uri.find("/", userinfo.end() if userinfo is not None else start)
    mark = query_mark(uri)
    if slash < 0 or 0 <= mark < slash:
        return False
    return "@" in uri[slash:mark if mark >= 0 else len(uri)]


SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""A ledger schema's name: a lowercase identifier PostgreSQL keeps as written."""


def check_schema(schema: object) -> str:
    """``schema`` if it is a valid ledger schema name, else a ``LedgerConfigError``."""
    if not isinstance(schema, str) or not SCHEMA_NAME.fullmatch(schema):
        raise LedgerConfigError(
            f"schema {schema!r} must be a lowercase identifier ([a-z_][a-z0-9_]*, <= 63)")
    return schema


def split_schema(dsn: str) -> tuple[str, str | None]:
    """A URI's own ``?schema=`` taken out: (the DSN libpq sees, the schema or None). A
    key=value string is returned whole (it has no query; it names no schema)."""
    mark = query_mark(dsn)
    if mark < 0:
        return dsn, None
    base, query = dsn[:mark], dsn[mark + 1:]
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
    if schemas:
        check_schema(schemas[0])
    query = "&".join(kept)
    rebuilt = base + ("?" + query if query else "")
    return rebuilt, schemas[0] if schemas else None
