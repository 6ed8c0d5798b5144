"""How the store searches: the sparse arm (FTS5 bm25 over safe, quoted terms, in the cell's own
index: :mod:`.schema`) and the semantic arm (cosine over stored float32 vectors, scored from a
cached per-cell matrix: :mod:`.vectors`). Both read only the trusted principal's and scope's
cell and filter by both inside the query, so no query text can reach another principal's or
another scope's rows."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import attrs
import numpy as np
import numpy.typing as npt

from ...control._sqlite import Params, Row
from ..embedding import EmbeddingAdapter
from ..fts import fts5_match_expression
from .database import Database
from .errors import translate
from .schema import LOGGED_CELLS, MEMORY_COLUMNS, cell_table, memory_evidence
from .values import Evidence, check_limit, visible
from .vectors import VectorCache
from .writes import index_statements

__all__ = ["Search"]


def _ranked(
    sql: str, params: Params, table: str, *, check_log: bool
) -> Callable[[sqlite3.Connection], list[Row] | None]:
    """One hop: None while changes wait in the index log, else the ranked rows (none when
    the cell has no index yet: nothing was ever written to it)."""

    def run(conn: sqlite3.Connection) -> list[Row] | None:
        if check_log and conn.execute("SELECT 1 FROM memory_index_log LIMIT 1").fetchone():
            return None
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if str(exc) == f"no such table: {table}":
                return []
            raise

    return run


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
        table = cell_table(principal, scope)
        # The cell's own bm25 ranks and limits its matches; only those rows are then read
        # from ``memories``, which checks the principal and scope once more.
        sql = (
            f"SELECT {MEMORY_COLUMNS}, f.rank FROM ("
            f'SELECT rowid, rank FROM "{table}" WHERE "{table}" MATCH ? '
            "ORDER BY rank, rowid LIMIT ?"
            ") AS f JOIN memories AS m ON m.seq = f.rowid "
            "WHERE m.principal = ? AND m.scope = ? ORDER BY f.rank, f.rowid"
        )
        params = (expression, limit, principal, scope)
        rows = await self._run(_ranked(sql, params, table, check_log=True))
        if rows is None:  # rows written with plain SQL: index them first
            await self._index_logged()
            rows = await self._run(_ranked(sql, params, table, check_log=False))
        assert rows is not None
        return [memory_evidence(row, score=-float(row[6]), arm="sparse") for row in rows]

    async def _run(
        self, fn: Callable[[sqlite3.Connection], list[Row] | None]
    ) -> list[Row] | None:
        try:
            return await self.db.connection().run(fn)
        except sqlite3.Error as exc:
            raise translate(exc, path=self.db.path, timeout=self.db.timeout) from exc

    async def _index_logged(self) -> None:
        cells = await self.db.fetch(LOGGED_CELLS)
        if cells:
            await self.db.write(index_statements((row[0], row[1]) for row in cells))

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
