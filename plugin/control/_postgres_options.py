"""The options every ledger connection is opened with, beside what its connection string says.

- ``autocommit``, no server-side prepared statements (session state a transaction pooler
  loses), and ``application_name`` (operators, and tests, find a ledger's connections in
  ``pg_stat_activity`` by it).
- ``connect_timeout``: the connection string's own when it is a whole number of seconds above
  0; else the ledger's (libpq reads 0, a negative number or none at all as "wait forever").
- TCP keepalives and ``tcp_user_timeout``, unless the connection string sets them: a server
  lost to a network partition while a connection waits for its answer, or while it sits in the
  pool, is found by the operating system in seconds instead of the system's default (hours),
  and the wait fails (a :class:`~plugin.errors.LedgerUnavailableError`). A peer that still
  acknowledges what it is sent but never answers (a stopped proxy) is not found so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REFUSED_OPTION = re.compile(
    r'invalid "?\w+"? value: "|invalid port number: "|invalid integer value ".*" for connection '
    r'option "|could not match \d+ [\w ]+ to \d+ |definition of service ".*" not found|service '
    r'file ".*" not found|bad value for connect_timeout')
"""libpq's (and psycopg's) reasons for refusing a connection string's option before any
connection is tried: a configuration error, never an unreachable server."""


KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
              "keepalives_count": 3}
"""An idle connection's peer is asked after 10 s, then every 5 s; three silences lose it."""


def interval_ms(seconds: float) -> str:
    """``seconds`` as a PostgreSQL setting's value in whole milliseconds, at least 1."""
    return f"{max(1, round(seconds * 1000))}ms"


def _seconds(value: object) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None  # libpq says what is wrong with it when it connects


def connection_options(dsn: Mapping[str, Any], *, name: str, connect_timeout: float,
                       statement_timeout: float) -> dict[str, Any]:
    """psycopg's connection keywords for a ledger whose parsed connection string is ``dsn``."""
    options: dict[str, Any] = {"autocommit": True, "application_name": name,
                               "prepare_threshold": None}
    own = _seconds(dsn["connect_timeout"]) if "connect_timeout" in dsn else 0
    if own is not None and own <= 0:
        options["connect_timeout"] = max(2, round(connect_timeout))  # whole seconds, >= 2
    options.update({key: value for key, value in KEEPALIVES.items() if key not in dsn})
    if "tcp_user_timeout" not in dsn:  # milliseconds sent and not acknowledged
        options["tcp_user_timeout"] = round((statement_timeout + connect_timeout) * 1000)
    return options
