"""The reference memory store on both loops: safe sparse arm, semantic arm, isolation, errors."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any, TypedDict

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from plugin.control.clock import ManualClock
from plugin.errors import MemoryStoreError
from plugin.memory.fts import fts5_match_expression
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.store import (
    Evidence,
    InvalidMemoryError,
    MemoryConflictError,
    MemoryRecord,
    MemoryStore,
    MemoryStoreClosedError,
    MemoryStoreCorruptError,
    MemoryStoreLockedError,
    MemoryStorePathError,
    MemoryWrite,
    Person,
)

from ._hostile import HOSTILE_TEXT

pytestmark = pytest.mark.anyio


class Who(TypedDict):
    principal: str
    scope: str


ME: Who = {"principal": "u1", "scope": "proj"}
HUGE = "needle " + "x" * 1_000_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall=1_000.0)


@pytest.fixture
async def store(tmp_path: Path, clock: ManualClock) -> AsyncIterator[MemoryStore]:
    async with MemoryStore(
        tmp_path / "memory.db", embedding=HashingEmbedding(), clock=clock
    ) as store:
        yield store


async def seed(store: MemoryStore) -> None:
    """The same ids in four principal/scope cells, each with its own marker word."""
    for principal in ("u1", "u2"):
        for scope in ("proj", "other"):
            cell = f"{principal}{scope}"
            who: Who = {"principal": principal, "scope": scope}
            await store.add_memories(
                [
                    MemoryRecord(
                        id="m1",
                        text=f"deployment pipeline notes {cell} marker",
                        created_at=10.0,
                        cites=("s1",),
                        **who,
                    ),
                    MemoryRecord(
                        id=f"only-{cell}", text=f"secret {cell} body", created_at=20.0, **who
                    ),
                ]
            )
            await store.add_source("s1", f"source text {cell}", created_at=5.0, **who)
            await store.add_belief("b1", f"Person{cell}", f"belief {cell}", created_at=7.0, **who)
            await store.add_belief("b2", "Alice", f"Alice thinks {cell}", created_at=8.0, **who)
            await store.add_correction("c1", f"correction {cell}", created_at=9.0, **who)


def mine(items: list[Evidence]) -> bool:
    return all(e.principal == "u1" and e.scope == "proj" for e in items) and all(
        "u1proj" in e.text for e in items
    )


# -- opening and errors -------------------------------------------------------------------------


async def test_open_uses_wal_and_persists(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    async with MemoryStore(path) as store:
        await store.add_memory("m1", "hello world", created_at=1.0, **ME)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        conn.close()
    async with MemoryStore(path) as store:
        found = await store.sparse_candidates("hello", limit=5, **ME)
    assert [e.id for e in found] == ["m1"]


async def test_in_memory_store() -> None:
    async with MemoryStore(":memory:") as store:
        await store.add_memory("m1", "in memory", created_at=1.0, **ME)
        assert [e.id for e in await store.recent_candidates(limit=3, **ME)] == ["m1"]


async def test_missing_folder_is_a_path_error(tmp_path: Path) -> None:
    with pytest.raises(MemoryStorePathError) as info:
        async with MemoryStore(tmp_path / "no" / "such" / "m.db"):
            pass
    assert isinstance(info.value, MemoryStoreError)
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(MemoryStorePathError):
        async with MemoryStore(tmp_path):
            pass


async def test_random_bytes_are_a_corrupt_error(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    path.write_bytes(np.random.default_rng(0).bytes(8192))
    with pytest.raises(MemoryStoreCorruptError):
        async with MemoryStore(path):
            pass


async def test_foreign_database_is_a_corrupt_error(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE memory_store_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO memory_store_meta VALUES ('schema_version', '999')")
    conn.commit()
    conn.close()
    with pytest.raises(MemoryStoreCorruptError, match="schema version"):
        async with MemoryStore(path):
            pass


async def test_a_foreign_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "theirs.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes (body) VALUES ('keep me')")
    conn.commit()
    conn.close()
    with pytest.raises(MemoryStoreCorruptError, match="no store metadata"):
        async with MemoryStore(path):
            pytest.fail("a foreign database must not open")
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT body FROM notes").fetchall() == [("keep me",)]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        assert tables == [("notes",)]
    finally:
        conn.close()


async def test_locked_file_is_a_locked_error(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    async with MemoryStore(path, timeout=0.05) as store:
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(MemoryStoreLockedError):
                await store.add_memory("m1", "text", created_at=1.0, **ME)
            other.execute("ROLLBACK")
        finally:
            other.close()
        # The failed write left no transaction behind: the next one works.
        await store.add_memory("m1", "text", created_at=1.0, **ME)


async def test_a_store_opens_and_reads_while_another_connection_writes(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    async with MemoryStore(path) as store:
        await store.add_memory("m1", "committed", created_at=1.0, **ME)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # a long write (an import) holds the write lock
        other.execute(
            "INSERT INTO memories (principal, scope, id, text, created_at) "
            "VALUES ('u1', 'proj', 'm2', 'not committed yet', 2.0)"
        )
        async with MemoryStore(path, timeout=0.05) as reader:
            assert [e.id for e in await reader.recent_candidates(limit=5, **ME)] == ["m1"]
            with pytest.raises(MemoryStoreLockedError):  # a write still waits its turn
                await reader.add_memory("m3", "text", created_at=3.0, **ME)
        other.execute("COMMIT")
    finally:
        other.close()
    async with MemoryStore(path) as reader:
        assert [e.id for e in await reader.recent_candidates(limit=5, **ME)] == ["m2", "m1"]


async def test_an_incomplete_store_file_is_completed_on_open(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    async with MemoryStore(path) as store:
        await store.add_memory("m1", "text", created_at=1.0, **ME)
    conn = sqlite3.connect(path)
    try:
        conn.execute("DROP TRIGGER memories_vectors_delete")
        conn.execute("DROP INDEX memories_id")
        conn.execute("DELETE FROM memory_store_meta WHERE key = 'orphan_vectors_swept'")
        conn.commit()
    finally:
        conn.close()
    async with MemoryStore(path) as store:
        assert [e.id for e in await store.recent_candidates(limit=5, **ME)] == ["m1"]
    conn = sqlite3.connect(path)
    try:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        swept = conn.execute(
            "SELECT value FROM memory_store_meta WHERE key = 'orphan_vectors_swept'"
        ).fetchall()
    finally:
        conn.close()
    assert {"memories_vectors_delete", "memories_id"} <= names and swept == [('1',)]


OPENING_CHILD = """
import os, sys, time, anyio
from plugin.memory.store import MemoryStore
path, go = sys.argv[1], sys.argv[2]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
async def main():
    async with MemoryStore(path, timeout=30.0) as store:
        await store.remember("text", principal=str(os.getpid()), scope="s")
anyio.run(main)
"""


def test_processes_creating_one_new_store_at_once_all_open_it(tmp_path: Path) -> None:
    path, go = tmp_path / "m.db", tmp_path / "go"
    children = [
        subprocess.Popen([sys.executable, "-c", OPENING_CHILD, str(path), str(go)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n", child.stderr
        go.touch()  # all at once: each finds no file, or one another is creating
        for child in children:
            _, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT count(*) FROM memories").fetchone() == (4,)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()


async def test_closed_store_raises(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.db")
    with pytest.raises(MemoryStoreClosedError):
        await store.recent_candidates(limit=1, **ME)
    async with store:
        pass
    with pytest.raises(MemoryStoreClosedError):
        await store.add_memory("m1", "x", created_at=1.0, **ME)
    await store.aclose()  # idempotent


async def test_duplicate_id_is_a_conflict_and_the_batch_is_atomic(store: MemoryStore) -> None:
    await store.add_memory("m1", "first", **ME)
    with pytest.raises(MemoryConflictError):
        await store.add_memories(
            [MemoryRecord(id="m2", text="second", **ME), MemoryRecord(id="m1", text="dup", **ME)]
        )
    assert [e.id for e in await store.recent_candidates(limit=10, **ME)] == ["m1"]
    # The same id under another principal or scope is a different memory.
    await store.add_memory("m1", "theirs", principal="u2", scope="proj")
    await store.add_memory("m1", "elsewhere", principal="u1", scope="other")


async def test_invalid_writes_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(InvalidMemoryError, match="principal"):
        MemoryRecord(id="m1", text="x", principal="", scope="s")
    with pytest.raises(InvalidMemoryError, match="id"):
        MemoryRecord(id="a\ud800", text="x", principal="p", scope="s")
    with pytest.raises(InvalidMemoryError, match="created_at"):
        MemoryRecord(id="m", text="x", principal="p", scope="s", created_at=float("nan"))
    with pytest.raises(InvalidMemoryError, match="cites"):
        MemoryRecord(id="m", text="x", principal="p", scope="s", cites="s1")
    async with MemoryStore(tmp_path / "m.db") as store:  # no clock: the system clock stamps
        await store.add_memory("m1", "x", **ME)
        [stored] = await store.recent_candidates(limit=1, **ME)
        assert stored.created_at > 1.7e9
        with pytest.raises(InvalidMemoryError, match="scope"):
            await store.add_source("s1", "x", principal="u1", scope=" ", created_at=1.0)
        with pytest.raises(ValueError, match="limit"):
            await store.recent_candidates(limit=-1, **ME)
        assert await store.add_memories([]) == 0


async def test_a_limit_past_what_sqlite_counts_is_refused(store: MemoryStore) -> None:
    await seed(store)
    vector = HashingEmbedding().embed(["deployment"])[0]
    reads = {
        "recent": partial(store.recent_candidates, **ME),
        "sparse": partial(store.sparse_candidates, "deployment", **ME),
        "semantic": partial(store.semantic_candidates, vector, **ME),
        "beliefs": partial(store.beliefs_of, "ana", **ME),
        "corrections": partial(store.current_corrections, **ME),
    }
    for name, read in reads.items():
        with pytest.raises(ValueError, match="limit"):
            await read(limit=2**63)
        largest = await read(limit=2**63 - 1)  # the largest SQLite counts: everything
        assert largest == await read(limit=100), name


# -- the sparse arm -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", HOSTILE_TEXT, ids=range(len(HOSTILE_TEXT)))
async def test_hostile_text_never_raises(store: MemoryStore, text: str) -> None:
    await seed(store)
    found = await store.sparse_candidates(text, limit=10, **ME)
    assert mine(found)
    assert mine(await store.beliefs_of(text, limit=10, **ME))
    assert await store.read_source(text, **ME) is None
    assert mine(await store.get_memories([text, "m1"], **ME))
    people = await store.discover_people(text, **ME)
    assert all(p.principal == "u1" and p.scope == "proj" for p in people)
    # Nothing was dropped or changed: every cell still has its memories.
    for principal in ("u1", "u2"):
        for scope in ("proj", "other"):
            recent = await store.recent_candidates(principal=principal, scope=scope, limit=10)
            assert len(recent) == 2


async def test_syntax_is_matched_as_plain_terms(store: MemoryStore) -> None:
    await store.add_memory("body", "the body of the report", created_at=1.0, **ME)
    await store.add_memory("xylo", "a xylophone solo", created_at=2.0, **ME)
    await store.add_memory("near", "we are near the end", created_at=3.0, **ME)
    await store.add_memory("caret", "the x axis", created_at=4.0, **ME)

    async def ids(text: str) -> set[str]:
        return {e.id for e in await store.sparse_candidates(text, limit=10, **ME)}

    assert await ids("body: zzz") == {"body"}  # a word, not a column filter
    assert await ids("x*") == {"caret"}  # not a prefix query: no xylophone
    assert await ids("^x") == {"caret"}
    assert await ids("NEAR(qq zz)") == {"near"}
    assert await ids("xylophone AND zzz") == {"xylo"}  # AND is a word, the terms are ORed
    assert await ids("?!") == set()
    assert fts5_match_expression("?!") is None


async def test_sparse_ranks_by_bm25_with_deterministic_ties(store: MemoryStore) -> None:
    await store.add_memory("weak", "release notes and many other words here", **ME)
    await store.add_memory("strong", "release release release", **ME)
    for name in ("t3", "t1", "t2"):
        await store.add_memory(name, "identical tie text", **ME)
    found = await store.sparse_candidates("release", limit=10, **ME)
    assert [e.id for e in found] == ["strong", "weak"]
    assert found[0].score > found[1].score
    assert all(e.arm == "sparse" and e.kind == "memory" for e in found)
    for _ in range(3):  # equal bm25: insertion order, every time
        ties = await store.sparse_candidates("identical tie", limit=10, **ME)
        assert [e.id for e in ties] == ["t3", "t1", "t2"]
    assert len(await store.sparse_candidates("identical", limit=2, **ME)) == 2
    assert await store.sparse_candidates("identical", limit=0, **ME) == []


async def test_text_with_nul_and_surrogates_is_stored_safely(store: MemoryStore) -> None:
    await store.add_memory("nul", "before\x00after", **ME)
    await store.add_memory("sur", "lone\ud800 surrogate", **ME)
    assert [e.id for e in await store.sparse_candidates("after", limit=5, **ME)] == ["nul"]
    (found,) = await store.sparse_candidates("surrogate", limit=5, **ME)
    assert found.text == "lone\ufffd surrogate"


# -- isolation ----------------------------------------------------------------------------------


async def test_no_read_crosses_principal_or_scope(store: MemoryStore) -> None:
    await seed(store)
    other_texts = [
        "deployment pipeline notes u2proj marker",
        "secret u2proj body secret u1other body u2other",
        "u2 other proj principal scope",
        "Personu2proj Personu1other Personu2other Alice",
    ]
    for text in other_texts:
        sparse = await store.sparse_candidates(text, limit=50, **ME)
        assert mine(sparse)
        vector = HashingEmbedding().embed([text])[0]
        assert mine(await store.semantic_candidates(vector, limit=50, **ME))
        people = await store.discover_people(text, **ME)
        assert people in ([], [Person(name="Alice", **ME)])
    # The other cells' exact text finds only the caller's own memory with the same id.
    found = await store.sparse_candidates("deployment pipeline notes u2proj marker", limit=50, **ME)
    assert [(e.id, e.text) for e in found] == [("m1", "deployment pipeline notes u1proj marker")]
    assert mine(await store.recent_candidates(limit=50, **ME))
    assert mine(await store.beliefs_of("Alice", limit=50, **ME))
    assert await store.beliefs_of("Personu2proj", limit=50, **ME) == []
    assert await store.discover_people("ask Personu2proj and Personu1other", **ME) == []
    corrections = await store.current_corrections(**ME)
    assert [e.text for e in corrections] == ["correction u1proj"]
    source = await store.read_source("s1", **ME)
    assert source is not None
    assert source.text == "source text u1proj"
    # Unknown or unencodable principals see nothing at all.
    for principal, scope in (("u3", "proj"), ("u1", "nope"), ("u1\ud800", "proj"), ("", "")):
        assert await store.recent_candidates(principal=principal, scope=scope, limit=9) == []
        assert await store.read_source("s1", principal=principal, scope=scope) is None
        assert await store.current_corrections(principal=principal, scope=scope) == []


async def test_every_cell_sees_exactly_its_own_rows(store: MemoryStore) -> None:
    await seed(store)
    for principal in ("u1", "u2"):
        for scope in ("proj", "other"):
            cell = f"{principal}{scope}"
            who: Who = {"principal": principal, "scope": scope}
            found = await store.sparse_candidates("secret body marker", limit=50, **who)
            assert {(e.id, e.text) for e in found} == {
                ("m1", f"deployment pipeline notes {cell} marker"),
                (f"only-{cell}", f"secret {cell} body"),
            }
            assert all(e.principal == principal and e.scope == scope for e in found)
            people = await store.discover_people(f"Person{cell} and alice", **who)
            assert [p.name for p in people] == [f"Person{cell}", "Alice"]


# -- semantic, recent, people, corrections, sources ----------------------------------------------


async def test_semantic_arm_ranks_the_closest_memory_first(store: MemoryStore) -> None:
    adapter = HashingEmbedding()
    await store.add_memory("db", "database migration failed during deployment", **ME)
    await store.add_memory("lunch", "we had pasta for lunch", **ME)
    await store.add_memory("cat", "alice has a cat", **ME)
    query = adapter.embed(["why did the database migration fail"])[0]
    found = await store.semantic_candidates(query, limit=3, **ME)
    assert found[0].id == "db"
    assert found[0].arm == "semantic"
    assert found[0].score == pytest.approx(
        float(adapter.embed(["database migration failed during deployment"])[0] @ query),
        rel=1e-5,
    )
    assert [e.score for e in found] == sorted((e.score for e in found), reverse=True)
    # A query with no shared word scores 0 everywhere: ties are broken by id.
    zero = await store.semantic_candidates(np.zeros(adapter.dimensions), limit=3, **ME)
    assert [e.id for e in zero] == ["cat", "db", "lunch"]
    with pytest.raises(ValueError, match="dimensions"):
        await store.semantic_candidates(np.zeros(3), limit=3, **ME)


async def test_semantic_arm_without_adapter_is_empty_and_embed_missing_fills_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.db"
    async with MemoryStore(path) as plain:
        await plain.add_memory("m1", "database migration", created_at=1.0, **ME)
        assert plain.embedding is None
        assert await plain.semantic_candidates(np.zeros(64), limit=3, **ME) == []
        assert await plain.embed_missing() == 0
    adapter = HashingEmbedding()
    async with MemoryStore(path, embedding=adapter) as store:
        assert await store.embed_missing(batch=1) == 1
        assert await store.embed_missing() == 0
        query = adapter.embed(["database"])[0]
        assert [e.id for e in await store.semantic_candidates(query, limit=3, **ME)] == ["m1"]


async def test_unembedded_counts_the_memories_the_model_has_no_vector_for(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.db"
    old, new = HashingEmbedding(dimensions=32), HashingEmbedding()
    async with MemoryStore(path, embedding=old) as before:  # written under another model
        await before.add_memories([MemoryRecord(id=f"m{i:03d}", text=f"note {i}", **ME)
                                   for i in range(100)])
        assert await before.unembedded() == 0 and await before.unembedded(probe=5) == 0
    async with MemoryStore(path) as plain:
        assert await plain.unembedded() == 0  # no model: nothing is missing
    async with MemoryStore(path, embedding=new) as store:
        # The switch left every memory without a vector; a probe reads the 5 oldest and newest.
        assert (await store.unembedded(), await store.unembedded(probe=5)) == (100, 10)
        assert await store.embed_missing(batch=30) == 100
        assert (await store.unembedded(), await store.unembedded(probe=5)) == (0, 0)
        await store.add_memories([MemoryRecord(id="late", text="written without it", **ME)])
    async with MemoryStore(path) as plain:
        await plain.add_memories([MemoryRecord(id="later", text="no model at all", **ME)])
    async with MemoryStore(path, embedding=new) as store:
        assert (await store.unembedded(), await store.unembedded(probe=1)) == (1, 1)


def _writes_meanwhile(work: list[Any]) -> HashingEmbedding:
    """An adapter during whose first ``embed`` another writer changes the store (``work``)."""

    class WritesMeanwhile(HashingEmbedding):
        def embed(self, texts: Any) -> Any:
            while work:  # embed runs in a worker thread of the store's loop
                anyio.from_thread.run(work.pop())
            return super().embed(texts)

    return WritesMeanwhile()


@pytest.mark.parametrize("change", ["updated", "forgotten, its seq reused"])
async def test_a_memory_changed_while_it_is_embedded_never_gets_the_old_texts_vector(
    tmp_path: Path, change: str
) -> None:
    path, old = tmp_path / "m.db", "launch codes are kept in the blue vault"
    async with MemoryStore(path) as plain:  # written without a model
        await plain.remember("unrelated note about gardening", id="m1", **ME)
        await plain.remember(old, id="m2", **ME)  # the newest row
    work: list[Any] = []
    adapter = _writes_meanwhile(work)

    async def meanwhile() -> None:
        if change == "updated":
            await plain.remember("team lunch is on thursday", id="m2", **ME)
        else:  # the newest row forgotten: a new one takes its seq
            assert await plain.forget("m2", **ME)
            await plain.remember("buy oat milk", id="m3", **ME)

    work.append(meanwhile)
    async with MemoryStore(path) as plain, MemoryStore(path, embedding=adapter) as store:
        assert await store.embed_missing() == 1  # m1 alone: the other row changed meanwhile
        assert await store.unembedded() == 1  # what changed is still to embed, and is found
        query = adapter.embed([old])[0]
        found = await store.semantic_candidates(query, limit=3, **ME)
        assert all(e.score < 0.5 for e in found), found  # nothing answers the old text
        assert await store.embed_missing() == 1
        assert await store.unembedded() == 0


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "8", 2**64])
async def test_embedding_the_missing_takes_a_batch_of_at_least_one(
    tmp_path: Path, bad: object
) -> None:
    path = tmp_path / "m.db"
    async with MemoryStore(path) as plain:
        await plain.add_memories([MemoryRecord(id="m1", text="no model yet", **ME)])
    async with MemoryStore(path, embedding=HashingEmbedding()) as store:
        with pytest.raises(ValueError, match="batch"):
            await store.embed_missing(batch=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="probe"):
            await store.unembedded(probe=-1 if bad == 0 else bad)  # type: ignore[arg-type]
        assert await store.unembedded() == 1  # nothing was lost or half-done
        assert await store.embed_missing(batch=1) == 1
        assert await store.unembedded() == 0


async def test_recent_is_newest_first_with_ties_by_id(
    store: MemoryStore, clock: ManualClock
) -> None:
    await store.add_memory("b", "two", **ME)
    await store.add_memory("a", "one", **ME)  # same time as b
    clock.advance(5)
    await store.add_memory("c", "three", **ME)
    found = await store.recent_candidates(limit=10, **ME)
    assert [e.id for e in found] == ["c", "a", "b"]
    assert [e.created_at for e in found] == [1_005.0, 1_000.0, 1_000.0]
    assert all(e.arm == "recent" for e in found)


async def test_people_are_discovered_as_whole_words_in_order(store: MemoryStore) -> None:
    await store.add_person("Alice", **ME)
    await store.add_person("Bob", **ME)
    await store.add_person("Ann-Marie O'Neil", **ME)
    await store.add_person("alice", **ME)  # the same person: idempotent
    found = await store.discover_people("bob said ALICE met ann-marie o'neil; Bobby didn't", **ME)
    assert [p.name for p in found] == ["Bob", "Alice", "Ann-Marie O'Neil"]
    assert await store.discover_people("Alicea and Bobby", **ME) == []
    assert await store.discover_people("", **ME) == []


async def test_people_are_found_by_the_words_of_the_text_not_by_reading_every_name(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A cell may know many People: discovering the ones a text names reads the names that
    # start with one of its words (an index range each), never every name of the cell.
    names = [f"Person{i:05d}" for i in range(3_000)]
    for name in ("Bob", "Bobby Tables", "Ann-Marie O'Neil", "@ops team", "Zoë"):
        names.append(name)
    for name in names:
        await store.add_person(name, **ME)
    read: list[int] = []
    database = type(store._lookups.db)
    fetch = database.fetch

    async def counted(self: Any, sql: str, params: Any = ()) -> Any:
        rows = await fetch(self, sql, params)
        if "people" in sql:
            read.append(len(rows))
        return rows

    monkeypatch.setattr(database, "fetch", counted)
    text = ("ask bob and ZOË whether person00042 told ann-marie o'neil; cc @ops team "
            + "filler " * 2_000)
    found = await store.discover_people(text, **ME)
    assert [p.name for p in found] == ["Bob", "Zoë", "Person00042", "Ann-Marie O'Neil",
                                       "@ops team"]
    assert sum(read) <= 6  # the candidates, not 3,005 names
    assert await store.discover_people("Bobby", **ME) == []
    assert [p.name for p in await store.discover_people("bobby tables!", **ME)] \
        == ["Bobby Tables"]


async def test_beliefs_of_a_person(store: MemoryStore, clock: ManualClock) -> None:
    await store.add_belief("b1", "Alice", "prefers tabs", **ME)
    clock.advance(1)
    await store.add_belief("b2", "alice", "likes trio", **ME)
    await store.add_belief("b3", "Bob", "likes asyncio", **ME)
    found = await store.beliefs_of("ALICE", limit=10, **ME)
    assert [(e.id, e.kind, e.arm) for e in found] == [
        ("b2", "belief", "belief"),
        ("b1", "belief", "belief"),
    ]
    assert [e.id for e in await store.beliefs_of("alice", limit=1, **ME)] == ["b2"]
    assert [p.name for p in await store.discover_people("what does bob think", **ME)] == ["Bob"]


async def test_corrections_supersede(store: MemoryStore, clock: ManualClock) -> None:
    await store.add_correction("c1", "the API key rotates weekly", **ME)
    clock.advance(1)
    await store.add_correction("c2", "the API key rotates daily", supersedes=["c1"], **ME)
    await store.add_correction("c3", "deploys freeze on Fridays", **ME)
    found = await store.current_corrections(**ME)
    assert [e.id for e in found] == ["c2", "c3"]  # c2 and c3 tie on time: by id
    assert all(e.kind == "correction" for e in found)
    assert [e.id for e in await store.current_corrections(limit=1, **ME)] == ["c2"]


async def test_read_source_and_cites(store: MemoryStore) -> None:
    await store.add_source("s1", "the full design document", **ME)
    await store.add_memory("m1", "summary of the design", cites=["s1"], **ME)
    (memory,) = await store.sparse_candidates("design", limit=5, **ME)
    assert memory.cites == ("s1",)
    source = await store.read_source(memory.cites[0], **ME)
    assert source is not None
    assert (source.id, source.kind, source.text) == ("s1", "source", "the full design document")
    assert await store.read_source("s2", **ME) is None


async def test_get_memories_returns_only_visible_ones_in_order(store: MemoryStore) -> None:
    await seed(store)
    ids = ["only-u1proj", "only-u2proj", "m1", "nope", "m1", "a\ud800", "only-u1other", "\x00"]
    found = await store.get_memories(ids, **ME)
    assert [(e.id, e.arm) for e in found] == [("only-u1proj", "lookup"), ("m1", "lookup")]
    assert mine(found)
    assert await store.get_memories([], **ME) == []
    assert await store.get_memories(["m1"], principal="u9", scope="proj") == []
    with pytest.raises(TypeError):
        await store.get_memories("m1", **ME)


async def test_concurrent_writes_are_serialised(store: MemoryStore) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(partial(store.add_memory, f"m{i:02d}", f"write {i}", **ME))
            tg.start_soon(
                partial(store.add_memory, f"m{i:02d}", f"write {i}", principal="u2", scope="p")
            )
    assert len(await store.recent_candidates(limit=100, **ME)) == 20


async def test_a_cancelled_write_leaves_no_transaction_behind(store: MemoryStore) -> None:
    records = [MemoryRecord(id=f"m{i}", text=f"text {i}", **ME) for i in range(200)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.add_memories, records)
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        tg.cancel_scope.cancel()
    # All or nothing, and the connection is usable for the next write.
    assert len(await store.recent_candidates(limit=500, **ME)) in (0, 200)
    await store.add_memory("after", "after the cancel", **ME)
    assert [e.id for e in await store.sparse_candidates("after", limit=5, **ME)] == ["after"]


async def test_the_matrices_kept_are_counted_once_when_searches_of_a_cell_meet(
    tmp_path: Path, anyio_backend: object
) -> None:
    # Several searches of one cell right after a write each build its matrix: the one kept
    # last replaces the others in the running total, so the budget keeps matrices cached.
    embedding = HashingEmbedding()
    async with MemoryStore(tmp_path / "m.db", embedding=embedding,
                           vector_cache_bytes=200_000) as store:
        await store.remember_many([MemoryWrite(text=f"memo {k} release", principal="p",
                                               scope="s", id=f"m{k}") for k in range(200)])
        query = embedding.embed(["release"])[0]
        for n in range(20):
            await store.remember(f"changed {n} release", principal="p", scope="s", id="m0")
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(partial(store.semantic_candidates, query, principal="p",
                                          scope="s", limit=3))
            cache = store._vectors
            assert cache.held_bytes == sum(charged for _, charged in cache._matrices.values())
        assert cache._matrices  # still cached

