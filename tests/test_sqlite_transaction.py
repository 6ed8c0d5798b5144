"""A SQLite ledger transaction runs in one hop to its connection's thread, on asyncio and trio:
all of it or nothing, the connection's sync level as it was after it, and a transaction that
awaits anything but its session is refused (it would run on the wrong thread). A run's opening
runs on the loop itself while no connection holds the write lock, and waits its turn in the
thread while one does."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from plugin import SqliteLedger
from plugin.control import _sqlite
from plugin.control._sqlite import ThreadSession
from plugin.control.ledger import RunOpening

pytestmark = pytest.mark.anyio

FULL, NORMAL = 2, 1
WALL = 1_700_000_000.0


class _Suspend:
    def __await__(self) -> Generator[None, None, None]:
        yield


@asynccontextmanager
async def connection(tmp_path: Path) -> AsyncIterator[_sqlite.Connection]:
    conn = await _sqlite.connect(tmp_path / "t.db", timeout=5.0)
    try:
        await conn.fetchall("PRAGMA journal_mode=WAL")
        await conn.fetchall("PRAGMA synchronous=FULL")
        await conn.fetchall("CREATE TABLE t (x INTEGER)")
        yield conn
    finally:
        await conn.close()


async def rows(conn: _sqlite.Connection) -> list[tuple[object, ...]]:
    return await conn.fetchall("SELECT x FROM t ORDER BY x")


async def test_a_transaction_commits_all_of_it_in_one_hop(tmp_path: Path) -> None:
    async with connection(tmp_path) as conn:
        hops = 0
        run = conn.run

        async def counted(fn):  # type: ignore[no-untyped-def]
            nonlocal hops
            hops += 1
            return await run(fn)

        conn.run = counted  # type: ignore[method-assign]

        async def write(s: ThreadSession) -> int:
            for x in (1, 2, 3):
                await s.fetchall("INSERT INTO t VALUES (?)", (x,))
            await s.executemany("INSERT INTO t VALUES (?)", [(4,), (5,)])
            return len(await s.fetchall("SELECT x FROM t"))

        assert await _sqlite.transaction(conn, anyio.Lock(), write) == 5
        assert hops == 1
        assert await rows(conn) == [(1,), (2,), (3,), (4,), (5,)]


async def test_a_failing_transaction_stores_nothing(tmp_path: Path) -> None:
    async with connection(tmp_path) as conn:
        async def write(s: ThreadSession) -> None:
            await s.fetchall("INSERT INTO t VALUES (1)")
            raise KeyError("boom")

        with pytest.raises(KeyError):
            await _sqlite.transaction(conn, anyio.Lock(), write)
        assert await rows(conn) == []


async def test_a_transaction_that_awaits_anything_else_is_refused_and_rolled_back(
    tmp_path: Path,
) -> None:
    async with connection(tmp_path) as conn:
        async def write(s: ThreadSession) -> None:
            await s.fetchall("INSERT INTO t VALUES (1)")
            await _Suspend()  # what awaiting the loop (a sleep, a lock, a read) comes to

        with pytest.raises(RuntimeError, match="awaited something other than its session"):
            await _sqlite.transaction(conn, anyio.Lock(), write)
        assert await rows(conn) == []


@pytest.mark.parametrize("fails", [False, True])
async def test_an_unsynced_transaction_leaves_the_sync_level_as_it_was(
    tmp_path: Path, fails: bool
) -> None:
    async with connection(tmp_path) as conn:
        seen: list[object] = []

        async def write(s: ThreadSession) -> None:
            seen.append((await s.fetchall("PRAGMA synchronous"))[0][0])
            await s.fetchall("INSERT INTO t VALUES (1)")
            if fails:
                raise KeyError("boom")

        try:
            await _sqlite.transaction(conn, anyio.Lock(), write, synced=False)
        except KeyError:
            assert fails
        assert seen == [NORMAL]
        assert await conn.fetchall("PRAGMA synchronous") == [(FULL,)]
        assert await rows(conn) == ([] if fails else [(1,)])


async def test_opening_a_run_leaves_the_ledger_synced_for_its_reservations(
    tmp_path: Path,
) -> None:
    async with SqliteLedger(tmp_path / "ledger.db") as ledger:
        assert await ledger.open_run("r1", principal="ana", scope="atlas", now=WALL,
                                     per_hour=5)
        conn = ledger._connection()
        assert await conn.fetchall("PRAGMA synchronous") == [(FULL,)]
    async with SqliteLedger(tmp_path / "ledger.db") as again:  # the opening was stored
        assert not await again.open_run("r2", principal="ana", scope="atlas", now=WALL + 1,
                                        per_hour=1)


def _hops(conn: _sqlite.Connection) -> list[str]:
    """Every trip ``conn`` takes to its thread from now on (by the method that took it)."""
    taken: list[str] = []
    for name in ("run", "fetchall", "executemany"):
        method = getattr(conn, name)

        async def counted(*args: object, _name: str = name, _method: object = method) -> object:
            taken.append(_name)
            return await _method(*args)  # type: ignore[operator]

        setattr(conn, name, counted)
    return taken


async def test_opening_a_run_on_a_free_file_runs_on_the_loop_without_a_trip_to_the_thread(
    tmp_path: Path,
) -> None:
    async with SqliteLedger(tmp_path / "ledger.db") as ledger:
        conn = ledger._connection()
        taken = _hops(conn)
        assert await ledger.open_run("r1", principal="ana", scope="atlas", now=WALL,
                                     per_hour=5)
        assert taken == []
        # committed: the ledger's own connection sees it, and so does every later opening
        assert await conn.fetchall("SELECT run_id FROM run_opens") == [("r1",)]
        assert not await ledger.open_run("r2", principal="ana", scope="atlas", now=WALL + 1,
                                         per_hour=1)


async def test_opening_a_run_while_another_connection_writes_waits_its_turn(
    tmp_path: Path,
) -> None:
    async with SqliteLedger(tmp_path / "ledger.db") as ledger:
        holder = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        opened: list[object] = []

        async def open_run() -> None:
            opened.append(await ledger.open_run("r1", principal="ana", scope="atlas",
                                                now=WALL, per_hour=5))

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(open_run)
                await anyio.sleep(0.2)
                assert opened == []  # waiting for the write lock, in the thread
                holder.execute("COMMIT")
        finally:
            holder.close()
        assert opened == [RunOpening.OPENED]
        assert await ledger.open_run("r1", principal="ana", scope="atlas", now=WALL + 1,
                                     per_hour=5) is RunOpening.KNOWN


async def test_a_transaction_now_on_a_locked_file_runs_nothing(tmp_path: Path) -> None:
    async with connection(tmp_path):
        pass
    holder = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    now = _sqlite.open_now(str(tmp_path / "t.db"))
    ran: list[int] = []

    async def write(s: ThreadSession) -> None:
        ran.append(1)
        await s.fetchall("INSERT INTO t VALUES (1)")

    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(_sqlite.Busy):
            _sqlite.transaction_now(now, write)
        holder.execute("COMMIT")
        assert ran == []
        _sqlite.transaction_now(now, write)
        assert holder.execute("SELECT x FROM t").fetchall() == [(1,)]

        async def failing(s: ThreadSession) -> None:
            await s.fetchall("INSERT INTO t VALUES (2)")
            raise KeyError("boom")

        with pytest.raises(KeyError):
            _sqlite.transaction_now(now, failing)
        assert holder.execute("SELECT x FROM t").fetchall() == [(1,)]  # rolled back
    finally:
        now.close()
        holder.close()
