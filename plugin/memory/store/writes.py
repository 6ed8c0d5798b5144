"""How things get into the store: memories (with their vectors and their place in the term
index), People, beliefs, corrections and sources. Each write is one transaction; a rejected
value stores nothing."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterable
from functools import partial

import anyio.to_thread
import attrs
import numpy as np

from ...control.clock import Clock
from ...errors import MemoryStoreError
from ..embedding import EmbeddingAdapter
from ..threads import memory_threads
from .database import Database, Statement
from .errors import InvalidMemoryError, MemoryIdTakenError, MemoryOwnershipError
from .sparse_index import index_logged
from .values import (
    MemoryRecord,
    MemoryWrite,
    check_count,
    check_ids,
    check_key,
    check_text,
    check_time,
    person_key,
)

__all__ = ["Writer"]


def _still_held(rows: list[tuple[object, ...]], raw: sqlite3.Connection) -> int:
    """Write each (seq, model, vector, seq, text) of ``rows`` where the memory ``seq`` still
    holds ``text``; how many were written. Another writer may have replaced the text while it
    was embedded, or forgotten the memory and given its seq to a new one."""
    return raw.executemany(
        "INSERT OR IGNORE INTO embeddings (memory_seq, model, vector) SELECT ?, ?, ? "
        "WHERE EXISTS (SELECT 1 FROM memories WHERE seq = ? AND text = ?)", rows).rowcount


async def _vectors(adapter: EmbeddingAdapter, texts: list[str]) -> list[bytes]:
    """Little-endian float32 blobs of ``texts``' vectors, computed in a worker thread."""
    try:
        vectors = await anyio.to_thread.run_sync(adapter.embed, texts,
                                                limiter=memory_threads())
        array = np.asarray(vectors, dtype=np.float32)
        expected = (len(texts), adapter.dimensions)
    except Exception as exc:  # the adapter raised, or gave what is not an array of numbers
        raise MemoryStoreError(f"embedding adapter {adapter.name!r} failed: "
                               f"{type(exc).__name__}: {exc}"[:500]) from exc
    if array.shape != expected:
        raise MemoryStoreError(
            f"embedding adapter {adapter.name!r} returned shape {array.shape}, "
            f"expected {expected}"
        )
    if not np.isfinite(array).all():  # a NaN would rank first in every search
        raise MemoryStoreError(f"embedding adapter {adapter.name!r} returned a vector that "
                               f"is not finite (NaN or infinity)")
    little = array.astype("<f4", copy=False)
    return [little[i].tobytes() for i in range(len(texts))]


def _held_elsewhere(conn: sqlite3.Connection, principal: str, scope: str, id: str) -> bool:
    """Whether another principal or scope holds memory ``id`` and this cell does not: two
    lookups of one row each, however many cells hold the id."""
    if conn.execute(
        "SELECT 1 FROM memories WHERE principal = ? AND scope = ? AND id = ?",
        (principal, scope, id),
    ).fetchone() is not None:
        return False  # the cell's own memory: an update
    return conn.execute("SELECT 1 FROM memories WHERE id = ? LIMIT 1", (id,)).fetchone() is not None


def _person_statement(name: str, principal: str, scope: str) -> Statement:
    for field, value in (("name", name), ("principal", principal), ("scope", scope)):
        check_key(value, field)
    return (
        "INSERT OR IGNORE INTO people (principal, scope, key, name) VALUES (?, ?, ?, ?)",
        [(principal, scope, person_key(name), name.strip())],
    )


@attrs.define(eq=False)
class Writer:
    """The store's write methods (see :class:`~plugin.memory.store.MemoryStore`)."""

    db: Database
    embedding: EmbeddingAdapter | None
    clock: Clock

    def _created_at(self, value: float | None) -> float:
        if value is not None:
            return value
        return float(self.clock.wall())

    def _item_row(
        self, id: str, text: str, principal: str, scope: str, created_at: float | None
    ) -> tuple[str, str, str, str, float]:
        """``(principal, scope, id, text, created_at)``, checked: a correction's or a source's."""
        for field, value in (("id", id), ("principal", principal), ("scope", scope)):
            check_key(value, field)
        return (principal, scope, id, check_text(text), self._created_at(check_time(created_at)))

    async def add_memories(self, memories: Iterable[MemoryRecord]) -> int:
        records = list(memories)
        for record in records:
            if not isinstance(record, MemoryRecord):
                raise InvalidMemoryError(
                    f"memories must be MemoryRecord values, got {type(record).__name__}"
                )
        if not records:
            return 0
        self.db.connection()
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
        statements: list[Statement] = [
            (
                "INSERT INTO memories (principal, scope, id, text, created_at, cites) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
        ]
        adapter = self.embedding
        if adapter is not None:
            blobs = await _vectors(adapter, [r.text for r in records])
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

        def write(conn: sqlite3.Connection) -> None:
            for sql, params in statements:
                conn.executemany(sql, params)
            index_logged(conn)

        await self.db.transact(write)
        return len(records)

    async def remember(self, memories: Iterable[MemoryWrite]) -> list[str]:
        """Upsert ``memories`` in one transaction; their ids, in order (see
        :meth:`~plugin.memory.store.MemoryStore.remember_many`)."""
        items = list(memories)
        for record in items:
            if not isinstance(record, MemoryWrite):
                raise InvalidMemoryError(
                    f"memories must be MemoryWrite values, got {type(record).__name__}"
                )
        ids = [record.id if record.id is not None else str(uuid.uuid4()) for record in items]
        first: dict[str, int] = {}
        for index, memory_id in enumerate(ids):
            if memory_id in first:
                raise InvalidMemoryError(
                    f"memory {index} of the batch repeats the id {memory_id!r} "
                    f"of memory {first[memory_id]}"
                )
            first[memory_id] = index
        if not items:
            return []
        self.db.connection()
        now = self._created_at(None)
        adapter = self.embedding
        blobs = await _vectors(adapter, [r.text for r in items]) if adapter is not None else None
        rows = [(r.principal, r.scope, i, r.text, now) for r, i in zip(items, ids, strict=True)]

        def write(conn: sqlite3.Connection) -> None:
            for principal, scope, memory_id, _, _ in rows:
                if _held_elsewhere(conn, principal, scope, memory_id):
                    raise MemoryOwnershipError(memory_id)
                if conn.execute(
                    "SELECT 1 FROM beliefs WHERE principal = ? AND scope = ? AND id = ? UNION ALL "
                    "SELECT 1 FROM sources WHERE principal = ? AND scope = ? AND id = ?",
                    (principal, scope, memory_id) * 2,
                ).fetchone() is not None:
                    raise MemoryIdTakenError(memory_id)
            # A replaced memory's vectors describe its old text: drop them with it.
            conn.executemany(
                "DELETE FROM embeddings WHERE memory_seq = ("
                "SELECT seq FROM memories WHERE principal = ? AND scope = ? AND id = ?)",
                [(p, s, i) for p, s, i, _, _ in rows],
            )
            conn.executemany(
                "INSERT INTO memories (principal, scope, id, text, created_at, cites) "
                "VALUES (?, ?, ?, ?, ?, '[]') ON CONFLICT (principal, scope, id) DO UPDATE "
                "SET text = excluded.text, cites = '[]', "
                # never older than it was: a clock stepped back cannot move it behind a listing
                "created_at = max(excluded.created_at, created_at)",
                rows,
            )
            if adapter is not None and blobs is not None:
                conn.executemany(
                    "INSERT INTO embeddings (memory_seq, model, vector) SELECT seq, ?, ? "
                    "FROM memories WHERE principal = ? AND scope = ? AND id = ?",
                    [(adapter.name, blob, p, s, i)
                     for (p, s, i, _, _), blob in zip(rows, blobs, strict=True)],
                )
            index_logged(conn)

        await self.db.transact(write)
        return ids

    async def forget(self, id: str, *, principal: str, scope: str) -> bool:
        for field, value in (("id", id), ("principal", principal), ("scope", scope)):
            check_key(value, field)

        def delete(conn: sqlite3.Connection) -> bool:
            # Vectors first: the cascade needs foreign keys on, which a plain-SQL writer may
            # not have set.
            conn.execute(
                "DELETE FROM embeddings WHERE memory_seq = ("
                "SELECT seq FROM memories WHERE principal = ? AND scope = ? AND id = ?)",
                (principal, scope, id),
            )
            gone = conn.execute(
                "DELETE FROM memories WHERE principal = ? AND scope = ? AND id = ?",
                (principal, scope, id),
            ).rowcount
            index_logged(conn)
            return gone > 0

        return await self.db.transact(delete)

    async def unembedded(self, *, probe: int | None = None) -> int:
        if probe is not None:
            probe = check_count(probe, "probe")
        adapter = self.embedding
        if adapter is None:
            return 0
        lacking = ("NOT EXISTS (SELECT 1 FROM embeddings AS e "
                   "WHERE e.memory_seq = m.seq AND e.model = ?)")
        if probe is None:
            query = f"SELECT count(*) FROM memories AS m WHERE {lacking}"
            params: tuple[object, ...] = (adapter.name,)
        else:
            query = (f"SELECT count(*) FROM memories AS m WHERE {lacking} AND m.seq IN ("
                     "SELECT seq FROM (SELECT seq FROM memories ORDER BY seq LIMIT ?) UNION "
                     "SELECT seq FROM (SELECT seq FROM memories ORDER BY seq DESC LIMIT ?))")
            params = (adapter.name, probe, probe)
        rows = await self.db.fetch(query, params)
        return int(rows[0][0])

    async def embed_missing(self, *, batch: int = 256) -> int:
        batch = check_count(batch, "batch", least=1)
        adapter = self.embedding
        if adapter is None:
            return 0
        done, after = 0, -1
        while True:  # on from the last memory read: each memory is looked at once
            rows = await self.db.fetch(
                "SELECT m.seq, m.text FROM memories AS m WHERE m.seq > ? AND NOT EXISTS ("
                "SELECT 1 FROM embeddings AS e WHERE e.memory_seq = m.seq AND e.model = ?) "
                "ORDER BY m.seq LIMIT ?",
                (after, adapter.name, batch),
            )
            if not rows:
                return done
            after = rows[-1][0]
            blobs = await _vectors(adapter, [row[1] for row in rows])
            # Written only where the row still holds the text that was embedded: another
            # writer may have replaced it, or forgotten it and reused its seq, meanwhile.
            done += await self.db.transact(partial(_still_held, [
                (row[0], adapter.name, blob, row[0], row[1])
                for row, blob in zip(rows, blobs, strict=True)]))

    async def add_person(self, name: str, *, principal: str, scope: str) -> None:
        await self.db.write([_person_statement(name, principal, scope)])

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
        check_key(id, "id")
        person_statement = _person_statement(person, principal, scope)
        row = (
            principal,
            scope,
            id,
            person_key(person),
            check_text(text),
            self._created_at(check_time(created_at)),
        )
        await self.db.write(
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
        row = self._item_row(id, text, principal, scope, created_at)
        replaced = check_ids(supersedes, "supersedes")
        await self.db.write(
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
        row = self._item_row(id, text, principal, scope, created_at)
        await self.db.write(
            [
                (
                    "INSERT INTO sources (principal, scope, id, text, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [row],
                )
            ]
        )
