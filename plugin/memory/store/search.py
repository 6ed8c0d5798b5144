"""How the store searches: the sparse arm (FTS5 bm25 over safe, quoted terms) and the semantic
arm (cosine over stored float32 vectors, scored from a cached per-cell matrix: :mod:`.vectors`).
Both filter by the trusted principal and scope inside the query, so no query text can reach
another principal's or another scope's rows."""

from __future__ import annotations

import attrs
import numpy as np
import numpy.typing as npt

from ..embedding import EmbeddingAdapter
from ..fts import fts5_match_expression
from .database import Database
from .schema import MEMORY_COLUMNS, memory_evidence
from .values import Evidence, check_limit, visible
from .vectors import VectorCache

__all__ = ["Search"]


@attrs.define(eq=False)
class Search:
    """The store's candidate arms (see :class:`~plugin.memory.store.MemoryStore`)."""

    db: Database
    embedding: EmbeddingAdapter | None
    vectors: VectorCache

    async def sparse_candidates(
        self, query: str, *, principal: str, scope: str, limit: int
    ) -> list[Evidence]:
        limit = check_limit(limit)
        expression = fts5_match_expression(query)
        if expression is None or limit == 0 or not visible(principal, scope):
            return []
        rows = await self.db.fetch(
            f"SELECT {MEMORY_COLUMNS}, memories_fts.rank "
            "FROM memories_fts JOIN memories AS m ON m.seq = memories_fts.rowid "
            "WHERE memories_fts MATCH ? AND m.principal = ? AND m.scope = ? "
            "ORDER BY memories_fts.rank, m.seq LIMIT ?",
            (expression, principal, scope, limit),
        )
        return [memory_evidence(row, score=-float(row[6]), arm="sparse") for row in rows]

    async def semantic_candidates(
        self, vector: npt.ArrayLike, *, principal: str, scope: str, limit: int
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
        )
