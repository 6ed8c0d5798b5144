"""A memory store file as schema version 2 wrote it: one contentless FTS5 table per
(principal, scope) cell, named by a hash of the cell, filled from a change log.

The schema below is a verbatim copy of the version-2 store schema, kept frozen here so
migration tests open exactly what that code left on disk.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

V2_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS memory_store_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT OR IGNORE INTO memory_store_meta (key, value) VALUES ('schema_version', '2');
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
CREATE TABLE IF NOT EXISTS memory_index_log (
    change INTEGER PRIMARY KEY,
    principal TEXT NOT NULL,
    scope TEXT NOT NULL,
    seq INTEGER NOT NULL,
    text TEXT NOT NULL,
    op TEXT NOT NULL CHECK (op IN ('insert', 'delete'))
);
CREATE INDEX IF NOT EXISTS memory_index_log_cell ON memory_index_log (principal, scope, change);
CREATE TRIGGER IF NOT EXISTS memories_index_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memory_index_log (principal, scope, seq, text, op)
        VALUES (new.principal, new.scope, new.seq, new.text, 'insert');
END;
CREATE TRIGGER IF NOT EXISTS memories_index_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memory_index_log (principal, scope, seq, text, op)
        VALUES (old.principal, old.scope, old.seq, old.text, 'delete');
END;
CREATE TRIGGER IF NOT EXISTS memories_index_update
    AFTER UPDATE OF seq, principal, scope, text ON memories BEGIN
    INSERT INTO memory_index_log (principal, scope, seq, text, op)
        VALUES (old.principal, old.scope, old.seq, old.text, 'delete'),
               (new.principal, new.scope, new.seq, new.text, 'insert');
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

TOKENIZER = "porter unicode61 remove_diacritics 2"


def v2_cell_table(principal: str, scope: str) -> str:
    cell = json.dumps([principal, scope], ensure_ascii=False).encode("utf-8")
    return "memories_fts_" + hashlib.sha256(cell).hexdigest()[:32]


def _index_cells(conn: sqlite3.Connection) -> None:
    cells = conn.execute(
        "SELECT DISTINCT principal, scope FROM memory_index_log ORDER BY principal, scope"
    ).fetchall()
    for principal, scope in cells:
        table = v2_cell_table(principal, scope)
        conn.execute(
            f'CREATE VIRTUAL TABLE IF NOT EXISTS "{table}" '
            f"USING fts5(text, content = '', tokenize = '{TOKENIZER}')"
        )
        conn.execute(
            f'INSERT INTO "{table}" ("{table}", rowid, text) '
            "SELECT CASE op WHEN 'delete' THEN 'delete' END, seq, text "
            "FROM memory_index_log WHERE principal = ? AND scope = ? ORDER BY change",
            (principal, scope),
        )
        conn.execute(
            "DELETE FROM memory_index_log WHERE principal = ? AND scope = ?", (principal, scope)
        )


def write_v2_store(
    path: Path, rows: list[tuple[str, str, str, str, float]], *, unindexed: int = 0
) -> None:
    """A version-2 store holding ``(principal, scope, id, text, created_at)`` rows, every cell
    indexed but the last ``unindexed`` rows (left in the change log, as plain SQL leaves them)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(V2_SCHEMA)
        conn.execute("BEGIN IMMEDIATE")
        split = len(rows) - unindexed
        conn.executemany(
            "INSERT INTO memories (principal, scope, id, text, created_at) VALUES (?, ?, ?, ?, ?)",
            rows[:split],
        )
        _index_cells(conn)
        conn.executemany(
            "INSERT INTO memories (principal, scope, id, text, created_at) VALUES (?, ?, ?, ?, ?)",
            rows[split:],
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def v2_sparse(path: Path, expression: str, principal: str, scope: str) -> list[tuple[str, float]]:
    """The version-2 sparse query on the cell's own table: ``(id, rank)``, best first."""
    table = v2_cell_table(principal, scope)
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            f"SELECT m.id, f.rank FROM (SELECT rowid, rank FROM \"{table}\" "
            f"WHERE \"{table}\" MATCH ? ORDER BY rank, rowid) AS f "
            "JOIN memories AS m ON m.seq = f.rowid ORDER BY f.rank, f.rowid",
            (expression,),
        ).fetchall()
    finally:
        conn.close()
