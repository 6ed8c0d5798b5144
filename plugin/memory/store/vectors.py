"""How the semantic arm scores vectors: one cached float32 matrix per principal, scope and model.

Loading every visible vector from SQLite and decoding it costs far more than scoring it, so
the matrix of one (principal, scope, model) is built once and kept in memory. It is exact:
every vector of that cell is scored, so the result equals a full scan (recall 1.0), and no
other cell's vector is ever in the matrix, so another principal's vectors are never scored.

Invalidation: triggers in the file move a per-(principal, scope) generation in the same
transaction as any change to that cell's memories or vectors, and a ``resets`` count on any
change but appended vectors (see :mod:`.schema`). A query reads both first: when only the
generation moved, the rows past the matrix's highest seq are loaded and appended; when the
resets moved, the matrix is rebuilt. So writes by this store, by another store object or by
another process are all seen. The counters are read before the vectors are loaded: a write
racing the load leaves a matrix tagged older than its content, which the next query refreshes;
it never leaves a stale matrix tagged current.

Memory is bounded: matrices are kept least-recently-used within ``budget_bytes``; a cell too
big for the budget is scored from a fresh load on every query (today's cost), never cached.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import anyio.to_thread
import attrs
import numpy as np
import numpy.typing as npt

from ...control._sqlite import Row
from ..threads import memory_threads
from .database import Database
from .schema import MEMORY_COLUMNS, memory_evidence
from .values import Evidence
from .words import MAX_WORD_MEMORIES, WordIndex, WordQuery, WordVectors, mixed

__all__ = ["DEFAULT_CACHE_BYTES", "WORD_CACHE_BYTES", "Matrix", "VectorCache"]

#: Default memory budget of the cache: 100,000 vectors of 256 dimensions take about 100 MiB.
DEFAULT_CACHE_BYTES = 512 * 1024 * 1024

_Key = tuple[str, str, str]

#: Memory budget of the word indexes kept (each for the current matrix of its cell): a cell
#: of 600 chat turns holds about 3,000 distinct words, 3 MiB.
WORD_CACHE_BYTES = 64 * 1024 * 1024

#: Matrices of more floats than this are decoded and scored in a worker thread, so a large
#: cell does not hold the event loop (a million floats score in well under a millisecond).
_OFF_LOOP_FLOATS = 1_000_000


def _decode(
    rows: list[Row], dimensions: int
) -> tuple[npt.NDArray[np.int64], list[str], npt.NDArray[np.float32]]:
    """``(seq, id, vector blob)`` rows as ``(seqs, ids, vectors)``; malformed blobs dropped.

    ``seqs`` and ``vectors`` have spare rows past ``len(ids)`` (an eighth more), so the first
    appends to a freshly loaded matrix go in place instead of copying it.
    """
    width = dimensions * 4
    rows = [row for row in rows if isinstance(row[2], bytes) and len(row[2]) == width]
    count = len(rows)
    capacity = count + count // 8 + 16
    seqs = np.empty(capacity, dtype=np.int64)
    seqs[:count] = np.fromiter((row[0] for row in rows), dtype=np.int64, count=count)
    # A copy out of the blobs: aligned, native-endian and writable, so appends can go in place.
    vectors = np.empty((capacity, dimensions), dtype=np.float32)
    vectors[:count] = np.frombuffer(b"".join(row[2] for row in rows), dtype="<f4").reshape(
        count, dimensions
    )
    return seqs, [row[1] for row in rows], vectors


@attrs.define(eq=False)
class _Rows:
    """Storage with spare capacity, shared by the successive matrices of one cell.

    A matrix sees only its first ``count`` rows, which never change, so an older matrix stays
    valid while a newer one appends past it. Only the matrix that filled the storage last may
    append in place; any other copies first (see :meth:`Matrix.extended`).
    """

    seqs: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]
    ids: list[str]
    filled: int


@attrs.frozen(eq=False)
class Matrix:
    """The vectors of one cell: row ``i`` is memory ``seqs[i]`` with id ``ids[i]``."""

    generation: int
    resets: int
    count: int
    _rows: _Rows

    @classmethod
    def of(
        cls,
        seqs: npt.NDArray[np.int64],
        ids: list[str],
        vectors: npt.NDArray[np.float32],
        *,
        generation: int,
        resets: int,
    ) -> Matrix:
        """A matrix of ``ids``; ``seqs`` and ``vectors`` may have spare rows past them."""
        return cls(generation, resets, len(ids), _Rows(seqs, vectors, ids, len(ids)))

    @property
    def seqs(self) -> npt.NDArray[np.int64]:
        return self._rows.seqs[: self.count]

    @property
    def vectors(self) -> npt.NDArray[np.float32]:
        return self._rows.vectors[: self.count]

    @property
    def ids(self) -> list[str]:
        """The ids of the rows (the list may run past ``count``: never index beyond it)."""
        return self._rows.ids

    @property
    def nbytes(self) -> int:
        # Spare capacity counts; ids are counted roughly (their str objects).
        rows = self._rows
        return int(rows.vectors.nbytes + rows.seqs.nbytes + 64 * len(rows.ids))

    def extended(
        self,
        seqs: npt.NDArray[np.int64],
        ids: list[str],
        vectors: npt.NDArray[np.float32],
        *,
        generation: int,
        resets: int,
    ) -> Matrix:
        """This matrix with rows appended (in place when it owns the spare capacity).

        Growth is geometric (a quarter more), so a cell that gains a memory per query copies
        its matrix rarely instead of on every append.
        """
        rows, count, added = self._rows, self.count, len(ids)
        need = count + added
        if rows.filled != count or need > len(rows.seqs):
            capacity = max(need, count + count // 4 + 16)
            grown = _Rows(
                np.empty(capacity, dtype=np.int64),
                np.empty((capacity, rows.vectors.shape[1]), dtype=np.float32),
                rows.ids[:count],
                count,
            )
            grown.seqs[:count] = rows.seqs[:count]
            grown.vectors[:count] = rows.vectors[:count]
            rows = grown
        rows.seqs[count:need] = seqs
        rows.vectors[count:need] = vectors
        del rows.ids[count:]
        rows.ids.extend(ids)
        rows.filled = need
        return Matrix(generation, resets, need, rows)

    def scores(self, query: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Every row's cosine with ``query``."""
        # einsum, not ``@``: BLAS would score this on all its threads, and their spin-waiting
        # starves the SQLite worker thread the same query needs next (measured: a 10,000-row
        # cell took 46 ms through the store with two BLAS threads, 2 ms with einsum).
        scores: npt.NDArray[np.float32] = np.einsum("ij,j->i", self.vectors, query)
        return scores

    def top(self, query: npt.NDArray[np.float32], limit: int) -> list[tuple[int, float]]:
        """The ``limit`` best rows as ``(row, score)``: by score, ties by id (exact)."""
        return self.best(self.scores(query), limit) if self.count else []

    def best(self, scores: npt.NDArray[Any], limit: int) -> list[tuple[int, float]]:
        """The ``limit`` rows of the best ``scores`` (one per row), ties by id (exact)."""
        count = self.count
        if count > limit:
            kth = np.partition(scores, count - limit)[count - limit]
            # Everything strictly better is in; rows tied with the k-th compete by id, so the
            # boundary is decided exactly as a full sort would decide it.
            chosen = np.flatnonzero(scores >= kth)
        else:
            chosen = np.arange(count)
        order = sorted(chosen.tolist(), key=lambda i: (-float(scores[i]), self.ids[i]))
        return [(i, float(scores[i])) for i in order[:limit]]


@attrs.define(eq=False)
class VectorCache:
    """The matrices of recently queried cells, rebuilt when their generation moves."""

    db: Database
    budget_bytes: int = DEFAULT_CACHE_BYTES
    # Each matrix with the bytes it was charged when kept (storage may grow under it later).
    _matrices: OrderedDict[_Key, tuple[Matrix, int]] = attrs.field(factory=OrderedDict, init=False)
    _held: int = attrs.field(default=0, init=False)
    # Each word index with the matrix it indexes and the bytes it was charged when kept.
    _words: OrderedDict[_Key, tuple[Matrix, WordIndex, int]] = attrs.field(
        factory=OrderedDict, init=False
    )
    _held_words: int = attrs.field(default=0, init=False)

    @property
    def held_bytes(self) -> int:
        """Bytes of the matrices held now (at most ``budget_bytes``)."""
        return self._held

    @property
    def held_word_bytes(self) -> int:
        """Bytes of the word indexes held now (at most :data:`WORD_CACHE_BYTES`)."""
        return self._held_words

    def clear(self) -> None:
        """Forget every matrix (on close)."""
        self._matrices.clear()
        self._words.clear()
        self._held = 0
        self._held_words = 0

    async def generation(self, principal: str, scope: str) -> tuple[int, int]:
        """The cell's ``(generation, resets)``: see the module's docstring."""
        rows = await self.db.fetch(
            "SELECT generation, resets FROM vector_generations WHERE principal = ? AND scope = ?",
            (principal, scope),
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    async def matrix(self, principal: str, scope: str, model: str, dimensions: int) -> Matrix:
        """The cell's current matrix: the cached one if its generation still holds."""
        key = (principal, scope, model)
        generation, resets = await self.generation(principal, scope)
        entry = self._matrices.get(key)
        cached = None if entry is None else entry[0]
        if cached is not None and cached.generation == generation and cached.resets == resets:
            self._matrices.move_to_end(key)
            return cached
        if cached is not None:
            self._drop(key)
        after = (
            -1 if cached is None or cached.resets != resets else int(cached.seqs.max(initial=-1))
        )
        seqs, ids, vectors = await self._load(principal, scope, model, dimensions, after)
        if after >= 0 and cached is not None:
            added = len(ids)
            built = cached.extended(
                seqs[:added], ids, vectors[:added], generation=generation, resets=resets
            )
        else:
            built = Matrix.of(seqs, ids, vectors, generation=generation, resets=resets)
        if built.nbytes <= self.budget_bytes:
            self._keep(key, built)
        return built

    async def _load(
        self, principal: str, scope: str, model: str, dimensions: int, after: int
    ) -> tuple[npt.NDArray[np.int64], list[str], npt.NDArray[np.float32]]:
        """The cell's memories past seq ``after`` (-1: all), as :func:`_decode` gives them."""
        # A full load walks the cell's index; an append walks the seq range past ``after``
        # (the unary ``+`` keeps SQLite off the cell's index, which would visit every row of
        # the cell to find the few new ones). Both filter by principal and scope.
        cell = (
            "m.principal = ? AND m.scope = ?" if after < 0 else "+m.principal = ? AND +m.scope = ?"
        )
        rows = await self.db.fetch(
            "SELECT m.seq, m.id, e.vector "
            "FROM memories AS m JOIN embeddings AS e ON e.memory_seq = m.seq "
            f"WHERE {cell} AND e.model = ? AND m.seq > ?",
            (principal, scope, model, after),
        )
        if len(rows) * dimensions < _OFF_LOOP_FLOATS:
            return _decode(rows, dimensions)
        return await anyio.to_thread.run_sync(_decode, rows, dimensions,
                                             limiter=memory_threads())

    def _keep(self, key: _Key, matrix: Matrix) -> None:
        if key in self._matrices:  # two searches of one cell built it at once: keep the last
            self._drop(key)
        charged = matrix.nbytes
        self._matrices[key] = (matrix, charged)
        self._held += charged
        while self._held > self.budget_bytes:
            oldest = next(iter(self._matrices))
            self._drop(oldest, words=True)

    def _drop(self, key: _Key, *, words: bool = False) -> None:
        """Forget the cell's matrix; with ``words`` its word index too (a matrix refreshed
        keeps it: the next word search extends it by the appended rows)."""
        _, charged = self._matrices.pop(key)
        if words:
            self._drop_words(key)
        self._held -= charged

    def _keep_words(self, key: _Key, matrix: Matrix, index: WordIndex) -> None:
        """Keep ``index`` as the cell's word index, then drop the least recently used ones
        while they hold more than :data:`WORD_CACHE_BYTES`. A running total, so keeping one
        costs the same however many are kept."""
        self._drop_words(key)
        charged = index.nbytes
        self._words[key] = (matrix, index, charged)
        self._held_words += charged
        while self._held_words > WORD_CACHE_BYTES:
            self._drop_words(next(iter(self._words)))

    def _drop_words(self, key: _Key) -> None:
        entry = self._words.pop(key, None)
        if entry is not None:
            self._held_words -= entry[2]

    async def search(
        self,
        query: npt.NDArray[np.float32],
        *,
        principal: str,
        scope: str,
        model: str,
        dimensions: int,
        limit: int,
        words: tuple[WordQuery, WordVectors] | None = None,
    ) -> list[Evidence]:
        """The ``limit`` memories of the cell closest to ``query`` (best first, ties by id);
        with ``words``, by the mix of cosine and word score (:mod:`.words`)."""
        matrix = await self.matrix(principal, scope, model, dimensions)
        index = None
        if words is not None and 0 < matrix.count <= MAX_WORD_MEMORIES:
            index = await self._word_index((principal, scope, model), matrix, words[1])
        if index is not None and words is not None:
            asked, vectors = words
            word_index = index

            def scored() -> list[tuple[int, float]]:
                # It embeds the query's new words, so it runs off the loop, like every embedding;
                # safe there: the index and the matrix's rows never change.
                mix = mixed(matrix.scores(query), word_index.scores(asked, vectors), asked.share)
                return matrix.best(mix, limit)

            best = await anyio.to_thread.run_sync(scored, limiter=memory_threads())
        elif matrix.count * dimensions < _OFF_LOOP_FLOATS:
            best = matrix.top(query, limit)
        else:  # safe off the loop: appends only ever write past this matrix's rows
            best = await anyio.to_thread.run_sync(matrix.top, query, limit,
                                                  limiter=memory_threads())
        if not best:
            return []
        wanted = [int(matrix.seqs[i]) for i, _ in best]
        rows = await self._rows(f"{MEMORY_COLUMNS}, m.seq", wanted, principal, scope)
        by_seq = {int(row[6]): row for row in rows}
        return [
            memory_evidence(by_seq[seq], score=score, arm="semantic")
            for seq, (_, score) in zip(wanted, best, strict=True)
            if seq in by_seq
        ]

    async def _rows(self, columns: str, seqs: list[int], principal: str, scope: str) -> list[Row]:
        """``columns`` of the memories ``seqs`` (any order), read back under the cell's
        principal and scope filter: a matrix can never lend a row of another cell, even if a
        row moved since the matrix was built."""
        # CROSS JOIN keeps the plan on the primary key: driven by the cell's index instead,
        # SQLite would walk every row of the cell to find these few.
        return await self.db.fetch(
            f"SELECT {columns} FROM json_each(?) AS wanted "
            "CROSS JOIN memories AS m ON m.seq = wanted.value "
            "WHERE m.principal = ? AND m.scope = ?",
            ("[" + ",".join(map(str, seqs)) + "]", principal, scope),
        )

    async def _word_index(self, key: _Key, matrix: Matrix, vectors: WordVectors) -> WordIndex:
        """The word index of ``matrix``'s rows: the kept one, that one extended by the rows
        appended since, or one built from their texts."""
        entry = self._words.get(key)
        if entry is not None and entry[0] is matrix:
            self._words.move_to_end(key)
            return entry[1]
        base: WordIndex | None = None
        if entry is not None:
            older, index, _ = entry
            if older.resets == matrix.resets and older.count <= matrix.count \
                    and np.array_equal(matrix.seqs[: older.count], older.seqs):
                base = index  # the matrix only grew: index the new rows alone
        seqs = [int(seq) for seq in matrix.seqs[0 if base is None else base.count:]]
        rows = await self._rows("m.seq, m.text", seqs, key[0], key[1])
        texts = {int(row[0]): str(row[1]) for row in rows}
        ordered = [texts.get(seq, "") for seq in seqs]
        # In a worker thread: it embeds the words of the cell that were never seen.
        if base is None:
            index = await anyio.to_thread.run_sync(WordIndex.build, ordered, vectors,
                                                   limiter=memory_threads())
        else:
            index = await anyio.to_thread.run_sync(base.extended, ordered, vectors,
                                                   limiter=memory_threads())
        kept = self._matrices.get(key)
        if kept is not None and kept[0] is matrix:  # a matrix too big to keep keeps no index
            self._keep_words(key, matrix, index)
        return index
