"""What the store's file holds: the schema, its version, and how a row becomes evidence."""

from __future__ import annotations

import json

from ...control._sqlite import Row
from .values import Arm, Evidence, EvidenceKind

__all__ = ["MEMORY_COLUMNS", "SCHEMA", "SCHEMA_VERSION", "memory_evidence", "plain_evidence"]

SCHEMA_VERSION = 1

# Memories get an INTEGER PRIMARY KEY so the external-content FTS table's rowids survive VACUUM.
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
