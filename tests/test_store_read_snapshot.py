"""A search reads the store as of one moment: another process committing a write while a
sparse search is between its statements changes neither whether it answers nor what it sees."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from plugin.memory.store import MemoryStore, sparse_index
from plugin.memory.store.sparse_index import index_logged

pytestmark = pytest.mark.anyio

ME = {"principal": "u1", "scope": "proj"}


def remember_elsewhere(path: Path, memories: Sequence[tuple[str, str]]) -> None:
    """What another process's ``remember`` commits: the rows and the term index, together."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO memories (principal, scope, id, text, created_at) "
            "VALUES ('u1', 'proj', ?, ?, 2.0)",
            memories,
        )
        index_logged(conn)
        conn.execute("COMMIT")
    finally:
        conn.close()


@pytest.fixture
def write_midway(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> list[Sequence[tuple[str, str]]]:
    """Batches another process commits, one each time a search tokenizes its query: after the
    search read its cell's statistics and before it reads its terms'."""
    pending: list[Sequence[tuple[str, str]]] = []
    tokenize = sparse_index.tokenize

    def racing(conn: sqlite3.Connection, texts: Sequence[str]) -> list[Counter[str]]:
        if pending:
            remember_elsewhere(tmp_path / "memory.db", pending.pop(0))
        return tokenize(conn, texts)

    monkeypatch.setattr(sparse_index, "tokenize", racing)
    return pending


async def test_a_sparse_search_raced_by_another_processs_writes_answers_from_one_moment(
    tmp_path: Path, write_midway: list[Sequence[tuple[str, str]]]
) -> None:
    async with MemoryStore(tmp_path / "memory.db") as store:
        await store.remember("alpha release notes", id="first", **ME)
        write_midway.append([(f"more{i}", f"alpha note {i}") for i in range(3)])
        # Read apart, the cell held one memory but "alpha" was in four: a negative idf's log.
        found = await store.sparse_candidates("alpha", limit=10, **ME)
        assert not write_midway  # the other process did commit in the middle of the search
        assert [e.id for e in found] == ["first"]
        after = await store.sparse_candidates("alpha", limit=10, **ME)
        assert sorted(e.id for e in after) == ["first", "more0", "more1", "more2"]
