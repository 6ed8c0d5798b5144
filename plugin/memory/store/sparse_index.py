"""How the sparse arm indexes and ranks: one term index for every cell, and bm25 with each
cell's own statistics, kept in the same transaction as the writes.

**Terms.** Text is split into terms by FTS5's own tokenizer (:data:`~plugin.memory.fts.TOKENIZER`:
``unicode61``, diacritics removed, Porter stemming), run on a private scratch table in the
connection's ``temp`` schema and read back through ``fts5vocab``. No user text is ever FTS5
query syntax: memories and query words are both tokenized as plain documents.

**One index for any number of cells.** ``memory_terms`` holds one row per (cell, term,
memory) with the term's count in the memory and the memory's length in terms;
``cell_terms`` holds each cell's document frequency per term; ``memory_cells`` each cell's
number of memories and of terms. Cells are rows, never tables: a new cell costs three row
writes, and opening the store or searching reads the same schema at 100,000 cells as at 10.

**Exact per-cell bm25.** A search reads the cell's row, the document frequencies of the query's
terms in that cell, and the postings of those terms in that cell (a range of the primary key),
and scores with FTS5's bm25 (k1 = 1.2, b = 0.75, idf = ln((N - n + 0.5) / (n + 0.5)), floored
at 1e-6) over the cell's statistics alone: no other cell's memories change an order. A query
word that FTS5 would tokenize into several terms (``e_mail``) counts as those terms, each on
its own (FTS5 would ask for the phrase); a term named by several query words counts once per
word, as FTS5's phrases do.

**The change log keeps it exact.** Triggers on ``memories`` append each insert, delete and
change of a row's text or cell to ``memory_index_log`` (with the old text, so its terms can be
taken out again). :func:`index_logged` replays the log, in order, into the index and clears
it. The store's writes replay it in their own transaction; a row written with plain SQL is
replayed before the next search, so the index never answers with stale text.
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from collections.abc import Sequence

import attrs

from ...control._sqlite import Row
from ..fts import TOKENIZER

__all__ = [
    "B",
    "INDEX_TABLES",
    "CellQuery",
    "K1",
    "REPLAY_BATCH",
    "bm25_idf",
    "cell_of",
    "cell_query",
    "index_logged",
    "ranked_seqs",
    "tokenize",
]

K1 = 1.2
B = 0.75

#: The index's tables (statements without their final ``;``).
INDEX_TABLES = (
    """CREATE TABLE IF NOT EXISTS memory_cells (
    cell INTEGER PRIMARY KEY,
    principal TEXT NOT NULL,
    scope TEXT NOT NULL,
    docs INTEGER NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0,
    UNIQUE (principal, scope)
)""",
    """CREATE TABLE IF NOT EXISTS cell_terms (
    cell INTEGER NOT NULL,
    term TEXT NOT NULL,
    df INTEGER NOT NULL,
    PRIMARY KEY (cell, term)
) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS memory_terms (
    cell INTEGER NOT NULL,
    term TEXT NOT NULL,
    seq INTEGER NOT NULL,
    tf INTEGER NOT NULL,
    length INTEGER NOT NULL,
    PRIMARY KEY (cell, term, seq)
) WITHOUT ROWID""",
)

_SCRATCH = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.memory_tokens "
    f"USING fts5(text, content = '', tokenize = '{TOKENIZER}')",
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.memory_token_rows "
    "USING fts5vocab(temp, memory_tokens, instance)",
)


def tokenize(conn: sqlite3.Connection, texts: Sequence[str]) -> list[Counter[str]]:
    """Each text's terms and their counts, as the store's FTS5 tokenizer makes them."""
    counts: list[Counter[str]] = [Counter() for _ in texts]
    if not texts:
        return counts
    for sql in _SCRATCH:
        conn.execute(sql)
    conn.executemany(
        "INSERT INTO temp.memory_tokens (rowid, text) VALUES (?, ?)", enumerate(texts, start=1)
    )
    try:
        for doc, term, count in conn.execute(
            "SELECT doc, term, count(*) FROM temp.memory_token_rows GROUP BY doc, term"
        ):
            counts[doc - 1][term] = count
    finally:
        # Contentless: 'delete-all' empties the index itself, leaving no tombstones behind.
        conn.execute("INSERT INTO temp.memory_tokens (memory_tokens) VALUES ('delete-all')")
    return counts


def cell_of(conn: sqlite3.Connection, principal: str, scope: str) -> int:
    """The cell's number, given to it by its first write."""
    row = conn.execute(
        "SELECT cell FROM memory_cells WHERE principal = ? AND scope = ?", (principal, scope)
    ).fetchone()
    if row is not None:
        return int(row[0])
    cursor = conn.execute(
        "INSERT INTO memory_cells (principal, scope) VALUES (?, ?)", (principal, scope)
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


#: How many logged changes are tokenized at once (bounds the memory a large replay takes).
REPLAY_BATCH = 2_000


def index_logged(conn: sqlite3.Connection) -> int:
    """Replay every logged change into the index, in order, and clear the log; on a raw
    connection inside a write transaction. Returns how many changes were replayed."""
    done = 0
    cells: dict[tuple[str, str], int] = {}
    while True:
        changes: list[Row] = conn.execute(
            "SELECT change, principal, scope, seq, text, op FROM memory_index_log "
            "ORDER BY change LIMIT ?",
            (REPLAY_BATCH,),
        ).fetchall()
        if not changes:
            return done
        _replay(conn, changes, cells)
        conn.execute("DELETE FROM memory_index_log WHERE change <= ?", (changes[-1][0],))
        done += len(changes)


def _replay(
    conn: sqlite3.Connection, changes: list[Row], cells: dict[tuple[str, str], int]
) -> None:
    terms_of = tokenize(conn, [row[4] for row in changes])
    for (_, principal, scope, seq, _, op), terms in zip(changes, terms_of, strict=True):
        key = (principal, scope)
        if key not in cells:
            cells[key] = cell_of(conn, principal, scope)
        cell = cells[key]
        length = sum(terms.values())
        if op == "insert":
            conn.executemany(
                "INSERT INTO memory_terms (cell, term, seq, tf, length) VALUES (?, ?, ?, ?, ?)",
                [(cell, term, seq, tf, length) for term, tf in terms.items()],
            )
            conn.executemany(
                "INSERT INTO cell_terms (cell, term, df) VALUES (?, ?, 1) "
                "ON CONFLICT (cell, term) DO UPDATE SET df = df + 1",
                [(cell, term) for term in terms],
            )
            step = 1
        else:
            conn.executemany(
                "DELETE FROM memory_terms WHERE cell = ? AND term = ? AND seq = ?",
                [(cell, term, seq) for term in terms],
            )
            conn.executemany(
                "UPDATE cell_terms SET df = df - 1 WHERE cell = ? AND term = ?",
                [(cell, term) for term in terms],
            )
            conn.executemany(
                "DELETE FROM cell_terms WHERE cell = ? AND term = ? AND df <= 0",
                [(cell, term) for term in terms],
            )
            step, length = -1, -length
        conn.execute(
            "UPDATE memory_cells SET docs = docs + ?, tokens = tokens + ? WHERE cell = ?",
            (step, length, cell),
        )


def bm25_idf(docs: int, df: int) -> float:
    """FTS5's idf: ``ln((N - n + 0.5) / (n + 0.5))``, floored at 1e-6 for very common terms."""
    idf = math.log((docs - df + 0.5) / (df + 0.5))
    return idf if idf > 0.0 else 1e-6


@attrs.frozen
class CellQuery:
    """A query's words as bm25 weighs them in one cell (:func:`cell_query`)."""

    cell: int
    avgdl: float
    """The cell's mean memory length, in terms."""
    terms: list[tuple[str, float]]
    """Each term the cell holds, in the query's order, with its weight: its count among the
    query's words times its idf in the cell."""
    df: dict[str, int]
    """Each of those terms' document frequency in the cell."""


def cell_query(
    conn: sqlite3.Connection, principal: str, scope: str, words: Sequence[str]
) -> CellQuery | None:
    """``words``' terms weighed by the cell's own statistics; None when the cell holds no
    memory or none of the terms. Runs on the raw connection; reads only this cell's rows."""
    cell = conn.execute(
        "SELECT cell, docs, tokens FROM memory_cells WHERE principal = ? AND scope = ?",
        (principal, scope),
    ).fetchone()
    if cell is None or cell[1] <= 0 or not words:
        return None
    cell_id, docs, tokens = int(cell[0]), int(cell[1]), int(cell[2])
    weight: Counter[str] = Counter()
    for terms in tokenize(conn, list(words)):
        weight.update(terms.keys())
    if not weight:
        return None
    names = list(weight)
    found = dict(
        conn.execute(
            "SELECT term, df FROM cell_terms WHERE cell = ? AND term IN "
            f"({', '.join('?' * len(names))})",
            (cell_id, *names),
        ).fetchall()
    )
    query = [(term, weight[term] * bm25_idf(docs, int(found[term]))) for term in names
             if term in found]
    if not query:
        return None
    return CellQuery(cell_id, tokens / docs, query,
                     {term: int(found[term]) for term, _ in query})


def ranked_seqs(
    conn: sqlite3.Connection, principal: str, scope: str, words: Sequence[str], limit: int
) -> list[tuple[int, float]]:
    """The cell's best ``limit`` memories for ``words`` as ``(seq, bm25)``, best first (ties:
    the older row first). Runs on the raw connection; reads only this cell's rows."""
    asked = cell_query(conn, principal, scope, words) if limit > 0 else None
    if asked is None:
        return []
    query, df = asked.terms, asked.df
    scorer = _Scorer(conn, asked.cell, query, asked.avgdl, limit)
    # Pass 1: the rarest terms until they hold ``limit`` memories, scored in full: their
    # k-th score is a lower bound of the true k-th score.
    rarest: list[str] = []
    held = 0
    for term in sorted(df, key=lambda term: (df[term], term)):
        rarest.append(term)
        held += df[term]
        if held >= limit:
            break
    if len(rarest) == len(query):
        return scorer.all()
    first = scorer.containing(rarest)
    if len(first) < limit:
        return scorer.all()
    # A memory holding none of the "essential" terms scores at most the sum of the others'
    # upper bounds (idf * (k1 + 1) each): below the bound, it cannot reach the top ``limit``
    # (MaxScore). Only memories holding an essential term need a score.
    bound = first[-1][1] * (1.0 - 1e-9)  # a margin for the rounding of the sums
    essential = [term for term, _ in query]
    spare = 0.0
    for term, idf in sorted(query, key=lambda pair: (pair[1], pair[0])):
        if spare + idf * (K1 + 1.0) >= bound:
            break
        spare += idf * (K1 + 1.0)
        essential.remove(term)
    if set(essential) <= set(rarest):
        return first  # pass 1 already scored every memory that can rank
    if len(essential) == len(query):
        return scorer.all()
    return scorer.containing(essential)


@attrs.frozen
class _Scorer:
    """bm25 of one cell's memories for one query: of all its matches, or of those holding
    some of its terms. Sums run over the query's terms in its order, either way."""

    conn: sqlite3.Connection
    cell: int
    query: list[tuple[str, float]]
    avgdl: float
    limit: int

    def _run(self, sql: str, params: tuple[object, ...]) -> list[tuple[int, float]]:
        values = ", ".join("(?, ?)" for _ in self.query)
        rows = self.conn.execute(
            f"WITH q (term, idf) AS (VALUES {values}) {sql}",
            (*(value for pair in self.query for value in pair), K1, K1, B, B, self.avgdl,
             *params, self.limit),
        ).fetchall()
        return [(int(seq), float(score)) for seq, score in rows]

    def all(self) -> list[tuple[int, float]]:
        return self._run(
            f"SELECT p.seq, {_BM25} AS score "
            "FROM q JOIN memory_terms AS p ON p.cell = ? AND p.term = q.term "
            "GROUP BY p.seq ORDER BY score DESC, p.seq LIMIT ?",
            (self.cell,),
        )

    def containing(self, terms: Sequence[str]) -> list[tuple[int, float]]:
        marks = ", ".join("?" for _ in terms)
        return self._run(
            f"SELECT c.seq, {_BM25} AS score FROM ("
            f"SELECT DISTINCT seq FROM memory_terms WHERE cell = ? AND term IN ({marks})"
            ") AS c CROSS JOIN q CROSS JOIN memory_terms AS p "
            "WHERE p.cell = ? AND p.term = q.term AND p.seq = c.seq "
            "GROUP BY c.seq ORDER BY score DESC, c.seq LIMIT ?",
            (self.cell, *terms, self.cell),
        )


# FTS5's bm25 term by term, in its own order of operations (parameters: k1, k1, b, b, avgdl).
_BM25 = "sum(q.idf * ((p.tf * (? + 1.0)) / (p.tf + ? * (1.0 - ? + ? * p.length / ?))))"
