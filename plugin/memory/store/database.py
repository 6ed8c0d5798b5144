"""How the store opens, talks to SQLite and closes.

One SQL code path over :mod:`plugin.control._sqlite` (aiosqlite on asyncio, a thread-confined
``sqlite3`` connection on trio). Opening refuses a file that is not an empty database or a
memory store of a schema version it reads (an older one is migrated in place, see
:func:`.schema.upgrade`) before changing anything in it; every driver error comes
out as a typed :class:`~plugin.errors.MemoryStoreError`. Writes run in one ``BEGIN IMMEDIATE``
transaction each, shielded from cancellation.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from typing import TypeVar

import anyio
import attrs

from ...control._sqlite import (
    Connection,
    FileIdentity,
    Params,
    Row,
    connect,
    file_identity,
    not_a_database,
    path_problem,
    run_transaction,
    still_there,
    switch_to_wal,
)
from ...errors import MemoryStoreError
from .errors import MemoryStoreClosedError, MemoryStoreCorruptError, MemoryStorePathError, translate
from .schema import (
    ORPHAN_VECTORS_SWEPT,
    READABLE_VERSIONS,
    SCHEMA,
    SCHEMA_VERSION,
    SWEEP_ORPHAN_VECTORS,
    schema_objects,
    upgrade,
)

__all__ = ["Database", "Statement"]

T = TypeVar("T")

#: One SQL statement and the parameter sets it runs with (``executemany``).
Statement = tuple[str, Sequence[Params]]


@attrs.define(eq=False)
class Database:
    """The store's one connection: open with :meth:`open`, close with :meth:`close`."""

    path: str
    timeout: float
    _conn: Connection | None = attrs.field(default=None, init=False)
    _write_lock: anyio.Lock | None = attrs.field(default=None, init=False)
    _file: FileIdentity | None = attrs.field(default=None, init=False)

    async def open(self) -> None:
        """Connect, check the file is empty or ours, switch to WAL and create the schema."""
        if self._conn is not None:
            raise MemoryStoreError(f"memory store {self.path!r} is already open")
        problem = await path_problem(self.path)
        if problem is not None:
            raise MemoryStorePathError(f"memory store {self.path!r}: {problem}")
        if await not_a_database(self.path):
            raise MemoryStoreCorruptError(f"memory store {self.path!r} is not a SQLite database")
        try:
            conn = await connect(self.path, timeout=self.timeout)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        try:
            await self._prepare(conn)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await conn.close()
            if isinstance(exc, (sqlite3.Error, UnicodeDecodeError)):  # a schema not UTF-8
                raise self._error(exc) from exc
            raise
        self._conn = conn
        self._write_lock = anyio.Lock()
        self._file = file_identity(self.path)

    async def _prepare(self, conn: Connection) -> None:
        """Check that the file is empty or ours, then switch to WAL and create the schema.

        A database that is not a memory store (other tables, no store metadata, another
        schema version) is refused before anything in it changes, journal mode included. A
        current and complete store is only read: opening it never waits for the write lock,
        so it opens while another process writes. A new, older or incomplete file is
        created, migrated or completed under the write lock, by statements that skip what
        another process did first.
        """
        objects = await conn.fetchall("SELECT type, name FROM sqlite_master")
        tables = {name for kind, name in objects if kind == "table"}
        if objects:  # a view alone is no empty file either
            await self._check_version(conn, tables, READABLE_VERSIONS)
        # Busy while another process switches it: retried up to the busy timeout.
        await switch_to_wal(conn, timeout=self.timeout)
        await conn.fetchall("PRAGMA foreign_keys=ON")
        with anyio.CancelScope(shield=True):  # never leave the write lock held
            try:
                if tables:
                    await conn.run(upgrade)
                if not await self._complete(conn):
                    await conn.executescript(SCHEMA)
                if not await conn.fetchall(ORPHAN_VECTORS_SWEPT):
                    await conn.executescript(SWEEP_ORPHAN_VECTORS)
            except BaseException:
                await self._rollback(conn)
                raise
        await self._check_version(conn, {"memory_store_meta"})

    @staticmethod
    async def _complete(conn: Connection) -> bool:
        """Whether the file holds every object of the schema at its current version (read
        without the write lock: a file only ever gains them)."""
        present = set(await conn.fetchall("SELECT type, name FROM sqlite_master"))
        if not schema_objects() <= present:
            return False
        rows = await conn.fetchall(
            "SELECT value FROM memory_store_meta WHERE key = 'schema_version'"
        )
        return rows == [(str(SCHEMA_VERSION),)]

    async def _check_version(
        self, conn: Connection, tables: set[str], versions: tuple[int, ...] = (SCHEMA_VERSION,)
    ) -> None:
        rows = (
            await conn.fetchall("SELECT value FROM memory_store_meta WHERE key = 'schema_version'")
            if "memory_store_meta" in tables
            else []
        )
        if rows not in ([(str(version),)] for version in versions):
            found = f"schema version {rows[0][0]!r}" if rows else "no store metadata"
            raise MemoryStoreCorruptError(
                f"{self.path!r} is not a recallbound memory store of schema version "
                f"{SCHEMA_VERSION} ({found})"
            )

    async def close(self) -> None:
        """Close the connection; idempotent."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()

    def _error(self, exc: sqlite3.Error | UnicodeDecodeError) -> MemoryStoreError:
        return translate(exc, path=self.path, timeout=self.timeout)

    def connection(self) -> Connection:
        """The open connection, else :class:`MemoryStoreClosedError`."""
        if self._conn is None:
            raise MemoryStoreClosedError(
                f"memory store {self.path!r} is used outside its `async with` block"
            )
        return self._conn

    def _check_file(self) -> None:
        """Refuse a write once the opened file is no longer at its path (deleted or replaced
        while open): what it committed there no one would see."""
        if not still_there(self._file):
            raise MemoryStorePathError(
                f"memory store {self.path!r} is no longer the file this store opened "
                "(deleted or replaced while open): open it again"
            )

    @staticmethod
    async def _rollback(conn: Connection) -> None:
        # No transaction may be open (BEGIN failed), or the connection is gone: nothing to undo.
        with contextlib.suppress(sqlite3.Error):
            await conn.fetchall("ROLLBACK")

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        """Run one read and return its rows."""
        conn = self.connection()
        try:
            return await conn.fetchall(sql, params)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    async def write(self, statements: Sequence[Statement]) -> None:
        """Run ``statements`` (each with its parameter sets) in one shielded transaction, in
        one hop to the connection's thread."""

        def body(raw: sqlite3.Connection) -> None:
            for sql, rows in statements:
                if rows:
                    raw.executemany(sql, rows)

        await self.transact(body)

    async def transact(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the raw connection inside one shielded ``BEGIN IMMEDIATE``
        transaction (on the connection's own thread): anything it raises rolls it all back.

        For writes that must read before they write (an ownership check, a cell's
        statistics) with no other writer in between.
        """
        conn = self.connection()
        assert self._write_lock is not None
        self._check_file()
        try:
            return await run_transaction(conn, self._write_lock, fn)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
