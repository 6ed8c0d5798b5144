"""A memory store file as schema version 1 wrote it: one table-wide FTS5 index, no stemming.

The schema below is a verbatim copy of the version-1 store schema (its version number filled
in), kept frozen here so migration tests open exactly what that code left on disk.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

V1_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS memory_store_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT OR IGNORE INTO memory_store_meta (key, value) VALUES ('schema_version', '1');
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


def write_v1_store(path: Path, memories: list[tuple[str, str, str, str, float]]) -> None:
    """A version-1 store at ``path`` holding ``(principal, scope, id, text, created_at)`` rows."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(V1_SCHEMA)
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO memories (principal, scope, id, text, created_at) VALUES (?, ?, ?, ?, ?)",
            memories,
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def v1_sparse(path: Path, expression: str, principal: str, scope: str) -> list[str]:
    """The version-1 sparse query, verbatim, over a version-1 file."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT m.id FROM memories_fts JOIN memories AS m ON m.seq = memories_fts.rowid "
            "WHERE memories_fts MATCH ? AND m.principal = ? AND m.scope = ? "
            "ORDER BY memories_fts.rank, m.seq",
            (expression, principal, scope),
        ).fetchall()
    finally:
        conn.close()
    return [row[0] for row in rows]
