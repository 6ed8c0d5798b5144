"""One SQL code path over two PostgreSQL drivers, picked once by the running async library.

psycopg's async API runs on asyncio only (under trio ``AsyncConnection.connect`` fails with
"no running event loop": it waits on sockets through asyncio's loop), so, as for SQLite:

- asyncio: :class:`psycopg_pool.AsyncConnectionPool` of ``AsyncConnection``;
- trio (and any other loop): :class:`psycopg_pool.ConnectionPool` of plain connections, each
  call one hop to an anyio worker thread. A semaphore in the event loop admits at most
  ``max_size`` tasks to the pool, so a checkout never parks a worker thread for long, and the
  statement limiter (``max_size`` threads) can never be starved by tasks waiting for a
  connection.

Connections are in autocommit mode and every unit of work is an explicit ``BEGIN`` …
``COMMIT`` that sets what it needs for itself (``SET LOCAL``, see
:mod:`plugin.control.postgres_ledger`): no state lives in the session, so a pooler in
transaction mode (PgBouncer) may hand each transaction another server connection. Nothing is
prepared on the server (``prepare_threshold=None``) for the same reason. A connection is
checked before it is lent (:func:`check_idle`, no round trip): one lost while idle (a server
restart, a terminated backend) is replaced, and the next one tried at once.

:meth:`Session.pipeline` sends statements in one round trip (on trio, one worker-thread hop) as
one simple-protocol query quoted by psycopg; never psycopg's pipeline mode, whose ``Flush``
after ``Sync`` makes PgBouncer lend a server connection that the idle client then keeps.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar

import anyio
import anyio.to_thread
import psycopg
import psycopg_pool
import sniffio

from ._postgres_options import REFUSED_OPTION as REFUSED_OPTION
from ._postgres_options import connection_options
from .dsn import conninfo_dict

Params: TypeAlias = "Sequence[Any] | Mapping[str, Any]"
Row: TypeAlias = "tuple[Any, ...]"
T = TypeVar("T")

class Session(Protocol):
    """A pooled connection, held by one task for one read or one transaction."""

    async def fetchall(self, sql: str, params: Params | None = None) -> list[Row]:
        """Execute one statement and return its rows (none for a statement without rows)."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        """Execute one statement once per parameter set, in one round trip."""
        ...

    async def pipeline(self, statements: Sequence[tuple[str, Params | None]]) -> list[list[Row]]:
        """Execute ``statements`` in one round trip; each one's rows, in order.

        The first failure raises (the statements after it are skipped by the server).
        """
        ...

    @property
    def broken(self) -> bool:
        """Whether the connection is closed or lost (the pool discards it when given back)."""
        ...


class Driver(Protocol):
    """A connection pool driven from the running event loop."""

    async def open(self) -> None:
        """Connect once directly (an unreachable server fails here, with libpq's reason), then
        open the pool and wait until ``min_size`` connections are ready."""
        ...

    async def close(self) -> None:
        """Close the pool and every connection; idempotent."""
        ...

    def session(self) -> contextlib.AbstractAsyncContextManager[Session]:
        """Check a connection out of the pool for the block; always given back."""
        ...

    async def transaction(self, statements: Sequence[tuple[str, Params | None]]) -> list[list[Row]]:
        """Check a connection out, run ``statements`` (a whole transaction, ``BEGIN`` to
        ``COMMIT``) in one round trip, roll back on failure, give the connection back: on trio
        all of it in one hop to a worker thread. Each statement's rows, in order."""
        ...


def _rows(cur: psycopg.Cursor[Row] | psycopg.AsyncCursor[Row]) -> bool:
    return cur.description is not None


def _pipeline(
    conn: psycopg.Connection[Row], statements: Sequence[tuple[str, Params | None]]
) -> list[list[Row]]:
    cur = conn.execute(*_query(psycopg.ClientCursor(conn), statements))
    results = [cur.fetchall() if _rows(cur) else []]
    while cur.nextset():
        results.append(cur.fetchall() if _rows(cur) else [])
    return results


def _query(
    cur: psycopg.ClientCursor[Any] | psycopg.AsyncClientCursor[Any],
    statements: Sequence[tuple[str, Params | None]],
) -> tuple[str, Params | None]:
    """One statement as it is (bound by the server); several as one query, run in order as one
    implicit transaction (up to a ``COMMIT`` of their own) that the first failure ends."""
    if len(statements) == 1:
        return statements[0]
    return ";\n".join(cur.mogrify(sql, params) for sql, params in statements), None


def _rollback(conn: psycopg.Connection[Row] | psycopg.AsyncConnection[Row]) -> bool:
    """Whether a failed transaction on ``conn`` still needs a ``ROLLBACK`` (not if lost)."""
    return not (conn.closed or conn.broken)


class _AsyncSession:
    def __init__(self, conn: psycopg.AsyncConnection[Row]) -> None:
        self._conn = conn

    async def fetchall(self, sql: str, params: Params | None = None) -> list[Row]:
        cur = await self._conn.execute(sql, params)
        return await cur.fetchall() if _rows(cur) else []

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        await self.pipeline([(sql, row) for row in rows])

    async def pipeline(self, statements: Sequence[tuple[str, Params | None]]) -> list[list[Row]]:
        conn = self._conn
        cur = await conn.execute(*_query(psycopg.AsyncClientCursor(conn), statements))
        results = [await cur.fetchall() if _rows(cur) else []]
        while cur.nextset():
            results.append(await cur.fetchall() if _rows(cur) else [])
        return results

    @property
    def broken(self) -> bool:
        return bool(self._conn.closed or self._conn.broken)


class AsyncDriver:
    """The asyncio driver: :class:`psycopg_pool.AsyncConnectionPool`."""

    def __init__(self, pool: psycopg_pool.AsyncConnectionPool[Any], open_timeout: float,
                 conninfo: str, kwargs: Mapping[str, Any]) -> None:
        self._pool = pool
        self._open_timeout = open_timeout
        self._probe = conninfo, dict(kwargs)

    async def open(self) -> None:
        # One direct connection first: an unreachable server fails fast with libpq's own
        # reason, instead of the pool retrying (and logging) until its timeout.
        conninfo, kwargs = self._probe
        probe = await psycopg.AsyncConnection.connect(conninfo, **kwargs)
        await probe.close()
        await self._pool.open(wait=True, timeout=self._open_timeout)

    async def close(self) -> None:
        await self._pool.close()

    async def _checkout(self) -> psycopg.AsyncConnection[Any]:
        """A connection of the pool, checked (see :func:`_checkout`)."""
        pool = self._pool
        for _ in range(pool.max_size + 1):
            conn: psycopg.AsyncConnection[Any] = await pool.getconn()
            if not _lost(conn):
                return conn
            with anyio.CancelScope(shield=True):
                await conn.close()
                await pool.putconn(conn)  # discarded, and replaced
        raise psycopg.OperationalError("the server dropped every connection the pool lent")

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        conn = await self._checkout()
        try:
            yield _AsyncSession(conn)
        finally:
            with anyio.CancelScope(shield=True):
                await self._pool.putconn(conn)

    async def transaction(self, statements: Sequence[tuple[str, Params | None]]) -> list[list[Row]]:
        conn = await self._checkout()
        try:
            with anyio.CancelScope(shield=True):
                try:
                    rows = await _AsyncSession(conn).pipeline(statements)
                except BaseException:
                    if _rollback(conn):
                        with contextlib.suppress(psycopg.Error):
                            await conn.execute("ROLLBACK")
                    raise
        finally:
            with anyio.CancelScope(shield=True):
                await self._pool.putconn(conn)
        return rows


class _ThreadedSession:
    def __init__(self, conn: psycopg.Connection[Row], limiter: anyio.CapacityLimiter) -> None:
        self._conn = conn
        self._limiter = limiter

    async def _run(self, fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn, limiter=self._limiter)

    async def fetchall(self, sql: str, params: Params | None = None) -> list[Row]:
        conn = self._conn

        def run() -> list[Row]:
            cur = conn.execute(sql, params)
            return cur.fetchall() if _rows(cur) else []

        return await self._run(run)

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        await self.pipeline([(sql, row) for row in rows])

    async def pipeline(self, statements: Sequence[tuple[str, Params | None]]) -> list[list[Row]]:
        conn = self._conn
        return await self._run(lambda: _pipeline(conn, statements))

    @property
    def broken(self) -> bool:
        return bool(self._conn.closed or self._conn.broken)


class ThreadedDriver:
    """The trio (any-loop) driver: :class:`psycopg_pool.ConnectionPool` through worker threads."""

    def __init__(self, pool: psycopg_pool.ConnectionPool[Any], open_timeout: float,
                 conninfo: str, kwargs: Mapping[str, Any]) -> None:
        self._pool = pool
        self._open_timeout = open_timeout
        self._probe = conninfo, dict(kwargs)
        size = pool.max_size
        self._admitted = anyio.Semaphore(size)
        # Statements of checked-out connections (at most one each) plus checkouts and returns.
        self._limiter = anyio.CapacityLimiter(size)

    async def open(self) -> None:
        pool, timeout = self._pool, self._open_timeout
        conninfo, kwargs = self._probe

        def open_pool() -> None:
            # As AsyncDriver.open: one direct connection first, to fail fast and say why.
            psycopg.Connection.connect(conninfo, **kwargs).close()
            pool.open(wait=True, timeout=timeout)

        await anyio.to_thread.run_sync(open_pool)

    async def close(self) -> None:
        await anyio.to_thread.run_sync(self._pool.close)

    @contextlib.asynccontextmanager
    async def _admission(self) -> AsyncIterator[None]:
        """A place among the pool's callers, awaited at most ``pool_timeout`` (a checkout's)."""
        with anyio.move_on_after(self._pool.timeout) as waited:
            await self._admitted.acquire()
        if waited.cancelled_caught:
            raise psycopg_pool.PoolTimeout(f"no place in the pool after {self._pool.timeout} s")
        try:
            yield
        finally:
            self._admitted.release()

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        async with self._admission():
            # A worker thread is not abandoned on cancellation: the connection it checks out
            # always reaches the ``finally`` below and goes back to the pool.
            conn = await anyio.to_thread.run_sync(_checkout, self._pool, limiter=self._limiter)
            try:
                yield _ThreadedSession(conn, self._limiter)
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(
                        self._pool.putconn, conn, limiter=self._limiter
                    )

    async def transaction(self, statements: Sequence[tuple[str, Params | None]]) -> list[list[Row]]:
        pool = self._pool

        def run() -> list[list[Row]]:
            conn = _checkout(pool)
            try:
                return _pipeline(conn, statements)
            except BaseException:
                if _rollback(conn):
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise
            finally:
                pool.putconn(conn)

        async with self._admission():
            # One hop: a worker thread is never abandoned, so the connection always goes back.
            return await anyio.to_thread.run_sync(run, limiter=self._limiter)


_TERMINATED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Connections the server said it terminated (a FATAL notice while idle)."""


def watch(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Note, on the client side only, when the server terminates ``conn`` while it is idle: the
    server says so first (a FATAL message, delivered as a notice), then closes the stream."""
    ref = weakref.ref(conn)

    def noticed(diagnostic: psycopg.errors.Diagnostic) -> None:
        target = ref()
        if target is not None and diagnostic.severity_nonlocalized in ("FATAL", "PANIC"):
            _TERMINATED.add(target)

    conn.add_notice_handler(noticed)


def check_idle(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """The pool's health check of an idle connection, without a round trip to the server.

    It reads what the server sent while the connection sat idle: a server that terminated it
    sent a FATAL message (parsed by ``is_busy``, noted by :func:`watch`), then closed the
    stream (which the second read reports). Raises :class:`psycopg.OperationalError` for a
    lost connection (:func:`_checkout` then discards it and takes another). psycopg_pool's
    own ``check_connection`` asks the server (an empty query): one more round trip on every
    checkout, which a lone reservation pays.
    """
    pgconn = conn.pgconn
    pgconn.consume_input()
    pgconn.is_busy()
    pgconn.consume_input()
    if (conn in _TERMINATED or conn.closed or conn.broken
            or pgconn.status != psycopg.pq.ConnStatus.OK):
        raise psycopg.OperationalError("the connection was lost while idle in the pool")


def _lost(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    try:
        check_idle(conn)
    except psycopg.OperationalError:
        return True
    return False


def _checkout(pool: psycopg_pool.ConnectionPool[Any]) -> psycopg.Connection[Any]:
    """A connection of ``pool``, checked by :func:`check_idle` before it is lent: one found
    lost is closed and given back (the pool replaces it) and the next is tried at once.
    psycopg_pool's own ``check=`` waits 1 s, 2 s, 4 s ... between tries: after a restart every
    idle connection is lost, and a pool of a few would wait past its timeout and fail a round
    on a server that is up again. One try more than the pool holds is enough: past that, the
    server drops each new connection at once."""
    for _ in range(pool.max_size + 1):
        conn: psycopg.Connection[Any] = pool.getconn()
        if not _lost(conn):
            return conn
        conn.close()
        pool.putconn(conn)  # discarded, and replaced
    raise psycopg.OperationalError("the server dropped every connection the pool lent")


async def _watch_async(conn: psycopg.AsyncConnection[Any]) -> None:
    watch(conn)


def make_driver(
    conninfo: str,
    *,
    min_size: int,
    max_size: int,
    connect_timeout: float,
    pool_timeout: float,
    statement_timeout: float,
    name: str,
) -> Driver:
    """A driver for the running async library (not yet opened)."""
    kwargs = connection_options(conninfo_dict(conninfo), name=name,
                                connect_timeout=connect_timeout,
                                statement_timeout=statement_timeout)
    common: dict[str, Any] = {
        "min_size": min_size, "max_size": max_size, "kwargs": kwargs, "open": False,
        "timeout": pool_timeout, "name": name,
    }
    if sniffio.current_async_library() == "asyncio":
        return AsyncDriver(
            psycopg_pool.AsyncConnectionPool(
                conninfo, configure=_watch_async, **common),
            connect_timeout, conninfo, kwargs,
        )
    return ThreadedDriver(
        psycopg_pool.ConnectionPool(
            conninfo, configure=watch, **common),
        connect_timeout, conninfo, kwargs,
    )
