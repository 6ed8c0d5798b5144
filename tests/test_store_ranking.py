"""How the store's sparse arm ranks: bm25 statistics of the caller's own cell (principal and
scope) only, stemmed terms, and no row of another cell whatever the text, on both loops."""

from __future__ import annotations

import math
import random
import sqlite3
from pathlib import Path
from typing import TypedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.memory.store import Evidence, MemoryRecord, MemoryStore, MemoryWrite, sparse_index

from ._hostile import HOSTILE_TEXT

pytestmark = pytest.mark.anyio


class Who(TypedDict):
    principal: str
    scope: str


ME: Who = {"principal": "u1", "scope": "proj"}


def ranking(found: list[Evidence]) -> list[tuple[str, float]]:
    return [(e.id, e.score) for e in found]


async def test_another_principals_memories_do_not_change_the_order(tmp_path: Path) -> None:
    # Within u1's cell "apple" and "banana" are equally rare: a bm25 tie, broken by age. Many
    # "apple" memories elsewhere would make "apple" common table-wide and put "banana" first.
    own = [
        MemoryRecord(id="apple", text="apple pie", created_at=1.0, **ME),
        MemoryRecord(id="banana", text="banana pie", created_at=2.0, **ME),
        MemoryRecord(id="cherry", text="cherry tart", created_at=3.0, **ME),
    ]
    crowd = [
        MemoryRecord(id=f"x{i}", text=f"apple {i}", created_at=1.0, principal=p, scope=s)
        for p, s in (("u2", "proj"), ("u1", "other"))
        for i in range(40)
    ]
    async with MemoryStore(tmp_path / "alone.db") as alone:
        await alone.add_memories(own)
        expected = await alone.sparse_candidates("banana apple", limit=10, **ME)
    async with MemoryStore(tmp_path / "shared.db") as shared:
        await shared.add_memories(crowd[:40])
        await shared.add_memories(own)
        await shared.add_memories(crowd[40:])
        found = await shared.sparse_candidates("banana apple", limit=10, **ME)
    assert [e.id for e in found] == ["apple", "banana"]
    assert found[0].score == found[1].score
    assert ranking(found) == ranking(expected)


async def test_plural_finds_singular_and_diacritics_fold(tmp_path: Path) -> None:
    async with MemoryStore(tmp_path / "m.db") as store:
        await store.add_memory("inv", "send the invoice to Alice", created_at=1.0, **ME)
        await store.add_memory("run", "the nightly run failed", created_at=2.0, **ME)
        await store.add_memory("cafe", "meeting at the Café Crème", created_at=3.0, **ME)
        await store.add_memory("other", "unrelated words", created_at=4.0, **ME)

        async def ids(text: str) -> list[str]:
            return [e.id for e in await store.sparse_candidates(text, limit=10, **ME)]

        assert await ids("invoices") == ["inv"]
        assert await ids("Invoicing") == ["inv"]
        assert await ids("running runs") == ["run"]
        assert await ids("cafe creme") == ["cafe"]
        assert await ids("CAFÉ") == ["cafe"]


async def test_hostile_principals_get_their_own_cell_and_no_table(tmp_path: Path) -> None:
    hostile = ['u"; DROP TABLE memories; --', "u1", "U1", "u1 ", "a]b", "x'y", "\u00e9", "e\u0301"]
    path = tmp_path / "m.db"
    async with MemoryStore(path) as store:
        async with MemoryStore(tmp_path / "empty.db"):
            pass
        for i, principal in enumerate(hostile):
            await store.add_memory(
                "m", f"shared word owner{i}", principal=principal, scope="proj", created_at=1.0
            )
        for i, principal in enumerate(hostile):
            found = await store.sparse_candidates(
                "shared word " + principal, principal=principal, scope="proj", limit=20
            )
            assert [(e.text, e.principal) for e in found] == [
                (f"shared word owner{i}", principal)
            ]
    conn = sqlite3.connect(path)
    try:
        names = sorted(row[0] for row in conn.execute("SELECT name FROM sqlite_master"))
        assert conn.execute("SELECT count(*) FROM memories").fetchone() == (len(hostile),)
        cells = conn.execute("SELECT principal, docs FROM memory_cells ORDER BY cell").fetchall()
    finally:
        conn.close()
    # Each principal is a row of its own, never a table: the schema is an empty store's.
    assert cells == [(principal, 1) for principal in hostile]
    conn = sqlite3.connect(tmp_path / "empty.db")
    try:
        assert names == sorted(row[0] for row in conn.execute("SELECT name FROM sqlite_master"))
    finally:
        conn.close()


async def test_changes_made_with_plain_sql_are_indexed_before_the_next_search(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.db"
    async with MemoryStore(path) as store:
        await store.add_memory("a", "alpha gamma", created_at=1.0, **ME)
        await store.add_memory("b", "beta gamma", created_at=2.0, **ME)
        await store.add_memory("c", "beta beta", created_at=3.0, principal="u2", scope="proj")
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("DELETE FROM memories WHERE id = 'a'")
            other.execute("UPDATE memories SET text = 'delta gamma' WHERE id = 'b'")
            other.execute("UPDATE memories SET principal = 'u1' WHERE id = 'c'")
            other.execute(
                "INSERT INTO memories (principal, scope, id, text, created_at) "
                "VALUES ('u1', 'proj', 'd', 'alpha', 4.0)"
            )
        finally:
            other.close()

        async def ids(text: str, who: Who = ME) -> list[str]:
            return [e.id for e in await store.sparse_candidates(text, limit=10, **who)]

        assert await ids("alpha") == ["d"]
        assert await ids("beta") == ["c"]
        assert await ids("delta") == ["b"]
        assert await ids("beta", {"principal": "u2", "scope": "proj"}) == []
        # The index matches a fresh store holding the same rows.
        async with MemoryStore(tmp_path / "fresh.db") as fresh:
            await fresh.add_memory("b", "delta gamma", created_at=2.0, **ME)
            await fresh.add_memory("c", "beta beta", created_at=3.0, **ME)
            await fresh.add_memory("d", "alpha", created_at=4.0, **ME)
            for text in ("alpha", "beta", "gamma delta", "alpha beta gamma delta"):
                assert ranking(await store.sparse_candidates(text, limit=10, **ME)) == ranking(
                    await fresh.sparse_candidates(text, limit=10, **ME)
                )


async def test_a_cell_another_connection_creates_is_searched_here(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    async with MemoryStore(path) as reader, MemoryStore(path) as writer:
        assert await reader.sparse_candidates("invoice", limit=5, **ME) == []
        await writer.add_memory("m1", "the invoices", created_at=1.0, **ME)
        assert [e.id for e in await reader.sparse_candidates("invoice", limit=5, **ME)] == ["m1"]
        await writer.add_memory("m2", "invoice", created_at=2.0, **ME)
        found = await reader.sparse_candidates("invoice", limit=5, **ME)
        assert [e.id for e in found] == ["m2", "m1"]  # shorter first
    conn = sqlite3.connect(path)
    try:  # the store's own writes leave nothing waiting in the change log
        assert conn.execute("SELECT count(*) FROM memory_index_log").fetchone() == (0,)
    finally:
        conn.close()


async def test_an_unknown_cell_finds_nothing(tmp_path: Path) -> None:
    async with MemoryStore(tmp_path / "m.db") as store:
        assert await store.sparse_candidates("anything", limit=5, **ME) == []
        await store.add_memory("m", "anything", created_at=1.0, principal="u2", scope="proj")
        assert await store.sparse_candidates("anything", limit=5, **ME) == []


PRINCIPALS = st.sampled_from(["u1", "u2", "U1", 'p"1', "p' OR 1=1 --", "memories", "é"])
SCOPES = st.sampled_from(["proj", "other", "*", "proj "])
WORDS = st.sampled_from(
    ["alpha", "alphas", "beta", "gamma", "AND", "OR", "NEAR", "body", "x*", "drop", "table"]
)
TEXTS = st.lists(WORDS, min_size=1, max_size=6).map(" ".join)
QUERIES = st.one_of(TEXTS, st.sampled_from(HOSTILE_TEXT[:40]), st.text(max_size=30))


@settings(max_examples=25)
@given(
    rows=st.lists(st.tuples(PRINCIPALS, SCOPES, TEXTS), min_size=1, max_size=25),
    queries=st.lists(QUERIES, min_size=1, max_size=4),
    caller=st.tuples(PRINCIPALS, SCOPES),
)
async def test_each_cell_ranks_exactly_as_a_store_of_its_rows_alone(
    rows: list[tuple[str, str, str]], queries: list[str], caller: tuple[str, str]
) -> None:
    principal, scope = caller
    records = [
        MemoryRecord(id=f"m{i}", text=text, principal=p, scope=s, created_at=float(i))
        for i, (p, s, text) in enumerate(rows)
    ]
    own = [r for r in records if (r.principal, r.scope) == caller]
    async with MemoryStore(":memory:") as shared, MemoryStore(":memory:") as alone:
        for record in records:  # one write per memory: cells interleave
            await shared.add_memories([record])
        await alone.add_memories(own)
        for query in queries:
            found = await shared.sparse_candidates(
                query, principal=principal, scope=scope, limit=50
            )
            assert all(e.principal == principal and e.scope == scope for e in found)
            assert {e.id for e in found} <= {r.id for r in own}
            expected = await alone.sparse_candidates(
                query, principal=principal, scope=scope, limit=50
            )
            assert ranking(found) == ranking(expected)


# -- bm25 with each cell's own statistics, computed independently ------------------------------

VOCABULARY = [f"w{i}" for i in range(60)]  # words the tokenizer keeps as they are


def python_bm25(docs: dict[str, str], query: list[str]) -> list[tuple[str, float]]:
    """FTS5's bm25 over ``docs`` alone (id -> text, oldest first), in plain Python; best first,
    ties by age."""
    terms = {id: text.split() for id, text in docs.items()}
    count = len(terms)
    avgdl = sum(len(words) for words in terms.values()) / count
    weights = dict.fromkeys(query, 1)  # a repeated query word counts once, as FTS5's terms
    dfs = {word: sum(word in other for other in terms.values()) for word in weights}
    scores: list[tuple[str, float, int]] = []
    for age, (id, words) in enumerate(terms.items()):
        score, hit = 0.0, False
        for word, weight in weights.items():
            tf = words.count(word)
            df = dfs[word]
            if df == 0:
                continue
            idf = math.log((count - df + 0.5) / (df + 0.5))
            idf = idf if idf > 0.0 else 1e-6
            if tf:
                hit = True
                norm = 1.2 * (1.0 - 0.75 + 0.75 * len(words) / avgdl)
                score += weight * idf * ((tf * 2.2) / (tf + norm))
        if hit:
            scores.append((id, score, age))
    scores.sort(key=lambda item: (-item[1], item[2]))
    return [(id, score) for id, score, _ in scores]


async def test_top_10_equals_an_independent_per_cell_bm25_after_writes_and_forgets(
    tmp_path: Path,
) -> None:
    rng = random.Random(26)
    cells = [(f"u{p}", scope) for p in range(3) for scope in ("proj", "other")]
    model: dict[tuple[str, str], dict[str, str]] = {cell: {} for cell in cells}

    def text(cell_index: int) -> str:
        # Each cell draws from its own skewed order of the vocabulary.
        order = VOCABULARY[cell_index * 7:] + VOCABULARY[: cell_index * 7]
        weights = [1.0 / (rank + 1) for rank in range(len(order))]
        return " ".join(rng.choices(order, weights, k=rng.randint(2, 12)))

    async with MemoryStore(tmp_path / "m.db") as store:
        for index, cell in enumerate(cells):
            writes = [
                MemoryWrite(text=text(index), principal=cell[0], scope=cell[1],
                            id=f"{cell[0]}.{cell[1]}.{k}")
                for k in range(60 + 20 * index)
            ]
            await store.remember_many(writes)
            model[cell].update((w.id, w.text) for w in writes if w.id is not None)
        for _ in range(120):  # churn: forget, replace, add, in every cell
            index = rng.randrange(len(cells))
            cell = cells[index]
            who = {"principal": cell[0], "scope": cell[1]}
            target = f"{cell[0]}.{cell[1]}.{rng.randrange(140)}"  # ids are the cell's own
            action = rng.random()
            if action < 0.4:
                assert await store.forget(target, **who) is (target in model[cell])
                model[cell].pop(target, None)
            else:
                new = text(index)
                await store.remember(new, id=target, **who)
                model[cell][target] = new
        for cell in cells:
            who = {"principal": cell[0], "scope": cell[1]}
            for _ in range(40):
                query = rng.choices(VOCABULARY, k=rng.randint(1, 4))
                want = python_bm25(model[cell], query)[:10]
                got = await store.sparse_candidates(" ".join(query), limit=10, **who)
                assert [e.id for e in got] == [id for id, _ in want], (cell, query)
                assert [e.score for e in got] == pytest.approx([score for _, score in want])
    # The statistics kept with the writes equal a recount from the rows.
    conn = sqlite3.connect(tmp_path / "m.db")
    try:
        for cell in cells:
            stats = conn.execute(
                "SELECT cell, docs, tokens FROM memory_cells WHERE principal = ? AND scope = ?",
                cell,
            ).fetchone()
            docs = model[cell].values()
            assert stats[1:] == (len(docs), sum(len(t.split()) for t in docs))
            df = dict(conn.execute("SELECT term, df FROM cell_terms WHERE cell = ?", (stats[0],)))
            assert df == {
                word: sum(word in t.split() for t in docs)
                for word in VOCABULARY
                if any(word in t.split() for t in docs)
            }
    finally:
        conn.close()


async def test_skipping_common_terms_keeps_the_exact_top_10(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Memories that hold none of a query's rare terms cannot rank once a first pass has a
    # 10th score above the common terms' upper bounds; that pass must not change the result.
    rng = random.Random(2026)
    weights = [1.0 / (rank + 1) for rank in range(len(VOCABULARY))]
    texts = {f"m{k}": " ".join(rng.choices(VOCABULARY, weights, k=rng.randint(3, 10)))
             for k in range(600)}
    pruned: list[int] = []
    real = sparse_index._Scorer.containing

    def spy(self: sparse_index._Scorer, terms: list[str]) -> list[tuple[int, float]]:
        pruned.append(len(self.query) - len(terms))
        return real(self, terms)

    monkeypatch.setattr(sparse_index._Scorer, "containing", spy)
    async with MemoryStore(tmp_path / "m.db") as store:
        await store.remember_many(MemoryWrite(text=t, id=i, **ME) for i, t in texts.items())
        for _ in range(60):
            query = [rng.choice(VOCABULARY[:5]), rng.choice(VOCABULARY[30:])]
            want = python_bm25(texts, query)[:10]
            got = await store.sparse_candidates(" ".join(query), limit=10, **ME)
            assert [e.id for e in got] == [id for id, _ in want], query
    assert pruned and max(pruned) >= 1  # common terms were skipped in some queries
