"""How the store searches: the sparse arm (bm25 with the cell's own statistics over the one
term index: :mod:`.sparse_index`) and the semantic arm (cosine over stored float32 vectors,
scored from a cached per-cell matrix: :mod:`.vectors`). Both read only the trusted principal's
and scope's cell and filter by both inside the query, so no query text can reach another
principal's or another scope's rows."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import attrs
import numpy as np
import numpy.typing as npt

from ...control._sqlite import Row, within
from ..embedding import EmbeddingAdapter
from ..terms import word_terms
from .database import Database
from .errors import translate
from .schema import MEMORY_COLUMNS, memory_evidence
from .sparse_index import index_logged, ranked_seqs
from .values import Evidence, check_limit, visible
from .vectors import VectorCache
from .words import WordQuery, WordVectors, word_embed

__all__ = ["MAX_QUERY_TERMS", "Search"]

#: The most words of a query the sparse arm uses (as in :func:`.fts.fts5_match_expression`).
MAX_QUERY_TERMS = 32


def _ranked(
    principal: str, scope: str, words: list[str], limit: int, *, check_log: bool
) -> Callable[[sqlite3.Connection], list[Row] | None]:
    """One hop: None while changes wait in the index log, else the cell's ranked memory rows
    (:data:`MEMORY_COLUMNS` and the bm25 score)."""

    def run(conn: sqlite3.Connection) -> list[Row] | None:
        if check_log and conn.execute("SELECT 1 FROM memory_index_log LIMIT 1").fetchone():
            return None
        ranked = ranked_seqs(conn, principal, scope, words, limit)
        if not ranked:
            return []
        # Read from ``memories``, which checks the principal and scope once more. The unary
        # ``+`` keeps the planner on the primary key: with a list of seqs it would otherwise
        # scan the whole cell through its (principal, scope) index.
        rows = {
            row[-1]: row
            for row in conn.execute(
                f"SELECT {MEMORY_COLUMNS}, m.seq FROM memories AS m "
                "WHERE +m.principal = ? AND +m.scope = ? AND m.seq IN "
                f"({', '.join('?' * len(ranked))})",
                (principal, scope, *(seq for seq, _ in ranked)),
            )
        }
        return [(*rows[seq][:-1], score) for seq, score in ranked if seq in rows]

    return run


@attrs.define(eq=False)
class Search:
    """The store's candidate arms (see :class:`~plugin.memory.store.MemoryStore`)."""

    db: Database
    embedding: EmbeddingAdapter | None
    vectors: VectorCache
    word_vectors: WordVectors | None = attrs.field(init=False)
    """Word vectors for the word match, when the adapter's words mean something alone: its
    own, or those it borrows from another model (:func:`.words.word_embed`)."""

    def __attrs_post_init__(self) -> None:
        embed = word_embed(self.embedding)
        self.word_vectors = WordVectors(embed) if embed is not None else None

    async def sparse_candidates(
        self, query: str, *, principal: str, scope: str, limit: int
    ) -> list[Evidence]:
        limit = check_limit(limit)
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        # The words the safe FTS5 expression would quote (fts5_match_expression's recipe).
        words = list(word_terms(query, limit=MAX_QUERY_TERMS, fold=False))
        if not words or limit == 0 or not visible(principal, scope):
            return []
        rows = await self._run(_ranked(principal, scope, words, limit, check_log=True))
        if rows is None:  # rows written with plain SQL: index them first
            await self.db.transact(index_logged)
            rows = await self._run(_ranked(principal, scope, words, limit, check_log=False))
        assert rows is not None
        return [memory_evidence(row, score=float(row[6]), arm="sparse") for row in rows]

    async def _run(
        self, fn: Callable[[sqlite3.Connection], list[Row] | None]
    ) -> list[Row] | None:
        # One read transaction: the cell's statistics, its terms' and its rows as of one
        # commit, whatever another connection or process commits between the statements.
        try:
            return await self.db.connection().run(lambda raw: within(raw, fn, begin="BEGIN"))
        except sqlite3.Error as exc:
            raise translate(exc, path=self.db.path, timeout=self.db.timeout) from exc

    async def semantic_candidates(
        self, vector: npt.ArrayLike, *, principal: str, scope: str, limit: int,
        words: WordQuery | None = None,
    ) -> list[Evidence]:
        limit = check_limit(limit)
        adapter = self.embedding
        if adapter is None or limit == 0 or not visible(principal, scope):
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape != (adapter.dimensions,):
            raise ValueError(
                f"vector must have {adapter.dimensions} dimensions, got shape {query.shape}"
            )
        if not np.isfinite(query).all():
            raise ValueError("vector must be finite")
        return await self.vectors.search(
            query,
            principal=principal,
            scope=scope,
            model=adapter.name,
            dimensions=adapter.dimensions,
            limit=limit,
            words=None if words is None or self.word_vectors is None
            else (words, self.word_vectors),
        )
