"""Memories a caller manages: remember (upsert), forget, list, and an all-or-nothing batch, on
both loops; foreign ids and bad input are typed errors that write nothing."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypedDict

import pytest

from plugin.control.clock import ManualClock
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.store import (
    Evidence,
    InvalidMemoryError,
    MemoryConflictError,
    MemoryOwnershipError,
    MemoryRecord,
    MemoryStore,
    MemoryStoreCorruptError,
    MemoryWrite,
)
from plugin.memory.store.values import MAX_MEMORY_TEXT_BYTES

pytestmark = pytest.mark.anyio


class Who(TypedDict):
    principal: str
    scope: str


ME: Who = {"principal": "u1", "scope": "proj"}
THEM: Who = {"principal": "u2", "scope": "proj"}
OTHER_SCOPE: Who = {"principal": "u1", "scope": "other"}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall=1_000.0)


@pytest.fixture
async def store(tmp_path: Path, clock: ManualClock) -> AsyncIterator[MemoryStore]:
    async with MemoryStore(
        tmp_path / "memory.db", embedding=HashingEmbedding(), clock=clock
    ) as store:
        yield store


async def listed(store: MemoryStore, who: Who = ME) -> list[tuple[str, str, float]]:
    return [(m.id, m.text, m.created_at) async for m in store.memories(**who)]


def dump(path: Path) -> list[tuple[object, ...]]:
    """Every memory and vector row of the file, for "nothing changed" checks."""
    conn = sqlite3.connect(path)
    try:
        return [
            *conn.execute(
                "SELECT principal, scope, id, text, created_at FROM memories ORDER BY seq"
            ),
            *conn.execute("SELECT memory_seq, model, vector FROM embeddings ORDER BY memory_seq"),
        ]
    finally:
        conn.close()


async def test_remember_without_a_clock_uses_the_system_clock(tmp_path: Path) -> None:
    async with MemoryStore(tmp_path / "m.db") as store:
        mid = await store.remember("Ana owns the schema review.", **ME)
        [memory] = [m async for m in store.memories(**ME)]
    assert memory.id == mid and memory.text == "Ana owns the schema review."
    assert memory.created_at > 1.7e9  # a real wall-clock time, not 0 or a missing value


async def test_remember_generates_ids_and_lists_newest_first(
    store: MemoryStore, clock: ManualClock
) -> None:
    first = await store.remember("the release is on Friday", **ME)
    clock.advance(5)
    second = await store.remember("Ana owns the schema review", **ME)
    assert first != second
    assert await listed(store) == [
        (second, "Ana owns the schema review", 1_005.0),
        (first, "the release is on Friday", 1_000.0),
    ]
    assert await listed(store, THEM) == []
    assert await listed(store, OTHER_SCOPE) == []


async def test_remember_with_an_existing_id_replaces_text_time_and_every_arm(
    store: MemoryStore, clock: ManualClock
) -> None:
    assert await store.remember("the budget is approved", id="b", **ME) == "b"
    old_vector = store.embedding.embed(["the budget is approved"])[0]  # type: ignore[union-attr]
    assert [e.id for e in await store.semantic_candidates(old_vector, limit=5, **ME)] == ["b"]
    clock.advance(10)
    assert await store.remember("the invoice was rejected", id="b", **ME) == "b"
    assert await listed(store) == [("b", "the invoice was rejected", 1_010.0)]
    assert await store.sparse_candidates("budget approved", limit=5, **ME) == []
    assert [e.id for e in await store.sparse_candidates("invoice", limit=5, **ME)] == ["b"]
    new_vector = store.embedding.embed(["the invoice was rejected"])[0]  # type: ignore[union-attr]
    [hit] = await store.semantic_candidates(new_vector, limit=5, **ME)
    assert hit.id == "b" and hit.score == pytest.approx(1.0)


async def test_an_id_of_another_principal_or_scope_is_refused_and_changes_nothing(
    store: MemoryStore, tmp_path: Path
) -> None:
    await store.remember("u2's private plan", id="shared-id", **THEM)
    before = dump(tmp_path / "memory.db")
    for who in (ME, OTHER_SCOPE):
        with pytest.raises(MemoryOwnershipError) as caught:
            await store.remember("overwrite attempt", id="shared-id", **who)
        assert caught.value.id == "shared-id"
        assert "u2" not in str(caught.value)  # the error never names the owner
        assert isinstance(caught.value, MemoryConflictError)
        # In a batch, the good memories before it are not written either.
        with pytest.raises(MemoryOwnershipError):
            await store.remember_many(
                [
                    MemoryWrite(text="fine", id="fresh", **who),
                    MemoryWrite(text="overwrite attempt", id="shared-id", **who),
                ]
            )
    assert dump(tmp_path / "memory.db") == before
    assert await store.forget("shared-id", **ME) is False  # not there for u1
    assert [m.text async for m in store.memories(**THEM)] == ["u2's private plan"]


async def test_upserting_an_id_many_cells_hold_costs_the_same_as_when_few_do(
    store: MemoryStore,
) -> None:
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0

    async def upsert_steps(text: str) -> int:
        nonlocal steps
        steps = 0
        await store.remember(text, id="m1", **ME)  # the owner updates its own memory
        return steps

    async def hold_m1(cells: range) -> None:  # scenario files reuse short ids in every cell
        await store.add_memories(
            MemoryRecord(id="m1", text="theirs", principal=f"p{c}", scope="s") for c in cells
        )

    await store.remember("mine, first", id="m1", **ME)
    await hold_m1(range(10))
    await store._db.connection().run(lambda raw: raw.set_progress_handler(step, 1))
    few = await upsert_steps("mine, second")
    await hold_m1(range(10, 2_010))
    many = await upsert_steps("mine, thirds")
    assert many == few  # no row of another cell is visited
    with pytest.raises(MemoryOwnershipError):
        await store.remember("overwrite attempt", id="m1", **THEM)


async def test_remember_many_is_all_or_nothing(store: MemoryStore, tmp_path: Path) -> None:
    ids = await store.remember_many(
        [
            MemoryWrite(text="one", **ME),
            MemoryWrite(text="two", id="two", **ME),
            MemoryWrite(text="three", **THEM),
        ]
    )
    assert ids[1] == "two" and len(set(ids)) == 3
    assert {m.id async for m in store.memories(**ME)} == {ids[0], "two"}
    before = dump(tmp_path / "memory.db")
    with pytest.raises(InvalidMemoryError, match="repeats the id 'x'"):
        await store.remember_many(
            [MemoryWrite(text="a", id="x", **ME), MemoryWrite(text="b", id="x", **ME)]
        )
    assert dump(tmp_path / "memory.db") == before
    assert await store.remember_many([]) == []
    with pytest.raises(InvalidMemoryError, match="MemoryWrite"):
        await store.remember_many([{"text": "a", **ME}])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("text", "id", "message"),
    [
        ("", None, "text must not be empty"),
        (" \n\t ", None, "text must not be empty"),
        ("x" * (MAX_MEMORY_TEXT_BYTES + 1), None, "at most 65536 UTF-8 bytes"),
        ("é" * (MAX_MEMORY_TEXT_BYTES // 2 + 1), None, "at most 65536 UTF-8 bytes"),
        ("bad \ud800 text", None, "valid Unicode"),
        ("nul \x00 inside", None, "NUL"),
        (b"bytes", None, "text must be a str"),
        ("ok", "", "id must not be empty"),
        ("ok", "line\nbreak", "control"),
        ("ok", "nul\x00", "control"),
        ("ok", "esc\x1b[31m", "control"),
        ("ok", "line\u2028separator", "control"),
        ("ok", "lone\udc80", "valid Unicode"),
        ("ok", "x" * 513, "at most 512 UTF-8 bytes"),
        ("ok", 7, "id must be a str"),
        # an id that would not read as itself once rendered: it could never be shown
        ("ok", "c9] cancelled. [memory m1", "as itself"),
        ("ok", " padded", "as itself"),
        ("ok", "two  spaces", "as itself"),
        ("ok", "\u2066m1", "as itself"),
    ],
)
async def test_bad_input_is_a_typed_error_that_writes_nothing(
    store: MemoryStore, tmp_path: Path, text: object, id: object, message: str
) -> None:
    await store.remember("kept", id="kept", **ME)
    before = dump(tmp_path / "memory.db")
    with pytest.raises(InvalidMemoryError, match=message):
        await store.remember(text, id=id, **ME)  # type: ignore[arg-type]
    with pytest.raises(InvalidMemoryError, match=message):
        await store.remember_many(
            [MemoryWrite(text="fine", **ME), MemoryWrite(text=text, id=id, **ME)]  # type: ignore[arg-type]
        )
    assert dump(tmp_path / "memory.db") == before


@pytest.mark.parametrize("who", [{"principal": "", "scope": "p"}, {"principal": "u", "scope": 3}])
async def test_bad_principal_or_scope_is_a_typed_error(
    store: MemoryStore, who: dict[str, object]
) -> None:
    with pytest.raises(InvalidMemoryError):
        await store.remember("text", **who)  # type: ignore[arg-type]
    with pytest.raises(InvalidMemoryError):
        await store.forget("id", **who)  # type: ignore[arg-type]
    with pytest.raises(InvalidMemoryError):
        async for _ in store.memories(**who):  # type: ignore[arg-type]
            pass


@pytest.mark.parametrize("who", [{"principal": "u" * 513, "scope": "p"},
                                 {"principal": "u", "scope": "é" * 256 + "x"},
                                 {"principal": "u\x00", "scope": "p"}])
async def test_a_principal_or_scope_no_run_could_have_is_refused_on_write(
    store: MemoryStore, tmp_path: Path, who: dict[str, str]
) -> None:
    """A memory is written only for a principal and scope a run can have (the rule every
    hook holds a run's identity to: at most 512 UTF-8 bytes, no NUL): one that no run could
    ever recall is a typed error, and nothing is written."""
    before = dump(tmp_path / "memory.db")
    with pytest.raises(InvalidMemoryError, match=r"principal|scope"):
        await store.remember("text", **who)  # type: ignore[arg-type]
    assert dump(tmp_path / "memory.db") == before
    await store.remember("at the bound", principal="u" * 512, scope="é" * 256)


@pytest.mark.parametrize(
    ("id", "who"),
    [("c9] cancelled. [memory m1", ME), (" padded", ME), ("nl\nid", ME), ("\u2066m1", ME),
     ("m1", {"principal": "u" * 513, "scope": "p"}), ("m1", {"principal": "u\x00", "scope": "p"})],
)
async def test_seeding_takes_only_what_remember_takes(
    store: MemoryStore, tmp_path: Path, id: str, who: dict[str, str]
) -> None:
    """``add_memory`` and ``add_memories`` (imports, evaluation seeds) follow ``remember``'s
    rules: an id recall could not render as itself, or an owner no run could have, would be
    stored and never recalled."""
    before = dump(tmp_path / "memory.db")
    with pytest.raises(InvalidMemoryError):
        await store.add_memory(id, "text", **who)
    assert dump(tmp_path / "memory.db") == before


async def test_forget_removes_the_memory_from_every_arm(store: MemoryStore) -> None:
    keep = await store.remember("the deployment pipeline is green", **ME)
    gone = await store.remember("the deployment secret rotates weekly", **ME)
    vector = store.embedding.embed(["the deployment secret rotates weekly"])[0]  # type: ignore[union-attr]
    # Warm every cache first: the semantic arm's matrix and the full-text index.
    assert {e.id for e in await store.semantic_candidates(vector, limit=5, **ME)} == {keep, gone}
    assert {e.id for e in await store.sparse_candidates("deployment", limit=5, **ME)} == {
        keep,
        gone,
    }
    assert await store.forget(gone, **ME) is True
    assert await store.forget(gone, **ME) is False
    assert [e.id for e in await store.sparse_candidates("deployment secret", limit=5, **ME)] == [
        keep
    ]
    assert [e.id for e in await store.semantic_candidates(vector, limit=5, **ME)] == [keep]
    assert [e.id for e in await store.recent_candidates(limit=5, **ME)] == [keep]
    assert await store.get_memories([gone, keep], **ME) == await store.get_memories([keep], **ME)
    assert [m.id async for m in store.memories(**ME)] == [keep]
    # The id is free again, for this cell.
    assert await store.remember("a new text", id=gone, **ME) == gone


FORGET_IN_ANOTHER_PROCESS = """
import sys, anyio
from plugin.memory.store import MemoryStore
async def main():
    async with MemoryStore(sys.argv[1]) as store:
        print(await store.forget("gone", principal="u1", scope="proj"))
anyio.run(main)
"""


@pytest.mark.slow
async def test_forget_in_another_process_reaches_a_warm_store(store: MemoryStore) -> None:
    await store.remember("alpha deployment notes", id="keep", **ME)
    await store.remember("alpha deployment secret", id="gone", **ME)
    vector = store.embedding.embed(["alpha deployment secret"])[0]  # type: ignore[union-attr]
    assert len(await store.semantic_candidates(vector, limit=5, **ME)) == 2  # cache warm
    assert len(await store.sparse_candidates("alpha", limit=5, **ME)) == 2
    done = subprocess.run(
        [sys.executable, "-c", FORGET_IN_ANOTHER_PROCESS, store.path],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr
    assert [e.id for e in await store.semantic_candidates(vector, limit=5, **ME)] == ["keep"]
    assert [e.id for e in await store.sparse_candidates("alpha secret", limit=5, **ME)] == ["keep"]
    assert [m.id async for m in store.memories(**ME)] == ["keep"]


async def test_memories_pages_through_a_cell_newest_first_ties_by_the_later_write(
    store: MemoryStore, clock: ManualClock
) -> None:
    expected: list[str] = []
    for step in range(7):
        batch = [MemoryWrite(text=f"memory {step} {k}", id=f"{step}-{k}", **ME) for k in "ab"]
        await store.remember_many(batch)  # one clock reading: "b" is the later write
        await store.remember(f"memory {step} c", id=f"{step}-0", **ME)  # and this one
        expected = [f"{step}-0", f"{step}-b", f"{step}-a", *expected]
        clock.advance(1)
    await store.remember("elsewhere", **THEM)
    got = [m async for m in store.memories(page=3, **ME)]
    assert [m.id for m in got] == expected
    assert all(isinstance(m, Evidence) and m.principal == "u1" for m in got)
    for page in (0, 2**63):
        with pytest.raises(ValueError, match="page"):
            async for _ in store.memories(page=page, **ME):
                pass
    assert [m.id async for m in store.memories(page=2**63 - 1, **ME)] == expected


async def test_a_page_deep_in_a_cell_is_one_range_of_an_index_not_a_sort_of_the_cell(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Each page of ``memories`` reads from where the last ended: no page sorts the whole cell
    (a cell of 200,000 memories took minutes to list), also in a file written before the
    index existed, which gains it at open."""
    from plugin.memory.store.lookups import NEXT_PAGE, next_page

    path = tmp_path / "memory.db"
    async with MemoryStore(path, embedding=HashingEmbedding(), clock=clock) as store:
        await store.remember("kept", id="kept", **ME)
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX memories_listing")
    conn.commit()
    conn.close()
    async with MemoryStore(path, embedding=HashingEmbedding(), clock=clock) as store:
        assert [m.id async for m in store.memories(**ME)] == ["kept"]
    conn = sqlite3.connect(path)
    try:
        plan = " ".join(str(row[-1]) for row in conn.execute(
            f"EXPLAIN QUERY PLAN {NEXT_PAGE}", next_page("u1", "proj", (1.0, 1), 256)))
    finally:
        conn.close()
    # the rest of the page key's tie is a range too (an import writes thousands at one time)
    assert "created_at=? AND seq<?" in plan and "created_at<?" in plan, plan
    assert "memories_listing" in plan and "TEMP B-TREE FOR RIGHT PART" not in plan, plan


async def test_a_memory_updated_while_listing_behind_a_stepped_back_clock_is_listed_once(
    store: MemoryStore, clock: ManualClock
) -> None:
    for step in range(6):
        await store.remember(f"note {step}", id=f"m{step}", **ME)
        clock.advance(1)
    seen = []
    async with contextlib.aclosing(store.memories(page=2, **ME)) as listing:
        async for memory in listing:
            seen.append(memory.id)
            clock.step_wall(-100)  # the wall clock goes back; every update lands "older"
            await store.remember(f"{memory.text}, updated", id=memory.id, **ME)
            if len(seen) > 12:
                break
    assert sorted(seen) == [f"m{step}" for step in range(6)]  # each once, and it ends


async def test_a_file_that_is_not_a_store_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"just some notes, not a database\n" * 200)
    before = path.read_bytes()
    with pytest.raises(MemoryStoreCorruptError):
        async with MemoryStore(path) as store:
            await store.remember("x", **ME)
    assert path.read_bytes() == before


def test_memory_write_from_dict_names_what_is_wrong() -> None:
    assert MemoryWrite.from_dict({"text": "t", "principal": "p", "scope": "s"}).id is None
    for data, message in (
        (["text"], "must be an object"),
        ({"text": "t", "principal": "p"}, "missing key.*'scope'"),
        ({"text": "t", "principal": "p", "scope": "s", "when": 1}, "unknown key.*'when'"),
        ({"text": "", "principal": "p", "scope": "s"}, "text must not be empty"),
    ):
        with pytest.raises(InvalidMemoryError, match=message):
            MemoryWrite.from_dict(data)


async def _seed_then_delete_with_plain_sql(path: Path, *, before_the_trigger: bool) -> None:
    async with MemoryStore(path, embedding=HashingEmbedding()) as store:
        await store.remember("keep this one", id="a", principal="u1", scope="s")
        await store.remember("u1 private salary negotiation notes", id="b", principal="u1",
                             scope="s")
    with contextlib.closing(sqlite3.connect(path)) as conn:  # foreign keys off, as by default
        if before_the_trigger:  # a file written before the trigger existed
            conn.execute("DROP TRIGGER memories_vectors_delete")
            conn.execute("DELETE FROM memory_store_meta WHERE key = 'orphan_vectors_swept'")
        conn.execute("DELETE FROM memories WHERE id = 'b'")
        conn.commit()


@pytest.mark.parametrize("before_the_trigger", [False, True])
async def test_a_memory_deleted_with_plain_sql_takes_its_vector_along(
    tmp_path: Path, before_the_trigger: bool
) -> None:
    """Its seq is reused by the next memory: a vector left behind would fail every later
    write (a conflict) or lend the deleted text's meaning to a memory of another cell."""
    path = tmp_path / "memory.db"
    await _seed_then_delete_with_plain_sql(path, before_the_trigger=before_the_trigger)
    async with MemoryStore(path) as store:  # no embedding: the new memory gets no vector
        await store.remember("u2 unrelated memory", principal="u2", scope="s")
    async with MemoryStore(path, embedding=HashingEmbedding()) as store:
        await store.remember("a new memory", principal="u2", scope="s")  # no conflict
        vector = store.embedding.embed(["salary negotiation"])[0]
        hits = await store.semantic_candidates(vector, principal="u2", scope="s", limit=5)
    assert [hit.text for hit in hits] == ["a new memory"]


async def test_a_store_whose_schema_is_not_utf8_is_a_corrupt_store(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with MemoryStore(path) as store:
        await store.remember("hello", principal="u", scope="s")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    data[data.find(b"memoriesmemories") + 1] = 0xFF  # a table's name, no longer UTF-8
    path.write_bytes(bytes(data))
    with pytest.raises(MemoryStoreCorruptError):
        async with MemoryStore(path):
            pytest.fail("a damaged store must not open")


@pytest.mark.parametrize("statement", [
    "INSERT OR REPLACE INTO memories (principal, scope, id, text, created_at) "
    "VALUES ('u1', 's', 'b', 'edited text', 1.0)",
    "UPDATE memories SET text = 'lunch menu' WHERE id = 'b'",
])
async def test_a_memory_rewritten_with_plain_sql_keeps_no_stale_vector(
    tmp_path: Path, statement: str
) -> None:
    path = tmp_path / "memory.db"
    async with MemoryStore(path, embedding=HashingEmbedding()) as store:
        await store.remember("u1 private salary negotiation notes", id="b", principal="u1",
                             scope="s")
        await store.remember("salary negotiation notes again", id="c", principal="u1",
                             scope="s")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(statement)
        conn.commit()
        left = conn.execute("SELECT m.id FROM embeddings e LEFT JOIN memories m "
                            "ON m.seq = e.memory_seq ORDER BY 1").fetchall()
    assert left == [("c",)]  # b's vector described its old text (or a row gone): dropped


async def test_an_id_names_one_item_of_a_cell_whatever_its_kind(tmp_path: Path) -> None:
    """A call's recorded evidence is ids alone: a memory, a belief and a source of one cell
    never share an id, so a replay re-reads each as what it was (other cells may reuse it)."""
    async with MemoryStore(tmp_path / "memory.db") as store:
        await store.add_belief("b-priya", "Priya", "Priya believes rounding is half even",
                               principal="u1", scope="s")
        await store.add_source("src-1", "the backfill runbook", principal="u1", scope="s")
        await store.remember("a memory", id="m-1", principal="u1", scope="s")
        for write in (
            store.remember("lunch is at noon", id="b-priya", principal="u1", scope="s"),
            store.add_belief("m-1", "Ana", "Ana owns it", principal="u1", scope="s"),
            store.add_source("b-priya", "a source", principal="u1", scope="s"),
            store.add_belief("src-1", "Ana", "Ana owns it", principal="u1", scope="s"),
        ):
            with pytest.raises(MemoryConflictError):
                await write
        await store.remember("lunch is at noon", id="b-priya", principal="u2", scope="s")
        found = await store.get_evidence(["b-priya", "src-1", "m-1"], principal="u1", scope="s")
    assert [(item.id, item.kind) for item in found] == [
        ("b-priya", "belief"), ("src-1", "source"), ("m-1", "memory")]
