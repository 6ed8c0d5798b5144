"""The semantic arm's cached matrices: exact, isolated per principal and scope, never stale."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.control.clock import ManualClock
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.store import InvalidMemoryError, MemoryRecord, MemoryStore

ADAPTER = HashingEmbedding(dimensions=16)
ME = {"principal": "u1", "scope": "proj"}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[MemoryStore]:
    async with MemoryStore(
        tmp_path / "memory.db", embedding=ADAPTER, clock=ManualClock(wall=1_000.0)
    ) as store:
        yield store


def q(text: str) -> npt.NDArray[np.float32]:
    return ADAPTER.embed([text])[0]


async def ids(store: MemoryStore, text: str, limit: int = 10, **who: str) -> list[str]:
    found = await store.semantic_candidates(q(text), limit=limit, **(who or ME))
    return [e.id for e in found]


def generation(path: str, principal: str = "u1", scope: str = "proj") -> int:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "SELECT generation FROM vector_generations WHERE principal = ? AND scope = ?",
            (principal, scope),
        ).fetchone()
    finally:
        conn.close()
    return 0 if row is None else int(row[0])


def sql(path: str, statement: str, params: Sequence[object] = ()) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA foreign_keys=ON")  # as the store's own connection has it
        with conn:
            conn.execute(statement, params)
    finally:
        conn.close()


# -- invalidation on every write path -----------------------------------------------------------


@pytest.mark.anyio
async def test_a_new_memory_is_seen_after_the_cache_is_warm(store: MemoryStore) -> None:
    await store.add_memory("a", "database migration", **ME)
    assert await ids(store, "database") == ["a"]  # the matrix is built and cached now
    await store.add_memory("b", "database database", **ME)
    assert await ids(store, "database") == ["b", "a"]
    await store.add_memories(
        [MemoryRecord(id="c", text="database", **ME), MemoryRecord(id="d", text="lunch", **ME)]
    )
    assert await ids(store, "database", limit=3) == ["b", "c", "a"]


@pytest.mark.anyio
async def test_embed_missing_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    async with MemoryStore(path) as plain:
        await plain.add_memory("a", "database", created_at=1.0, **ME)
    async with MemoryStore(path, embedding=ADAPTER) as store:
        await store.add_memory("b", "lunch", created_at=2.0, **ME)
        assert await ids(store, "database") == ["b"]  # "a" has no vector yet; cached
        assert await store.embed_missing() == 1
        assert await ids(store, "database") == ["a", "b"]
    async with MemoryStore(path) as plain:
        await plain.add_memory("c", "database database", created_at=3.0, **ME)
    async with MemoryStore(path, embedding=ADAPTER) as store:
        assert await ids(store, "database") == ["a", "b"]
        assert await store.embed_missing() == 1  # "c" is past every vector: an append
        assert await ids(store, "database") == ["a", "c", "b"]  # a tie, by id


@pytest.mark.anyio
async def test_a_reused_seq_after_a_delete_is_not_mistaken_for_an_append(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    async with MemoryStore(path, embedding=ADAPTER) as store:
        await store.add_memory("a", "database", created_at=1.0, **ME)
        await store.add_memory("b", "database lunch", created_at=2.0, **ME)
        assert await ids(store, "database") == ["a", "b"]
        sql(str(path), "DELETE FROM memories WHERE id = 'b'")  # frees the highest seq
        await store.add_memory("c", "lunch", created_at=3.0, **ME)  # which SQLite reuses
        found = await store.semantic_candidates(q("database"), limit=5, **ME)
        assert [(e.id, round(e.score, 6)) for e in found] == [("a", 1.0), ("c", 0.0)]
        found = await store.semantic_candidates(q("lunch"), limit=5, **ME)
        assert [(e.id, round(e.score, 6)) for e in found] == [("c", 1.0), ("a", 0.0)]


@pytest.mark.anyio
async def test_writes_by_another_connection_are_seen(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    async with MemoryStore(path, embedding=ADAPTER) as reader:
        await reader.add_memory("a", "database", created_at=1.0, **ME)
        assert await ids(reader, "database") == ["a"]
        async with MemoryStore(path, embedding=ADAPTER) as writer:
            await writer.add_memory("b", "database database lunch", created_at=2.0, **ME)
        assert await ids(reader, "database") == ["a", "b"]
        # Changes made outside any store (another tool on the file) are seen too.
        sql(str(path), "DELETE FROM memories WHERE id = 'a'")
        assert await ids(reader, "database") == ["b"]
        sql(str(path), "UPDATE memories SET principal = 'u2' WHERE id = 'b'")
        assert await ids(reader, "database") == []
        assert await ids(reader, "database", principal="u2", scope="proj") == ["b"]
        sql(
            str(path),
            "UPDATE embeddings SET vector = ? WHERE memory_seq = "
            "(SELECT seq FROM memories WHERE id = 'b')",
            (q("lunch").astype("<f4").tobytes(),),
        )
        found = await reader.semantic_candidates(q("lunch"), limit=1, principal="u2", scope="proj")
        assert found[0].score == pytest.approx(1.0)


@pytest.mark.anyio
async def test_only_writes_to_the_cell_move_its_generation(store: MemoryStore) -> None:
    await store.add_memory("a", "database", **ME)
    before = generation(store.path)
    assert before > 0
    # Corrections (and their supersession), sources, beliefs and People hold no vectors.
    await store.add_correction("c1", "old", **ME)
    await store.add_correction("c2", "new", supersedes=["c1"], **ME)
    await store.add_source("s1", "source", **ME)
    await store.add_belief("b1", "Alice", "belief", **ME)
    await store.add_person("Bob", **ME)
    await store.add_memory("x", "database", principal="u2", scope="proj")
    await store.add_memory("y", "database", principal="u1", scope="other")
    assert generation(store.path) == before
    await store.add_memory("b", "lunch", **ME)
    assert generation(store.path) == before + 1


@pytest.mark.anyio
async def test_a_failed_write_leaves_the_cache_right(store: MemoryStore) -> None:
    await store.add_memory("a", "database", **ME)
    assert await ids(store, "database") == ["a"]
    with pytest.raises(ValueError):
        await store.add_memories(
            [MemoryRecord(id="b", text="database", **ME), MemoryRecord(id="a", text="x", **ME)]
        )
    assert await ids(store, "database") == ["a"]


# -- memory bound -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_cache_stays_within_its_budget_and_still_answers(tmp_path: Path) -> None:
    one_cell = 3 * (ADAPTER.dimensions * 4 + 8 + 64)
    async with MemoryStore(
        tmp_path / "m.db", embedding=ADAPTER, vector_cache_bytes=one_cell
    ) as store:
        for principal in ("u1", "u2", "u3"):
            for i in range(3):
                await store.add_memory(
                    f"{principal}-{i}", f"database {i}", principal=principal, scope="proj",
                    created_at=float(i),
                )
        for principal in ("u1", "u2", "u3", "u1"):
            got = await ids(store, "database 2", principal=principal, scope="proj")
            assert got[0] == f"{principal}-2"
            assert store.cached_vector_bytes <= one_cell
    async with MemoryStore(tmp_path / "m.db", embedding=ADAPTER, vector_cache_bytes=0) as bare:
        assert (await ids(bare, "database 1"))[0] == "u1-1"
        assert bare.cached_vector_bytes == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "big"])
def test_a_bad_cache_budget_is_refused(bad: object) -> None:
    with pytest.raises(InvalidMemoryError, match="vector_cache_bytes"):
        MemoryStore(":memory:", vector_cache_bytes=bad)  # type: ignore[arg-type]


# -- properties: isolation and exactness --------------------------------------------------------

WORDS = st.sampled_from(["db", "lunch", "cat", "deploy", "alice", "budget", "trio", "x"])
TEXTS = st.lists(WORDS, min_size=0, max_size=4).map(" ".join)
CELLS = [("u1", "proj"), ("u1", "other"), ("u2", "proj"), ("u2", "other")]
ROWS = st.lists(
    st.tuples(st.sampled_from(CELLS), st.sampled_from(["m1", "m2", "m3", "m4", "m5"]), TEXTS),
    max_size=24,
    unique_by=lambda row: (row[0], row[1]),
)


def exact(rows: list[tuple[tuple[str, str], str, str]], cell: tuple[str, str], query: str,
          limit: int) -> list[tuple[str, float]]:
    """The full-scan oracle: every vector of the cell, by score, ties by id."""
    mine = [(memory_id, text) for c, memory_id, text in rows if c == cell]
    if not mine:
        return []
    scores = ADAPTER.embed([text for _, text in mine]) @ q(query)
    ranked = sorted(zip(mine, scores, strict=True), key=lambda r: (-float(r[1]), r[0][0]))
    return [(memory_id, float(score)) for (memory_id, _), score in ranked[:limit]]


async def check(
    rows: list[tuple[tuple[str, str], str, str]],
    queries: list[tuple[tuple[str, str], str, int]],
    budget: int,
) -> None:
    async with MemoryStore(":memory:", embedding=ADAPTER, vector_cache_bytes=budget) as store:
        half = len(rows) // 2
        # Half the rows before the first queries, half between them: the cache must follow.
        for seen, batch in ((rows[:half], rows[:half]), (rows, rows[half:])):
            await store.add_memories(
                MemoryRecord(id=i, text=t, principal=p, scope=s, created_at=1.0)
                for (p, s), i, t in batch
            )
            for (principal, scope), text, limit in queries:
                found = await store.semantic_candidates(
                    q(text), principal=principal, scope=scope, limit=limit
                )
                assert all(e.principal == principal and e.scope == scope for e in found)
                own = {i for c, i, _ in rows if c == (principal, scope)}
                assert {e.id for e in found} <= own
                want = exact(seen, (principal, scope), text, limit)
                assert [e.id for e in found] == [i for i, _ in want]
                assert [e.score for e in found] == pytest.approx([s for _, s in want], abs=1e-6)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=40, deadline=None)
@given(
    rows=ROWS,
    queries=st.lists(
        st.tuples(st.sampled_from(CELLS), TEXTS, st.integers(1, 6)), min_size=1, max_size=4
    ),
    budget=st.sampled_from([0, 10**9]),
)
def test_results_are_the_cells_own_and_equal_a_full_scan(
    backend: str,
    rows: list[tuple[tuple[str, str], str, str]],
    queries: list[tuple[tuple[str, str], str, int]],
    budget: int,
) -> None:
    anyio.run(check, rows, queries, budget, backend=backend)


def test_appending_never_changes_what_an_older_matrix_sees() -> None:
    from plugin.memory.store.vectors import Matrix

    def rows(*values: float) -> npt.NDArray[np.float32]:
        return np.array([[v, 0.0] for v in values], dtype=np.float32)

    first = Matrix.of(np.array([0], dtype=np.int64), ["z"], rows(0.0), generation=0, resets=0)
    # Grown once: it has spare capacity now, so the next append goes in place.
    base = first.extended(np.array([1], dtype=np.int64), ["a"], rows(0.1), generation=1, resets=0)
    newer = base.extended(np.array([2], dtype=np.int64), ["b"], rows(0.9), generation=2, resets=0)
    # A second append from the older matrix (a racing query) must not clobber "b".
    other = base.extended(np.array([3], dtype=np.int64), ["c"], rows(0.5), generation=2, resets=0)
    query = np.array([1.0, 0.0], dtype=np.float32)
    assert [(base.ids[i], s) for i, s in base.top(query, 5)] == [
        ("a", pytest.approx(0.1)), ("z", 0.0)
    ]
    assert [(newer.ids[i], s) for i, s in newer.top(query, 5)] == [
        ("b", pytest.approx(0.9)), ("a", pytest.approx(0.1)), ("z", 0.0)
    ]
    assert [(other.ids[i], s) for i, s in other.top(query, 5)] == [
        ("c", pytest.approx(0.5)), ("a", pytest.approx(0.1)), ("z", 0.0)
    ]
    assert newer.seqs.tolist() == [0, 1, 2] and other.seqs.tolist() == [0, 1, 3]


@pytest.mark.anyio
async def test_large_cells_are_decoded_and_scored_off_the_loop_with_the_same_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from plugin.memory.store import vectors

    monkeypatch.setattr(vectors, "_OFF_LOOP_FLOATS", 0)  # every cell counts as large
    words = ["db", "lunch", "cat", "deploy", "alice"]
    rows = [
        ((p, "proj"), f"m{i}", " ".join(words[(i * k) % 5] for k in (1, 2, 3)))
        for p in ("u1", "u2")
        for i in range(12)
    ]
    queries = [(("u1", "proj"), "db cat", 5), (("u2", "proj"), "lunch", 3)]
    await check(rows, queries, 10**9)
