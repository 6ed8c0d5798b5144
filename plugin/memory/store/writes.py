"""How things get into the store: memories (with their vectors and their cells' full-text
indexes), People, beliefs, corrections and sources. Each write is one transaction; a rejected
value stores nothing."""

from __future__ import annotations

import json
from collections.abc import Iterable

import anyio.to_thread
import attrs
import numpy as np

from ...control.clock import Clock
from ...errors import MemoryStoreError
from ..embedding import EmbeddingAdapter
from .database import Database, Statement
from .errors import InvalidMemoryError
from .schema import index_cell
from .values import MemoryRecord, check_ids, check_key, check_text, check_time, person_key

__all__ = ["Writer", "index_statements"]


async def _vectors(adapter: EmbeddingAdapter, texts: list[str]) -> list[bytes]:
    """Little-endian float32 blobs of ``texts``' vectors, computed in a worker thread."""
    vectors = await anyio.to_thread.run_sync(adapter.embed, texts)
    array = np.asarray(vectors, dtype=np.float32)
    if array.shape != (len(texts), adapter.dimensions):
        raise MemoryStoreError(
            f"embedding adapter {adapter.name!r} returned shape {array.shape}, "
            f"expected {(len(texts), adapter.dimensions)}"
        )
    little = array.astype("<f4", copy=False)
    return [little[i].tobytes() for i in range(len(texts))]


def _person_statement(name: str, principal: str, scope: str) -> Statement:
    for field, value in (("name", name), ("principal", principal), ("scope", scope)):
        check_key(value, field)
    return (
        "INSERT OR IGNORE INTO people (principal, scope, key, name) VALUES (?, ?, ?, ?)",
        [(principal, scope, person_key(name), name.strip())],
    )


def index_statements(cells: Iterable[tuple[str, str]]) -> list[Statement]:
    """Bring these cells' full-text indexes up to date (see :func:`.schema.index_cell`)."""
    return [
        (sql, [params])
        for principal, scope in cells
        for sql, params in index_cell(principal, scope)
    ]


@attrs.define(eq=False)
class Writer:
    """The store's write methods (see :class:`~plugin.memory.store.MemoryStore`)."""

    db: Database
    embedding: EmbeddingAdapter | None
    clock: Clock | None

    def _created_at(self, value: float | None) -> float:
        if value is not None:
            return value
        if self.clock is None:
            raise InvalidMemoryError("created_at is required: this store has no clock")
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
        statements += index_statements(dict.fromkeys((r.principal, r.scope) for r in records))
        await self.db.write(statements)
        return len(records)

    async def embed_missing(self, *, batch: int = 256) -> int:
        adapter = self.embedding
        if adapter is None:
            return 0
        done = 0
        while True:
            rows = await self.db.fetch(
                "SELECT m.seq, m.text FROM memories AS m WHERE NOT EXISTS ("
                "SELECT 1 FROM embeddings AS e WHERE e.memory_seq = m.seq AND e.model = ?) "
                "ORDER BY m.seq LIMIT ?",
                (adapter.name, batch),
            )
            if not rows:
                return done
            blobs = await _vectors(adapter, [row[1] for row in rows])
            await self.db.write(
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
