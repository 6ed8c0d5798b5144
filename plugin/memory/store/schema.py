"""What the store's file holds: the schema, its version, how it migrates, and how a row
becomes evidence.

**One term index for every cell** (:mod:`.sparse_index`): cells are rows of
``memory_cells``, with their bm25 statistics maintained by the writes, never tables, so the
schema is the same size at 100,000 cells as at one. A change log filled by triggers on
``memories`` keeps that index exact, whoever writes a row (but for a plain-SQL ``REPLACE``,
which deletes the replaced row without its delete triggers).

**Migration.** Opening a file of an older version runs :func:`upgrade` in one
``BEGIN IMMEDIATE`` transaction. Version 1 (one table-wide FTS5 index, no stemming) loses
that index and its triggers; version 2 (one FTS5 table per cell) loses its cell tables; then
every memory is logged and replayed into the term index and the version becomes
:data:`SCHEMA_VERSION`. A crash or an error anywhere leaves the file at its old version,
untouched; the next open starts over.
"""

from __future__ import annotations

import functools
import json
import sqlite3

from ...control._sqlite import Row
from . import sparse_index
from .sparse_index import INDEX_TABLES, index_logged
from .values import Arm, Evidence, EvidenceKind

__all__ = [
    "INDEX_LOG",
    "INDEX_TABLES",
    "MEMORY_COLUMNS",
    "ORPHAN_VECTORS_SWEPT",
    "READABLE_VERSIONS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SWEEP_ORPHAN_VECTORS",
    "index_logged",
    "memory_evidence",
    "plain_evidence",
    "schema_objects",
    "upgrade",
]

SCHEMA_VERSION = 3
#: Versions a store opens: older ones are migrated in place by :func:`upgrade`.
READABLE_VERSIONS = (1, 2, SCHEMA_VERSION)
_OLDER = ([("1",)], [("2",)])

#: The change log and the triggers that fill it (statements without their final ``;``).
INDEX_LOG = (
    """CREATE TABLE IF NOT EXISTS memory_index_log (
    change INTEGER PRIMARY KEY,
    principal TEXT NOT NULL,
    scope TEXT NOT NULL,
    seq INTEGER NOT NULL,
    text TEXT NOT NULL,
    op TEXT NOT NULL CHECK (op IN ('insert', 'delete'))
)""",
    "CREATE INDEX IF NOT EXISTS memory_index_log_cell "
    "ON memory_index_log (principal, scope, change)",
    """CREATE TRIGGER IF NOT EXISTS memories_index_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memory_index_log (principal, scope, seq, text, op)
        VALUES (new.principal, new.scope, new.seq, new.text, 'insert');
END""",
    """CREATE TRIGGER IF NOT EXISTS memories_index_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memory_index_log (principal, scope, seq, text, op)
        VALUES (old.principal, old.scope, old.seq, old.text, 'delete');
END""",
    """CREATE TRIGGER IF NOT EXISTS memories_index_update
    AFTER UPDATE OF seq, principal, scope, text ON memories BEGIN
    INSERT INTO memory_index_log (principal, scope, seq, text, op)
        VALUES (old.principal, old.scope, old.seq, old.text, 'delete'),
               (new.principal, new.scope, new.seq, new.text, 'insert');
END""",
)


_INDEX_SQL = "".join(statement + ";\n" for statement in (*INDEX_LOG, *INDEX_TABLES))

#: The tables of version 1's table-wide index and of version 2's per-cell indexes.
_OLD_INDEXES = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%' "
    "AND (name = 'memories_fts' OR name GLOB 'memories_fts_*')"
)

_FROM_VERSION_1 = (
    "DROP TRIGGER IF EXISTS memories_fts_insert",
    "DROP TRIGGER IF EXISTS memories_fts_delete",
    "DROP TRIGGER IF EXISTS memories_fts_update",
)


def upgrade(conn: sqlite3.Connection) -> None:
    """Migrate an older store file to :data:`SCHEMA_VERSION` in one transaction (a no-op on a
    current one). Runs on the connection's own thread (``Connection.run``); any error rolls
    the whole migration back and propagates."""
    version = "SELECT value FROM memory_store_meta WHERE key = 'schema_version'"
    if conn.execute(version).fetchall() not in _OLDER:
        return  # nothing to migrate: no write lock taken
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute(version).fetchall() in _OLDER:  # another process may have won
            for sql in _FROM_VERSION_1:
                conn.execute(sql)
            for (name,) in conn.execute(_OLD_INDEXES).fetchall():
                conn.execute(f'DROP TABLE "{name}"')  # a virtual table takes its shadows along
            for sql in (*INDEX_LOG, *INDEX_TABLES):
                conn.execute(sql)
            conn.execute("DELETE FROM memory_index_log")
            conn.execute(
                "INSERT INTO memory_index_log (principal, scope, seq, text, op) "
                "SELECT principal, scope, seq, text, 'insert' FROM memories ORDER BY seq"
            )
            sparse_index.index_logged(conn)
            conn.execute(
                "UPDATE memory_store_meta SET value = ? WHERE key = 'schema_version'",
                (str(SCHEMA_VERSION),),
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


_KINDS = ("memories", "beliefs", "sources")
# An id names one item of a cell, whatever its kind: a call's recorded evidence (ids alone) is
# re-read as what it was. One trigger a table: a row whose id another kind holds is refused.
_ONE_ID_SQL = "".join(
    f"""CREATE TRIGGER IF NOT EXISTS {table}_id_unique BEFORE INSERT ON {table}
    WHEN """ + " OR ".join(
        f"EXISTS (SELECT 1 FROM {other} WHERE principal = new.principal AND scope = new.scope "
        f"AND id = new.id)" for other in _KINDS if other != table) + """ BEGIN
    SELECT RAISE(ABORT, 'an item of another kind holds this id');
END;
""" for table in _KINDS)


# Memories get an INTEGER PRIMARY KEY so the term index's seqs survive VACUUM.
# Ids are unique per (principal, scope): scenario files reuse short ids such as "m1".
SCHEMA = f"""
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
-- Listing a cell page by page (a tie: the later write first): each page one range of it.
CREATE INDEX IF NOT EXISTS memories_listing
    ON memories (principal, scope, created_at DESC, seq DESC);
-- Which cell holds an id: ``remember`` refuses an id another principal or scope holds.
CREATE INDEX IF NOT EXISTS memories_id ON memories (id);
{_INDEX_SQL}
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
-- The semantic arm's cache key (see vectors.py), moved in the same transaction as the change,
-- whichever connection or process made it: ``generation`` on any change to a cell's memories
-- or vectors, ``resets`` on any change but a vector appended past ``watermark`` (the highest
-- memory seq given a vector so far). A cached matrix whose resets still hold only needs the
-- rows past its own highest seq.
CREATE TABLE IF NOT EXISTS vector_generations (
    principal TEXT NOT NULL,
    scope TEXT NOT NULL,
    generation INTEGER NOT NULL,
    resets INTEGER NOT NULL,
    watermark INTEGER NOT NULL,
    PRIMARY KEY (principal, scope)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS embeddings_generation_insert AFTER INSERT ON embeddings BEGIN
    INSERT INTO vector_generations (principal, scope, generation, resets, watermark)
        SELECT principal, scope, 1, 0, seq FROM memories WHERE seq = new.memory_seq
        ON CONFLICT (principal, scope) DO UPDATE SET
            generation = generation + 1,
            resets = resets + (excluded.watermark <= watermark),
            watermark = max(watermark, excluded.watermark);
END;
CREATE TRIGGER IF NOT EXISTS embeddings_generation_change AFTER UPDATE ON embeddings BEGIN
    INSERT INTO vector_generations (principal, scope, generation, resets, watermark)
        SELECT principal, scope, 1, 1, seq FROM memories
        WHERE seq IN (old.memory_seq, new.memory_seq)
        ON CONFLICT (principal, scope) DO UPDATE SET
            generation = generation + 1, resets = resets + 1;
END;
CREATE TRIGGER IF NOT EXISTS embeddings_generation_delete AFTER DELETE ON embeddings BEGIN
    INSERT INTO vector_generations (principal, scope, generation, resets, watermark)
        SELECT principal, scope, 1, 1, seq FROM memories WHERE seq = old.memory_seq
        ON CONFLICT (principal, scope) DO UPDATE SET
            generation = generation + 1, resets = resets + 1;
END;
-- A memory's vectors go with it, whoever deletes it (plain SQL runs without foreign keys, so
-- ON DELETE CASCADE alone would leave a vector that a reused seq then inherits).
CREATE TRIGGER IF NOT EXISTS memories_vectors_delete AFTER DELETE ON memories BEGIN
    DELETE FROM embeddings WHERE memory_seq = old.seq;
END;
-- A REPLACE deletes the row it replaces without a delete trigger: its vectors go first (unless
-- its text stays, as in an upsert of the same text). A new row's seq holds no vector yet (one
-- left there is another memory's), and a changed text's vector is stale.
CREATE TRIGGER IF NOT EXISTS memories_vectors_replace BEFORE INSERT ON memories BEGIN
    DELETE FROM embeddings WHERE memory_seq IN (SELECT seq FROM memories WHERE
        principal = new.principal AND scope = new.scope AND id = new.id
        AND text IS NOT new.text);
END;
CREATE TRIGGER IF NOT EXISTS memories_vectors_insert AFTER INSERT ON memories BEGIN
    DELETE FROM embeddings WHERE memory_seq = new.seq;
END;
CREATE TRIGGER IF NOT EXISTS memories_vectors_update AFTER UPDATE OF seq, text ON memories
    WHEN old.text IS NOT new.text OR old.seq IS NOT new.seq BEGIN
    DELETE FROM embeddings WHERE memory_seq IN (old.seq, new.seq);
END;
{_ONE_ID_SQL}CREATE TRIGGER IF NOT EXISTS memories_generation_delete AFTER DELETE ON memories BEGIN
    INSERT INTO vector_generations (principal, scope, generation, resets, watermark)
        VALUES (old.principal, old.scope, 1, 1, old.seq)
        ON CONFLICT (principal, scope) DO UPDATE SET
            generation = generation + 1, resets = resets + 1;
END;
CREATE TRIGGER IF NOT EXISTS memories_generation_move
    AFTER UPDATE OF principal, scope, id, seq ON memories BEGIN
    INSERT INTO vector_generations (principal, scope, generation, resets, watermark)
        VALUES (old.principal, old.scope, 1, 1, old.seq), (new.principal, new.scope, 1, 1, new.seq)
        ON CONFLICT (principal, scope) DO UPDATE SET
            generation = generation + 1, resets = resets + 1;
END;
COMMIT;
"""


@functools.cache
def schema_objects() -> frozenset[tuple[str, str]]:
    """The ``(type, name)`` of every table, index and trigger :data:`SCHEMA` creates: a file
    holding them all at :data:`SCHEMA_VERSION` opens without running it (nor taking the write
    lock it begins with)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(SCHEMA)
        return frozenset(conn.execute("SELECT type, name FROM sqlite_master").fetchall())
    finally:
        conn.close()


#: Whether a file was swept of the vectors a plain SQL delete left before the trigger that
#: deletes them existed (once per file: :data:`SWEEP_ORPHAN_VECTORS`).
ORPHAN_VECTORS_SWEPT = "SELECT 1 FROM memory_store_meta WHERE key = 'orphan_vectors_swept'"
SWEEP_ORPHAN_VECTORS = """
BEGIN IMMEDIATE;
DELETE FROM embeddings WHERE memory_seq NOT IN (SELECT seq FROM memories);
INSERT OR IGNORE INTO memory_store_meta (key, value) VALUES ('orphan_vectors_swept', '1');
COMMIT;
"""

#: The columns :func:`memory_evidence` reads, in its order, from ``memories AS m``.
MEMORY_COLUMNS = "m.id, m.text, m.principal, m.scope, m.created_at, m.cites"


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


def memory_evidence(row: Row, *, score: float, arm: Arm) -> Evidence:
    """A memory row (:data:`MEMORY_COLUMNS` first) as evidence."""
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


def plain_evidence(row: Row, *, kind: EvidenceKind, arm: Arm) -> Evidence:
    """An ``(id, text, principal, scope, created_at)`` row as evidence scored by its time."""
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
