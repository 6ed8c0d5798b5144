"""What the store's file holds: the schema, its version, how it migrates, and how a row
becomes evidence.

**One full-text index per cell.** Each (principal, scope) cell has its own contentless FTS5
table, created by the first write to the cell, so bm25's statistics (document count, average
length, how many documents hold a term) are the cell's own, and a search ranks only the
cell's matches. The table's name is ``memories_fts_`` and 32 hex digits of the SHA-256 of the
cell: no principal or scope text ever reaches an SQL identifier. Terms are stemmed (FTS5's
``porter`` over ``unicode61``, diacritics removed: :data:`~plugin.memory.fts.TOKENIZER`).

**A durable change log keeps every index exact.** Triggers on ``memories`` append each
insert, delete and change of a row's text or cell to ``memory_index_log`` (with the old text,
which a contentless table needs to delete a row). :func:`index_cell` replays a cell's log into
its table, in order, and clears it. The store's writes replay it in their own transaction; a
row written with plain SQL is replayed before the next search, so the index never answers
with stale text, whoever wrote the row.

**Migration.** Opening a version-1 file (one table-wide index, no stemming) runs
:func:`upgrade`: one ``BEGIN IMMEDIATE`` transaction drops the old index and its triggers,
logs every memory and replays the log into the cells' tables. A crash or an error anywhere
leaves the file at version 1, untouched; the next open starts over.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence

from ...control._sqlite import Row
from ..fts import TOKENIZER
from .values import Arm, Evidence, EvidenceKind

__all__ = [
    "INDEX_LOG",
    "LOGGED_CELLS",
    "MEMORY_COLUMNS",
    "READABLE_VERSIONS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "cell_table",
    "index_cell",
    "index_logged",
    "memory_evidence",
    "plain_evidence",
    "upgrade",
]

SCHEMA_VERSION = 2
#: Versions a store opens: older ones are migrated in place by :func:`upgrade`.
READABLE_VERSIONS = (1, SCHEMA_VERSION)

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


_INDEX_LOG_SQL = "".join(statement + ";\n" for statement in INDEX_LOG)


def cell_table(principal: str, scope: str) -> str:
    """The name of the cell's FTS5 table: derived by hashing, never from the text itself."""
    cell = json.dumps([principal, scope], ensure_ascii=False).encode("utf-8")
    return "memories_fts_" + hashlib.sha256(cell).hexdigest()[:32]


def index_cell(principal: str, scope: str) -> list[tuple[str, tuple[str, ...]]]:
    """The statements that bring the cell's index up to date: create its table if missing,
    replay its logged changes in order, clear them. Each is ``(sql, parameters)``.

    Every statement reads the log inside the caller's transaction, so two connections
    replaying the same cell apply each change once.
    """
    table = cell_table(principal, scope)
    cell = (principal, scope)
    return [
        (
            f'CREATE VIRTUAL TABLE IF NOT EXISTS "{table}" '
            f"USING fts5(text, content = '', tokenize = '{TOKENIZER}')",
            (),
        ),
        (
            # FTS5 reads a NULL in the table-named column as a plain insert.
            f'INSERT INTO "{table}" ("{table}", rowid, text) '
            "SELECT CASE op WHEN 'delete' THEN 'delete' END, seq, text "
            "FROM memory_index_log WHERE principal = ? AND scope = ? ORDER BY change",
            cell,
        ),
        ("DELETE FROM memory_index_log WHERE principal = ? AND scope = ?", cell),
    ]


#: The cells with logged changes not yet in their index.
LOGGED_CELLS = "SELECT DISTINCT principal, scope FROM memory_index_log ORDER BY principal, scope"


def index_logged(conn: sqlite3.Connection) -> int:
    """Replay every logged change into its cell's index, on a raw connection that is inside a
    write transaction; returns how many cells were brought up to date."""
    cells: Sequence[tuple[str, str]] = conn.execute(LOGGED_CELLS).fetchall()
    for principal, scope in cells:
        for sql, params in index_cell(principal, scope):
            conn.execute(sql, params)
    return len(cells)


_FROM_VERSION_1 = (
    "DROP TRIGGER IF EXISTS memories_fts_insert",
    "DROP TRIGGER IF EXISTS memories_fts_delete",
    "DROP TRIGGER IF EXISTS memories_fts_update",
    "DROP TABLE IF EXISTS memories_fts",
    *INDEX_LOG,
    "INSERT INTO memory_index_log (principal, scope, seq, text, op) "
    "SELECT principal, scope, seq, text, 'insert' FROM memories ORDER BY seq",
)


def upgrade(conn: sqlite3.Connection) -> None:
    """Migrate an older store file to :data:`SCHEMA_VERSION` in one transaction (a no-op on a
    current one). Runs on the connection's own thread (``Connection.run``); any error rolls
    the whole migration back and propagates."""
    version = "SELECT value FROM memory_store_meta WHERE key = 'schema_version'"
    if conn.execute(version).fetchall() != [("1",)]:
        return  # nothing to migrate: no write lock taken
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute(version).fetchall() == [("1",)]:  # another process may have won
            for sql in _FROM_VERSION_1:
                conn.execute(sql)
            index_logged(conn)
            conn.execute(
                "UPDATE memory_store_meta SET value = ? WHERE key = 'schema_version'",
                (str(SCHEMA_VERSION),),
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


# Memories get an INTEGER PRIMARY KEY so the cell indexes' rowids survive VACUUM.
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
-- Which cell holds an id: ``remember`` refuses an id another principal or scope holds.
CREATE INDEX IF NOT EXISTS memories_id ON memories (id);
{_INDEX_LOG_SQL}
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
CREATE TRIGGER IF NOT EXISTS memories_generation_delete AFTER DELETE ON memories BEGIN
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
