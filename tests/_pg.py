"""The test PostgreSQL server: its DSN, and one fresh schema per test (dropped afterwards).

The DSN comes from ``RECALLBOUND_TEST_PG_DSN`` (default: the local server every machine of this
project runs, trust auth, database ``test``). There is no skip: when the server cannot be
reached, the tests that need it fail, and say so.
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

from plugin.control import Reservation
from plugin.control.ledger import read_time

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


PGBOUNCER_POOL = 2
"""Server connections PgBouncer keeps per database: far fewer than a ledger's pool, so its
transactions keep landing on server connections other transactions used."""


PGBOUNCER_MISSING = "needs the pgbouncer program (Debian package: pgbouncer)"
"""The one-line reason a PgBouncer test skips with on a machine without the program."""


def pgbouncer_program() -> str:
    """The ``pgbouncer`` program's path.

    Absent, a test that needs it skips with :data:`PGBOUNCER_MISSING`, so a first test run on
    a fresh machine is not red; when the ``CI`` environment variable is set (CI installs the
    program), it fails instead, so CI can never pass by skipping the PgBouncer tests.
    """
    program = shutil.which("pgbouncer") or shutil.which("/usr/sbin/pgbouncer")
    if program is not None:
        return program
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and the test {PGBOUNCER_MISSING}", pytrace=False)
    pytest.skip(PGBOUNCER_MISSING)


@functools.cache
def pooled_dsn() -> str:
    """The test server's DSN through PgBouncer in transaction mode (started once per process,
    stopped at exit): every transaction may run on another server connection, so a ledger
    that relied on session state (settings, prepared statements, session locks) would fail.

    Needs the ``pgbouncer`` program: without it the test skips, or fails under CI
    (:func:`pgbouncer_program`).
    """
    program = pgbouncer_program()
    target = urllib.parse.urlsplit(DSN)
    folder = Path(tempfile.mkdtemp(prefix="rb-pgbouncer-"))
    folder.chmod(0o777)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = folder / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"* = host={target.hostname} port={target.port or 5432} user={target.username}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nauth_type = any\n"
        f"pool_mode = transaction\ndefault_pool_size = {PGBOUNCER_POOL}\n"
        "max_client_conn = 500\nunix_socket_dir =\n"
        # A server connection PgBouncer fails to open is retried after 1 s, not 15 s, so a
        # moment of refusal from the server never parks every client for its whole wait.
        "server_connect_timeout = 5\nserver_login_retry = 1\n"
        # The admin console, for the state dump a failing PgBouncer test carries.
        f"admin_users = {target.username}\n"
        f"logfile = {folder}/pgbouncer.log\npidfile = {folder}/pgbouncer.pid\n"
    )
    config.chmod(0o644)
    # PgBouncer refuses to run as root: it switches to the server's own user.
    user = ["-u", "postgres"] if os.geteuid() == 0 else []
    subprocess.run([program, "-d", *user, str(config)], check=True, capture_output=True,
                   timeout=30)
    dsn = target._replace(netloc=f"{target.username}@127.0.0.1:{port}").geturl()
    pidfile = folder / "pgbouncer.pid"
    for _ in range(200):  # the daemon writes its pid file, then listens
        try:
            pid = int(pidfile.read_text().strip())
            with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
        except (OSError, ValueError, psycopg.OperationalError):
            time.sleep(0.05)
            continue
        atexit.register(os.kill, pid, signal.SIGTERM)
        _PGBOUNCER_LOG.append(folder / "pgbouncer.log")
        return dsn
    raise AssertionError(f"PgBouncer did not answer on port {port}: "
                         f"{(folder / 'pgbouncer.log').read_text()}")


_PGBOUNCER_LOG: list[Path] = []
"""The running PgBouncer's log file, once :func:`pooled_dsn` has started it."""


def pgbouncer_state() -> str | None:
    """What PgBouncer says about its pools, servers and clients, and the end of its log: the
    evidence a failing test through PgBouncer carries (``None`` if PgBouncer never started)."""
    if not _PGBOUNCER_LOG:
        return None
    admin = urllib.parse.urlsplit(pooled_dsn())._replace(path="/pgbouncer").geturl()
    lines = []
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            for command in ("SHOW POOLS", "SHOW SERVERS", "SHOW CLIENTS"):
                cur = conn.execute(command, prepare=False)
                names = [column.name for column in cur.description or ()]
                lines.append(f"== {command}")
                lines.extend(str(dict(zip(names, row, strict=True))) for row in cur.fetchall())
    except psycopg.Error as exc:
        lines.append(f"the admin console did not answer: {exc}")
    # What the server's own sessions are doing (straight to the server, not through PgBouncer):
    # a server connection PgBouncer shows as active is one of these.
    lines.append("== pg_stat_activity")
    try:
        with psycopg.connect(DSN, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(
                "SELECT pid, state, wait_event_type, wait_event, backend_xid IS NOT NULL,"
                " now() - xact_start, now() - state_change, left(query, 300)"
                " FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()", prepare=False)
            lines.extend(str(row) for row in cur.fetchall())
            cur = conn.execute(
                "SELECT l.pid, l.locktype, l.classid, l.objid, l.mode, l.granted"
                " FROM pg_locks l WHERE l.locktype = 'advisory'", prepare=False)
            lines.extend(f"lock {row}" for row in cur.fetchall())
    except psycopg.Error as exc:
        lines.append(f"the server did not answer: {exc}")
    log = _PGBOUNCER_LOG[0].read_text(errors="replace").splitlines()
    lines.append("== the end of pgbouncer.log")
    lines.extend(log[-60:])
    return "\n".join(lines)


SERVER_CLOCK_SHIFT = 2.0**28
"""How far the contract's explicit times are moved for a ledger judged by the server's clock:
past the server's real clock (for years to come), and exactly back (a power of two that keeps
every time of the contract in its binary range, so no digit is lost either way)."""


class ServerClockLedger:
    """A ``PostgresLedger(time_source="server")`` that the contract's explicit times can drive.

    The server's clock judges every round, never below the floor the caller passes. This
    wrapper passes the contract's time, moved :data:`SERVER_CLOCK_SHIFT` into the future, as
    that floor (a clock reading, read inside the reserving transaction), so the server's own
    clock, which is behind it, never wins, and the production path (the server-clock
    statement, read after the batch's locks) computes exactly the contract's times. What the
    server judged comes back moved by the same amount; traces the caller recorded are its own.
    """

    def __init__(self, ledger: Any) -> None:
        self._ledger = ledger

    async def __aenter__(self) -> ServerClockLedger:
        await self._ledger.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._ledger.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    @staticmethod
    def _back(reservation: Any) -> Any:
        return attrs.evolve(
            reservation, deadline_wall=reservation.deadline_wall - SERVER_CLOCK_SHIFT,
            opened_wall=reservation.opened_wall - SERVER_CLOCK_SHIFT,
            reserved_wall=reservation.reserved_wall - SERVER_CLOCK_SHIFT)

    async def reserve(self, run_id: str, kind: Any, requested: int, policy: Any, now: Any, *,
                      floor: Any = -math.inf) -> Any:
        def shifted() -> float:
            return max(read_time(now), read_time(floor)) + SERVER_CLOCK_SHIFT

        outcome = await self._ledger.reserve(run_id, kind, requested, policy, 0.0, floor=shifted)
        return self._back(outcome) if isinstance(outcome, Reservation) else outcome

    async def reservations(self, run_id: str) -> list[Any]:
        return [self._back(r) for r in await self._ledger.reservations(run_id)]

    async def current_run(self, candidate: str, *, now: Any, **kw: Any) -> Any:
        # Judged by the server's clock, never before the floor: the contract's time, moved.
        return await self._ledger.current_run(candidate, now=0.0,
                                              floor=read_time(now) + SERVER_CLOCK_SHIFT, **kw)

    async def open_run(self, run_id: str, *, now: Any, floor: Any = -math.inf,
                       **kw: Any) -> Any:
        # As current_run: by the server's clock, never before the contract's time, moved.
        return await self._ledger.open_run(
            run_id, now=0.0,
            floor=max(read_time(now), read_time(floor)) + SERVER_CLOCK_SHIFT, **kw)

    async def usage(self, run_id: str) -> Any:
        usage = await self._ledger.usage(run_id)
        if usage.deadline_wall is None:
            return usage
        return attrs.evolve(usage, deadline_wall=usage.deadline_wall - SERVER_CLOCK_SHIFT)

    async def refusals(self, run_id: str) -> list[Any]:
        # A refused round was recorded at the server's judged time; an attempt's, by its caller.
        return [attrs.evolve(r, at_wall=r.at_wall - SERVER_CLOCK_SHIFT) if r.what == "round"
                else r for r in await self._ledger.refusals(run_id)]
