"""The test PostgreSQL server: its DSN, and one fresh schema per test (dropped afterwards).

The DSN comes from ``RECALLBOUND_TEST_PG_DSN`` (default: the local server every machine of this
project runs, trust auth, database ``test``). There is no skip: when the server cannot be
reached, the tests that need it fail, and say so.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

DSN = os.environ.get("RECALLBOUND_TEST_PG_DSN", "postgresql://root@127.0.0.1:5432/test")


def connect() -> psycopg.Connection[tuple[object, ...]]:
    """A plain autocommit connection to the test server, or a failure that names the DSN."""
    try:
        return psycopg.connect(DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise AssertionError(
            f"the test PostgreSQL server at {DSN!r} (RECALLBOUND_TEST_PG_DSN) is not reachable: "
            f"{exc}"
        ) from exc


def drop_schema(name: str) -> None:
    with connect() as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@contextmanager
def fresh_schema(prefix: str = "t") -> Iterator[str]:
    """A schema name no other test uses; dropped (with everything in it) afterwards."""
    name = f"rb_{prefix}_{secrets.token_hex(6)}"
    drop_schema(name)  # also checks, up front, that the server answers
    try:
        yield name
    finally:
        drop_schema(name)


def restart_server() -> None:
    """Restart the local PostgreSQL cluster (the tests run as root on the server's host)."""
    versions = sorted(os.listdir("/etc/postgresql"))
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "restart"],
        check=True, capture_output=True, timeout=120,
    )
