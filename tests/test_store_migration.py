"""Opening a version-1 or version-2 store file migrates it in place, in one transaction, on
both loops; an error or a killed process mid-migration leaves the old file as it was."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from plugin.errors import MemoryStoreError
from plugin.memory.fts import fts5_match_expression
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.store import SCHEMA_VERSION, MemoryRecord, MemoryStore, sparse_index

from ._store_v1 import v1_sparse, write_v1_store
from ._store_v2 import v2_cell_table, v2_sparse, write_v2_store

pytestmark = pytest.mark.anyio

CELLS = [("u1", "proj"), ("u2", "proj"), ("u1", "other"), ('q"; DROP TABLE memories; --', "p")]
ROWS = [
    (principal, scope, f"m{i}", text, float(i))
    for i, (principal, scope, text) in enumerate(
        (p, s, text)
        for p, s in CELLS
        for text in (
            "invoice for the release budget",
            "release notes and the budget review",
            "the database migration plan",
            f"a memory only {p} {s} holds",
            "release release release",
        )
    )
]
U1 = {"principal": "u1", "scope": "proj"}
QUERIES = ["release budget", "invoice", "database migration", "holds memory", "DROP TABLE"]


def meta(path: Path) -> tuple[list[tuple[str, str]], set[str]]:
    conn = sqlite3.connect(path)
    try:
        version = conn.execute(  # the sweep's once-per-file mark is no version
            "SELECT key, value FROM memory_store_meta WHERE key != 'orphan_vectors_swept'"
        ).fetchall()
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()
    return version, names


async def test_a_version_1_file_opens_migrated_and_ranks_like_a_new_store(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    write_v1_store(old, ROWS)
    assert v1_sparse(old, '"release"', "u1", "proj")  # the old layout answers before
    async with MemoryStore(old, embedding=HashingEmbedding()) as store:
        async with MemoryStore(tmp_path / "new.db") as fresh:
            await fresh.add_memories(
                MemoryRecord(id=i, text=t, principal=p, scope=s, created_at=c)
                for p, s, i, t, c in ROWS
            )
            for principal, scope in CELLS:
                for query in QUERIES:
                    got = await store.sparse_candidates(
                        query, principal=principal, scope=scope, limit=20
                    )
                    want = await fresh.sparse_candidates(
                        query, principal=principal, scope=scope, limit=20
                    )
                    assert [(e.id, e.text, e.score) for e in got] == [
                        (e.id, e.text, e.score) for e in want
                    ]
                    assert {e.id for e in got} <= {
                        i for p, s, i, _, _ in ROWS if (p, s) == (principal, scope)
                    }
        # Stemming reaches the migrated rows; the store keeps working for writes and vectors.
        found = await store.sparse_candidates("invoices", principal="u2", scope="proj", limit=5)
        assert [e.id for e in found] == ["m5"]
        assert await store.embed_missing() == len(ROWS)
        await store.add_memory(
            "new", "fresh invoices", principal="u2", scope="proj", created_at=99.0
        )
        found = await store.sparse_candidates("invoice", principal="u2", scope="proj", limit=5)
        assert [e.id for e in found] == ["new", "m5"]  # the shorter text first
    version, names = meta(old)
    assert version == [("schema_version", str(SCHEMA_VERSION))]
    assert "memories_fts" not in names
    assert not {"memories_fts_insert", "memories_fts_delete", "memories_fts_update"} & names
    # Opening again is a no-op: same answers.
    async with MemoryStore(old) as store:
        found = await store.sparse_candidates("invoices", principal="u2", scope="proj", limit=5)
        assert [e.id for e in found] == ["new", "m5"]


async def test_a_failed_migration_leaves_the_version_1_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    write_v1_store(path, ROWS)
    before = meta(path)
    expression = fts5_match_expression("release budget")
    assert expression is not None
    answers = {cell: v1_sparse(path, expression, *cell) for cell in CELLS}
    real = sparse_index.cell_of
    built: list[str] = []

    def failing(conn: sqlite3.Connection, principal: str, scope: str) -> int:
        built.append(principal)
        if len(built) == 3:  # two cells indexed, then the process "dies"
            raise sqlite3.OperationalError("disk I/O error (injected)")
        return real(conn, principal, scope)

    monkeypatch.setattr(sparse_index, "cell_of", failing)
    with pytest.raises(MemoryStoreError, match="injected"):
        async with MemoryStore(path):
            pytest.fail("a failed migration must not open")
    assert len(built) == 3
    assert meta(path) == before  # version 1, old index and triggers, no cell table
    assert {cell: v1_sparse(path, expression, *cell) for cell in CELLS} == answers
    monkeypatch.setattr(sparse_index, "cell_of", real)
    async with MemoryStore(path) as store:  # the next open migrates
        found = await store.sparse_candidates("release budget", limit=9, **U1)
        assert {e.id for e in found} == {"m0", "m1", "m4"}
    assert meta(path)[0] == [("schema_version", str(SCHEMA_VERSION))]


async def test_two_stores_opening_one_version_1_file_migrate_it_once(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_v1_store(path, ROWS)
    async with MemoryStore(path) as first, MemoryStore(path) as second:
        for store in (first, second):
            found = await store.sparse_candidates("invoice", principal="u1", scope="proj", limit=9)
            assert [e.id for e in found] == ["m0"]
    conn = sqlite3.connect(path)
    try:
        # Every memory indexed exactly once: the cell's document count is its row count.
        for principal, scope in CELLS:
            count = conn.execute(
                "SELECT docs FROM memory_cells WHERE principal = ? AND scope = ?",
                (principal, scope),
            ).fetchone()
            assert count == (5,)
    finally:
        conn.close()


# Opens the store at argv[1]; on the first cell it indexes, reports and stalls inside the
# migration's transaction until the parent kills it.
STALLING_CHILD = """
import sys, time, anyio
from plugin.memory.store import MemoryStore, sparse_index
real = sparse_index.cell_of
def stall(conn, principal, scope):
    print("indexing", flush=True)
    time.sleep(120)
    return real(conn, principal, scope)
sparse_index.cell_of = stall
async def main():
    async with MemoryStore(sys.argv[1]):
        pass
anyio.run(main)
"""


@pytest.mark.slow
def test_a_process_killed_mid_migration_leaves_the_version_1_file_as_it_was(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    write_v1_store(path, ROWS)
    before = meta(path)
    expression = fts5_match_expression("release budget")
    assert expression is not None
    answers = {cell: v1_sparse(path, expression, *cell) for cell in CELLS}
    child = subprocess.Popen(
        [sys.executable, "-c", STALLING_CHILD, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "indexing\n", child.stderr
        child.send_signal(signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    assert meta(path) == before
    assert {cell: v1_sparse(path, expression, *cell) for cell in CELLS} == answers

    async def reopen() -> list[str]:
        async with MemoryStore(path) as store:
            found = await store.sparse_candidates("release budget", limit=9, **U1)
        return [e.id for e in found]

    assert set(anyio.run(reopen)) == {"m0", "m1", "m4"}
    assert meta(path)[0] == [("schema_version", str(SCHEMA_VERSION))]


# -- version 2: one FTS5 table per cell -------------------------------------------------------


def v2_answers(path: Path) -> dict[tuple[str, str, str], list[tuple[str, float]]]:
    found = {}
    for principal, scope in CELLS:
        for query in QUERIES:
            expression = fts5_match_expression(query)
            assert expression is not None
            found[principal, scope, query] = v2_sparse(path, expression, principal, scope)
    return found


async def test_a_version_2_file_migrates_and_ranks_as_its_cell_tables_did(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    # The last two rows were written with plain SQL: still in the change log.
    write_v2_store(path, ROWS, unindexed=2)
    want = v2_answers(path)
    version, names = meta(path)
    assert version == [("schema_version", "2")]
    assert v2_cell_table("u1", "proj") in names
    async with MemoryStore(path) as store:
        for (principal, scope, query), old in want.items():
            got = await store.sparse_candidates(query, principal=principal, scope=scope, limit=20)
            if (principal, scope) != CELLS[-1]:  # the cell whose last rows were never indexed
                assert [e.id for e in got] == [i for i, _ in old]
                assert [e.score for e in got] == pytest.approx([-rank for _, rank in old])
        last = CELLS[-1]
        found = await store.sparse_candidates("release", principal=last[0], scope=last[1], limit=9)
        assert [e.id for e in found] == ["m19", "m15", "m16"]  # the unindexed rows included
    version, names = meta(path)
    assert version == [("schema_version", str(SCHEMA_VERSION))]
    assert not [name for name in names if name.startswith("memories_fts")]


async def test_a_failed_version_2_migration_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "v2.db"
    write_v2_store(path, ROWS)
    before, answers = meta(path), v2_answers(path)
    real = sparse_index.cell_of
    calls: list[str] = []

    def failing(conn: sqlite3.Connection, principal: str, scope: str) -> int:
        calls.append(principal)
        if len(calls) == 3:  # cell tables dropped, two cells indexed, then the "crash"
            raise sqlite3.OperationalError("disk I/O error (injected)")
        return real(conn, principal, scope)

    monkeypatch.setattr(sparse_index, "cell_of", failing)
    with pytest.raises(MemoryStoreError, match="injected"):
        async with MemoryStore(path):
            pytest.fail("a failed migration must not open")
    assert meta(path) == before
    assert v2_answers(path) == answers
    monkeypatch.setattr(sparse_index, "cell_of", real)
    async with MemoryStore(path) as store:
        found = await store.sparse_candidates("release budget", limit=9, **U1)
        assert {e.id for e in found} == {"m0", "m1", "m4"}
    assert meta(path)[0] == [("schema_version", str(SCHEMA_VERSION))]


@pytest.mark.slow
def test_a_process_killed_mid_migration_leaves_the_version_2_file_as_it_was(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v2.db"
    write_v2_store(path, ROWS)
    before, answers = meta(path), v2_answers(path)
    child = subprocess.Popen(
        [sys.executable, "-c", STALLING_CHILD, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "indexing\n", child.stderr
        child.send_signal(signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    assert meta(path) == before  # the cell tables and version 2 are all still there
    assert v2_answers(path) == answers

    async def reopen() -> list[str]:
        async with MemoryStore(path) as store:
            found = await store.sparse_candidates("release budget", limit=9, **U1)
        return [e.id for e in found]

    assert set(anyio.run(reopen)) == {"m0", "m1", "m4"}
    assert meta(path)[0] == [("schema_version", str(SCHEMA_VERSION))]
