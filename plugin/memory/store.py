"""The reference memory store: memories, People and beliefs, corrections and sources on SQLite.

One SQL code path over :mod:`plugin.control._sqlite` (aiosqlite on asyncio, a thread-confined
``sqlite3`` connection on trio). Every read takes the trusted ``principal`` and ``scope`` and
filters by both in SQL, so no query text can reach another principal's or another scope's rows.
The sparse arm is FTS5 (bm25) over safe, quoted terms (:mod:`plugin.memory.fts`); the semantic
arm compares stored float32 vectors with numpy (vectors are L2-normalised, so cosine is a dot
product). Writes run in one ``BEGIN IMMEDIATE`` transaction each, shielded from cancellation.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sqlite3
import unicodedata
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.to_thread
import attrs
import numpy as np
import numpy.typing as npt

from ..control._sqlite import (
    Connection,
    Params,
    Row,
    connect,
    immediate,
    is_cantopen,
    is_corrupt,
    is_locked,
    path_problem,
)
from ..control.clock import Clock
from ..errors import MemoryStoreError
from .embedding import EmbeddingAdapter
from .fts import MAX_SCAN_CHARS, fts5_match_expression, remove_lone_surrogates

__all__ = [
    "Arm",
    "Evidence",
    "EvidenceKind",
    "InvalidMemoryError",
    "MemoryConflictError",
    "MemoryRecord",
    "MemoryStore",
    "MemoryStoreClosedError",
    "MemoryStoreCorruptError",
    "MemoryStoreLockedError",
    "MemoryStorePathError",
    "Person",
]

EvidenceKind = Literal["memory", "belief", "source", "correction"]
#: Which read produced a piece of evidence.
Arm = Literal["sparse", "semantic", "recent", "lookup", "belief", "correction", "source"]

SCHEMA_VERSION = 1


class MemoryStorePathError(MemoryStoreError, FileNotFoundError):
    """The store's folder does not exist, or its file cannot be opened."""


class MemoryStoreLockedError(MemoryStoreError):
    """The store stayed locked by another connection beyond the busy timeout."""


class MemoryStoreCorruptError(MemoryStoreError):
    """The file is not a recallbound memory store, or its pages are damaged."""


class MemoryStoreClosedError(MemoryStoreError):
    """The store was used outside its ``async with`` block."""


class MemoryConflictError(MemoryStoreError, ValueError):
    """An item with this id already exists for this principal and scope."""


class InvalidMemoryError(MemoryStoreError, ValueError):
    """A value handed to a write method is malformed (the message names the field)."""


# -- values -------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Evidence:
    """One retrieved item. ``score`` is higher-is-better within its ``arm`` only.

    sparse: minus the bm25 rank; semantic: cosine similarity; recent, lookup, belief,
    correction, source: ``created_at``. ``cites`` are the ids of the sources a memory cites.
    """

    id: str
    kind: EvidenceKind
    text: str
    score: float
    arm: Arm
    principal: str
    scope: str
    created_at: float
    cites: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class Person:
    """A person known to one principal in one scope."""

    name: str
    principal: str
    scope: str


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_key(value: object, name: str) -> str:
    """Validate an identifier: a non-empty, UTF-8-encodable ``str``."""
    if not isinstance(value, str):
        raise InvalidMemoryError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise InvalidMemoryError(f"{name} must not be empty")
    if not _encodable(value):
        raise InvalidMemoryError(f"{name} must not contain lone surrogates")
    return value


def _validate_key(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    _check_key(value, attribute.name)


def _check_ids(value: object, name: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidMemoryError(f"{name} must be an iterable of ids (not a str)")
    return tuple(_check_key(item, name) for item in value)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidMemoryError(f"text must be a str, got {type(value).__name__}")
    return remove_lone_surrogates(value)


def _optional_time(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidMemoryError(f"created_at must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise InvalidMemoryError(f"created_at must be finite, got {value!r}")
    return float(value)


def _cites(value: object) -> tuple[str, ...]:
    return _check_ids(value, "cites")


@attrs.frozen(kw_only=True)
class MemoryRecord:
    """A memory to store: the input of :meth:`MemoryStore.add_memories`.

    Lone surrogates in ``text`` are replaced by U+FFFD; ids, principal and scope must be
    non-empty and encodable, else :class:`InvalidMemoryError`. ``created_at`` defaults to the
    store's clock.
    """

    id: str = attrs.field(validator=_validate_key)
    text: str = attrs.field(converter=_text)
    principal: str = attrs.field(validator=_validate_key)
    scope: str = attrs.field(validator=_validate_key)
    created_at: float | None = attrs.field(default=None, converter=_optional_time)
    cites: tuple[str, ...] = attrs.field(default=(), converter=_cites)


def _person_key(name: str) -> str:
    return unicodedata.normalize("NFKC", remove_lone_surrogates(name)).casefold().strip()


def _limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be an int >= 0, got {limit!r}")
    return limit


def _visible(principal: object, scope: object) -> bool:
    """Whether a trusted principal/scope pair can name any stored row at all."""
    if not isinstance(principal, str):
        raise TypeError(f"principal must be a str, got {type(principal).__name__}")
    if not isinstance(scope, str):
        raise TypeError(f"scope must be a str, got {type(scope).__name__}")
    return _encodable(principal) and _encodable(scope)


# -- schema -------------------------------------------------------------------------------------

# Memories get an INTEGER PRIMARY KEY so the external-content FTS table's rowids survive VACUUM.
# Ids are unique per (principal, scope): scenario files reuse short ids such as "m1".
_SCHEMA = f"""
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS memory_store_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT OR IGNORE INTO memory_store_meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}');
CREATE TABLE IF NOT EXISTS memories (
    seq INTEGER PRIMARY KEY,
    principal TEXT NOT NULL,
    scope TEXT NOT NULL,
    id TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at REAL NOT NULL,
    cites TEXT NOT NULL DEFAULT '[]',
    UNIQUE (principal, scope, id)
);
CREATE INDEX IF NOT EXISTS memories_recent ON memories (principal, scope, created_at DESC, id);
CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5(
    text,
    content = 'memories',
    content_rowid = 'seq',
    tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS memories_fts_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts (rowid, text) VALUES (new.seq, new.text);
END;
CREATE TRIGGER IF NOT EXISTS memories_fts_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, text) VALUES ('delete', old.seq, old.text);
END;
CREATE TRIGGER IF NOT EXISTS memories_fts_update AFTER UPDATE OF text ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, text) VALUES ('delete', old.seq, old.text);
    INSERT INTO memories_fts (rowid, text) VALUES (new.seq, new.text);
END;
CREATE TABLE IF NOT EXISTS embeddings (
    memory_seq INTEGER NOT NULL REFERENCES memories (seq) ON DELETE CASCADE,
    model TEXT NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (memory_seq, model)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS people (
    principal TEXT NOT NULL,
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (principal, scope, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS beliefs (
    principal TEXT NOT NULL,
    scope TEXT NOT NULL,
    id TEXT NOT NULL,
    person_key TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (principal, scope, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS beliefs_person
    ON beliefs (principal, scope, person_key, created_at DESC, id);
CREATE TABLE IF NOT EXISTS corrections (
    principal TEXT NOT NULL,
    scope TEXT NOT NULL,
    id TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at REAL NOT NULL,
    active INTEGER NOT NULL DEFAULT 1,
    superseded_by TEXT,
    PRIMARY KEY (principal, scope, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sources (
    principal TEXT NOT NULL,
    scope TEXT NOT NULL,
    id TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (principal, scope, id)
) WITHOUT ROWID;
COMMIT;
"""


_MEMORY_COLUMNS = "m.id, m.text, m.principal, m.scope, m.created_at, m.cites"


def _decode_cites(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, str):
        return ()
    try:
        value = json.loads(raw)
    except ValueError:
        return ()
    if not isinstance(value, list):
        return ()
    return tuple(str(item) for item in value)


def _memory(row: Row, *, score: float, arm: Arm) -> Evidence:
    return Evidence(
        id=row[0],
        kind="memory",
        text=row[1],
        score=score,
        arm=arm,
        principal=row[2],
        scope=row[3],
        created_at=float(row[4]),
        cites=_decode_cites(row[5]),
    )


# -- the store ----------------------------------------------------------------------------------


class MemoryStore:
    """An embedded memory store: ``async with MemoryStore(path) as store``.

    ``embedding`` enables the semantic arm (vectors are computed on write, in a worker thread);
    ``clock`` supplies ``created_at`` when a write does not give one (without a clock, writes
    must give it). ``timeout`` is SQLite's busy timeout in seconds. Opening creates the schema
    and switches the file to WAL; ``":memory:"`` gives a private in-memory store.

    Failures raise :class:`~plugin.errors.MemoryStoreError` subclasses: a missing folder
    :class:`MemoryStorePathError`, a damaged or foreign file :class:`MemoryStoreCorruptError`,
    a lock held too long :class:`MemoryStoreLockedError`. Hostile text in a read never raises.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        embedding: EmbeddingAdapter | None = None,
        clock: Clock | None = None,
        timeout: float = 5.0,
    ) -> None:
        self._path = os.fspath(path)
        self._embedding = embedding
        self._clock = clock
        self._timeout = timeout
        self._conn: Connection | None = None
        self._write_lock: anyio.Lock | None = None

    @property
    def path(self) -> str:
        return self._path

    @property
    def embedding(self) -> EmbeddingAdapter | None:
        """The adapter of the semantic arm, or None when the store has none."""
        return self._embedding

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> MemoryStore:
        if self._conn is not None:
            raise MemoryStoreError(f"memory store {self._path!r} is already open")
        await self._check_path()
        try:
            conn = await connect(self._path, timeout=self._timeout)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        try:
            await self._prepare(conn)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc) from exc
            raise
        self._conn = conn
        self._write_lock = anyio.Lock()
        return self

    async def _check_path(self) -> None:
        problem = await path_problem(self._path)
        if problem is not None:
            raise MemoryStorePathError(f"memory store {self._path!r}: {problem}")

    async def _prepare(self, conn: Connection) -> None:
        """Check that the file is empty or ours, then switch to WAL and create the schema.

        A database that is not a memory store (other tables, no store metadata, another
        schema version) is refused before anything in it changes, journal mode included.
        """
        tables = {
            row[0]
            for row in await conn.fetchall("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if tables:
            await self._check_version(conn, tables)
        await conn.fetchall("PRAGMA journal_mode=WAL")
        await conn.fetchall("PRAGMA foreign_keys=ON")
        with anyio.CancelScope(shield=True):  # never leave the write lock held
            try:
                await conn.executescript(_SCHEMA)
            except BaseException:
                await self._rollback(conn)
                raise
        await self._check_version(conn, {"memory_store_meta"})

    async def _check_version(self, conn: Connection, tables: set[str]) -> None:
        rows = (
            await conn.fetchall("SELECT value FROM memory_store_meta WHERE key = 'schema_version'")
            if "memory_store_meta" in tables
            else []
        )
        if rows != [(str(SCHEMA_VERSION),)]:
            found = f"schema version {rows[0][0]!r}" if rows else "no store metadata"
            raise MemoryStoreCorruptError(
                f"{self._path!r} is not a recallbound memory store of schema version "
                f"{SCHEMA_VERSION} ({found})"
            )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; idempotent."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()

    # -- plumbing -------------------------------------------------------------------------------

    def _error(self, exc: sqlite3.Error) -> MemoryStoreError:
        where = f"memory store {self._path!r}"
        if is_locked(exc):
            return MemoryStoreLockedError(f"{where} stayed locked beyond {self._timeout}s: {exc}")
        if is_corrupt(exc):
            return MemoryStoreCorruptError(f"{where} is not a database or is damaged: {exc}")
        if is_cantopen(exc):
            return MemoryStorePathError(f"{where} cannot be opened (does its folder exist?)")
        if isinstance(exc, sqlite3.IntegrityError):
            return MemoryConflictError(f"{where}: an item with this id already exists ({exc})")
        return MemoryStoreError(f"{where} failed: {exc}")

    def _connection(self) -> Connection:
        if self._conn is None:
            raise MemoryStoreClosedError(
                f"memory store {self._path!r} is used outside its `async with` block"
            )
        return self._conn

    @staticmethod
    async def _rollback(conn: Connection) -> None:
        # No transaction may be open (BEGIN failed), or the connection is gone: nothing to undo.
        with contextlib.suppress(sqlite3.Error):
            await conn.fetchall("ROLLBACK")

    async def _fetch(self, sql: str, params: Params = ()) -> list[Row]:
        conn = self._connection()
        try:
            return await conn.fetchall(sql, params)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    async def _write(self, statements: Sequence[tuple[str, Sequence[Params]]]) -> None:
        """Run ``statements`` (each with its parameter sets) in one shielded transaction."""
        conn = self._connection()
        assert self._write_lock is not None
        try:
            async with immediate(conn, self._write_lock):
                for sql, rows in statements:
                    if rows:
                        await conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _item_row(
        self, id: str, text: str, principal: str, scope: str, created_at: float | None
    ) -> tuple[str, str, str, str, float]:
        """``(principal, scope, id, text, created_at)``, checked: a correction's or a source's."""
        for field, value in (("id", id), ("principal", principal), ("scope", scope)):
            _check_key(value, field)
        return (principal, scope, id, _text(text), self._created_at(_optional_time(created_at)))

    def _created_at(self, value: float | None) -> float:
        if value is not None:
            return value
        if self._clock is None:
            raise InvalidMemoryError("created_at is required: this store has no clock")
        return float(self._clock.wall())

    # -- writes ---------------------------------------------------------------------------------

    async def add_memory(
        self,
        id: str,
        text: str,
        *,
        principal: str,
        scope: str,
        created_at: float | None = None,
        cites: Iterable[str] = (),
    ) -> None:
        """Store one memory (see :meth:`add_memories`)."""
        await self.add_memories(
            [
                MemoryRecord(
                    id=id,
                    text=text,
                    principal=principal,
                    scope=scope,
                    created_at=created_at,
                    cites=tuple(cites),
                )
            ]
        )

    async def add_memories(self, memories: Iterable[MemoryRecord]) -> int:
        """Store ``memories`` in one transaction and return how many were stored.

        With an embedding adapter, their vectors are computed first, in a worker thread. An id
        already stored for the same principal and scope (or repeated in the batch) raises
        :class:`MemoryConflictError` and stores nothing.
        """
        records = list(memories)
        for record in records:
            if not isinstance(record, MemoryRecord):
                raise InvalidMemoryError(
                    f"memories must be MemoryRecord values, got {type(record).__name__}"
                )
        if not records:
            return 0
        self._connection()
        rows = [
            (
                r.principal,
                r.scope,
                r.id,
                r.text,
                self._created_at(r.created_at),
                json.dumps(list(r.cites)),
            )
            for r in records
        ]
        statements: list[tuple[str, Sequence[Params]]] = [
            (
                "INSERT INTO memories (principal, scope, id, text, created_at, cites) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
        ]
        adapter = self._embedding
        if adapter is not None:
            blobs = await self._vectors(adapter, [r.text for r in records])
            statements.append(
                (
                    "INSERT INTO embeddings (memory_seq, model, vector) SELECT seq, ?, ? "
                    "FROM memories WHERE principal = ? AND scope = ? AND id = ?",
                    [
                        (adapter.name, blob, r.principal, r.scope, r.id)
                        for r, blob in zip(records, blobs, strict=True)
                    ],
                )
            )
        await self._write(statements)
        return len(records)

    @staticmethod
    async def _vectors(adapter: EmbeddingAdapter, texts: list[str]) -> list[bytes]:
        vectors = await anyio.to_thread.run_sync(adapter.embed, texts)
        array = np.asarray(vectors, dtype=np.float32)
        if array.shape != (len(texts), adapter.dimensions):
            raise MemoryStoreError(
                f"embedding adapter {adapter.name!r} returned shape {array.shape}, "
                f"expected {(len(texts), adapter.dimensions)}"
            )
        little = array.astype("<f4", copy=False)
        return [little[i].tobytes() for i in range(len(texts))]

    async def embed_missing(self, *, batch: int = 256) -> int:
        """Compute vectors for stored memories that have none for this store's adapter.

        For a store filled before an adapter was configured. Returns how many were embedded
        (0 without an adapter).
        """
        adapter = self._embedding
        if adapter is None:
            return 0
        done = 0
        while True:
            rows = await self._fetch(
                "SELECT m.seq, m.text FROM memories AS m WHERE NOT EXISTS ("
                "SELECT 1 FROM embeddings AS e WHERE e.memory_seq = m.seq AND e.model = ?) "
                "ORDER BY m.seq LIMIT ?",
                (adapter.name, batch),
            )
            if not rows:
                return done
            blobs = await self._vectors(adapter, [row[1] for row in rows])
            await self._write(
                [
                    (
                        "INSERT OR IGNORE INTO embeddings (memory_seq, model, vector) "
                        "VALUES (?, ?, ?)",
                        [
                            (row[0], adapter.name, blob)
                            for row, blob in zip(rows, blobs, strict=True)
                        ],
                    )
                ]
            )
            done += len(rows)

    async def add_person(self, name: str, *, principal: str, scope: str) -> None:
        """Make ``name`` a known person for this principal and scope; idempotent."""
        await self._write([self._person_statement(name, principal, scope)])

    @staticmethod
    def _person_statement(name: str, principal: str, scope: str) -> tuple[str, list[Params]]:
        for field, value in (("name", name), ("principal", principal), ("scope", scope)):
            _check_key(value, field)
        return (
            "INSERT OR IGNORE INTO people (principal, scope, key, name) VALUES (?, ?, ?, ?)",
            [(principal, scope, _person_key(name), name.strip())],
        )

    async def add_belief(
        self,
        id: str,
        person: str,
        text: str,
        *,
        principal: str,
        scope: str,
        created_at: float | None = None,
    ) -> None:
        """Store a belief held by ``person`` (who becomes a known person if not one yet)."""
        _check_key(id, "id")
        person_statement = self._person_statement(person, principal, scope)
        row = (
            principal,
            scope,
            id,
            _person_key(person),
            _text(text),
            self._created_at(_optional_time(created_at)),
        )
        await self._write(
            [
                person_statement,
                (
                    "INSERT INTO beliefs (principal, scope, id, person_key, text, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    [row],
                ),
            ]
        )

    async def add_correction(
        self,
        id: str,
        text: str,
        *,
        principal: str,
        scope: str,
        created_at: float | None = None,
        supersedes: Iterable[str] = (),
    ) -> None:
        """Store an active correction notice; those it ``supersedes`` stop being current."""
        row = self._item_row(id, text, principal, scope, created_at)
        replaced = _check_ids(supersedes, "supersedes")
        await self._write(
            [
                (
                    "INSERT INTO corrections (principal, scope, id, text, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [row],
                ),
                (
                    "UPDATE corrections SET active = 0, superseded_by = ? "
                    "WHERE principal = ? AND scope = ? AND id = ? AND id != ?",
                    [(id, principal, scope, old, id) for old in replaced],
                ),
            ]
        )

    async def add_source(
        self,
        id: str,
        text: str,
        *,
        principal: str,
        scope: str,
        created_at: float | None = None,
    ) -> None:
        """Store a source document that memories may cite."""
        row = self._item_row(id, text, principal, scope, created_at)
        await self._write(
            [
                (
                    "INSERT INTO sources (principal, scope, id, text, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [row],
                )
            ]
        )

    # -- reads ----------------------------------------------------------------------------------

    async def sparse_candidates(
        self, query: str, *, principal: str, scope: str, limit: int
    ) -> list[Evidence]:
        """Memories matching any word of ``query`` by bm25, best first (ties: oldest row first).

        ``query`` is user text, never FTS5 syntax: it goes through
        :func:`~plugin.memory.fts.fts5_match_expression`. When that leaves no term the arm does
        not run and the result is empty (callers that must report "reserved, not executed"
        check ``fts5_match_expression(query) is None`` first). Never raises on any ``str``.
        """
        limit = _limit(limit)
        expression = fts5_match_expression(query)
        if expression is None or limit == 0 or not _visible(principal, scope):
            return []
        rows = await self._fetch(
            f"SELECT {_MEMORY_COLUMNS}, memories_fts.rank "
            "FROM memories_fts JOIN memories AS m ON m.seq = memories_fts.rowid "
            "WHERE memories_fts MATCH ? AND m.principal = ? AND m.scope = ? "
            "ORDER BY memories_fts.rank, m.seq LIMIT ?",
            (expression, principal, scope, limit),
        )
        return [_memory(row, score=-float(row[6]), arm="sparse") for row in rows]

    async def semantic_candidates(
        self, vector: npt.ArrayLike, *, principal: str, scope: str, limit: int
    ) -> list[Evidence]:
        """Memories by cosine similarity to ``vector`` (best first, ties by id).

        ``vector`` is a query embedding from this store's adapter (L2-normalised, of its
        dimensions; else ``ValueError``). Without an adapter the result is empty.
        """
        limit = _limit(limit)
        adapter = self._embedding
        if adapter is None or limit == 0 or not _visible(principal, scope):
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape != (adapter.dimensions,):
            raise ValueError(
                f"vector must have {adapter.dimensions} dimensions, got shape {query.shape}"
            )
        if not np.isfinite(query).all():
            raise ValueError("vector must be finite")
        rows = await self._fetch(
            f"SELECT {_MEMORY_COLUMNS}, e.vector "
            "FROM memories AS m JOIN embeddings AS e ON e.memory_seq = m.seq "
            "WHERE m.principal = ? AND m.scope = ? AND e.model = ?",
            (principal, scope, adapter.name),
        )
        width = adapter.dimensions * 4
        rows = [row for row in rows if isinstance(row[6], bytes) and len(row[6]) == width]
        if not rows:
            return []
        matrix = np.frombuffer(b"".join(row[6] for row in rows), dtype="<f4").reshape(
            len(rows), adapter.dimensions
        )
        scores = matrix @ query
        order = sorted(range(len(rows)), key=lambda i: (-float(scores[i]), rows[i][0]))
        return [_memory(rows[i], score=float(scores[i]), arm="semantic") for i in order[:limit]]

    async def recent_candidates(self, *, principal: str, scope: str, limit: int) -> list[Evidence]:
        """The newest memories first (ties by id)."""
        limit = _limit(limit)
        if limit == 0 or not _visible(principal, scope):
            return []
        rows = await self._fetch(
            f"SELECT {_MEMORY_COLUMNS} FROM memories AS m "
            "WHERE m.principal = ? AND m.scope = ? ORDER BY m.created_at DESC, m.id LIMIT ?",
            (principal, scope, limit),
        )
        return [_memory(row, score=float(row[4]), arm="recent") for row in rows]

    async def get_memories(
        self, ids: Iterable[str], *, principal: str, scope: str
    ) -> list[Evidence]:
        """The memories with these ids that this principal may see in this scope.

        In the order of ``ids`` (repeats once); unknown, foreign and unencodable ids are left
        out. Used to re-validate evidence a run already retained.
        """
        if isinstance(ids, str):
            raise TypeError("ids must be an iterable of memory ids, not a str")
        wanted: dict[str, None] = {}
        for memory_id in ids:
            if not isinstance(memory_id, str):
                raise TypeError(f"memory ids must be str, got {type(memory_id).__name__}")
            if _encodable(memory_id):
                wanted.setdefault(memory_id)
        if not wanted or not _visible(principal, scope):
            return []
        rows = await self._fetch(
            f"SELECT {_MEMORY_COLUMNS} FROM memories AS m "
            "WHERE m.principal = ? AND m.scope = ? "
            "AND m.id IN (SELECT value FROM json_each(?))",
            (principal, scope, json.dumps(list(wanted))),
        )
        by_id = {row[0]: row for row in rows}
        return [
            _memory(by_id[memory_id], score=float(by_id[memory_id][4]), arm="lookup")
            for memory_id in wanted
            if memory_id in by_id
        ]

    async def discover_people(self, text: str, *, principal: str, scope: str) -> list[Person]:
        """Known people whose name occurs in ``text`` as a whole word, in order of appearance.

        Case-insensitive (NFKC and case folding on both sides); only the first
        :data:`~plugin.memory.fts.MAX_SCAN_CHARS` characters of ``text`` are scanned.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not _visible(principal, scope):
            return []
        haystack = _person_key(text[:MAX_SCAN_CHARS])
        if not haystack:
            return []
        rows = await self._fetch(
            "SELECT key, name FROM people WHERE principal = ? AND scope = ?",
            (principal, scope),
        )
        found: list[tuple[int, str, str]] = []
        for key, name in rows:
            match = re.search(r"(?<!\w)" + re.escape(key) + r"(?!\w)", haystack)
            if match is not None:
                found.append((match.start(), key, name))
        found.sort()
        return [Person(name=name, principal=principal, scope=scope) for _, _, name in found]

    async def beliefs_of(
        self, person: str, *, principal: str, scope: str, limit: int
    ) -> list[Evidence]:
        """The beliefs held by ``person`` (matched case-insensitively), newest first."""
        limit = _limit(limit)
        if not isinstance(person, str):
            raise TypeError(f"person must be a str, got {type(person).__name__}")
        if limit == 0 or not _visible(principal, scope):
            return []
        rows = await self._fetch(
            "SELECT id, text, principal, scope, created_at FROM beliefs "
            "WHERE principal = ? AND scope = ? AND person_key = ? "
            "ORDER BY created_at DESC, id LIMIT ?",
            (principal, scope, _person_key(person), limit),
        )
        return [self._plain(row, kind="belief", arm="belief") for row in rows]

    async def current_corrections(
        self, *, principal: str, scope: str, limit: int | None = None
    ) -> list[Evidence]:
        """Active (not superseded) correction notices, newest first (ties by id)."""
        bound = -1 if limit is None else _limit(limit)
        if bound == 0 or not _visible(principal, scope):
            return []
        rows = await self._fetch(
            "SELECT id, text, principal, scope, created_at FROM corrections "
            "WHERE principal = ? AND scope = ? AND active = 1 "
            "ORDER BY created_at DESC, id LIMIT ?",
            (principal, scope, bound),
        )
        return [self._plain(row, kind="correction", arm="correction") for row in rows]

    async def read_source(self, source_id: str, *, principal: str, scope: str) -> Evidence | None:
        """The source ``source_id`` if this principal may see it in this scope, else None."""
        if not isinstance(source_id, str):
            raise TypeError(f"source_id must be a str, got {type(source_id).__name__}")
        if not _visible(principal, scope) or not _encodable(source_id):
            return None
        rows = await self._fetch(
            "SELECT id, text, principal, scope, created_at FROM sources "
            "WHERE principal = ? AND scope = ? AND id = ?",
            (principal, scope, source_id),
        )
        return self._plain(rows[0], kind="source", arm="source") if rows else None

    @staticmethod
    def _plain(row: Row, *, kind: EvidenceKind, arm: Arm) -> Evidence:
        return Evidence(
            id=row[0],
            kind=kind,
            text=row[1],
            score=float(row[4]),
            arm=arm,
            principal=row[2],
            scope=row[3],
            created_at=float(row[4]),
        )
