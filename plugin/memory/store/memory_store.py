"""The store as its callers see it: one object that opens, writes and reads.

:class:`MemoryStore` holds no SQL of its own: it owns the connection's lifetime and hands each
call to the part that answers it (:mod:`.database`, :mod:`.writes`, :mod:`.lookups`,
:mod:`.search`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from types import TracebackType

import numpy.typing as npt

from ...control import validate
from ...control.clock import Clock, SystemClock, finite_clock
from ...control.dsn import is_connection_string
from ...control.dsn_text import uri_problem
from ...errors import InvalidArgumentTypeError
from ..embedding import EmbeddingAdapter, is_embedding_adapter
from .database import Database
from .errors import InvalidMemoryError, MemoryStorePathError
from .lookups import Lookups
from .search import Search
from .values import Evidence, MemoryRecord, MemoryWrite, Person, check_count, check_key
from .vectors import DEFAULT_CACHE_BYTES, VectorCache
from .words import WordQuery
from .writes import Writer

__all__ = ["MemoryStore"]


class MemoryStore:
    """An embedded memory store: ``async with MemoryStore(path) as store``.

    Write memories with :meth:`remember` (an upsert by id), delete them with :meth:`forget`,
    list them with :meth:`memories`, import a batch with :meth:`remember_many`. Corrections
    (:meth:`add_correction`) and People (:meth:`add_person`, :meth:`add_belief`) have their
    own writes. :meth:`add_memories` is for seeding with your own ids and times.

    ``embedding`` enables the semantic arm (vectors are computed on write, in a worker thread);
    ``clock`` supplies ``created_at`` when a write does not give one (default: the system
    clock; a reading that is not a finite number raises
    :class:`~plugin.errors.InvalidArgumentError` and writes nothing). ``timeout`` is SQLite's
    busy timeout in seconds. ``vector_cache_bytes`` bounds the memory of the semantic arm's
    cached matrices (0: never cache; see :mod:`.vectors`). Opening creates the schema and
    switches the file to WAL, and migrates a file of an older schema version in place (see
    :mod:`.schema`); ``":memory:"`` gives a private in-memory store.

    Failures raise :class:`~plugin.errors.MemoryStoreError` subclasses: a missing folder
    :class:`MemoryStorePathError`, a damaged or foreign file :class:`MemoryStoreCorruptError`,
    a lock held too long :class:`MemoryStoreLockedError`. Hostile text in a read never raises.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        embedding: EmbeddingAdapter | None = None,
        clock: Clock | None = None,
        timeout: float = 5.0,
        vector_cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        if (
            isinstance(vector_cache_bytes, bool)
            or not isinstance(vector_cache_bytes, int)
            or vector_cache_bytes < 0
        ):
            raise InvalidMemoryError(
                f"vector_cache_bytes must be an int >= 0, got {vector_cache_bytes!r}"
            )
        timeout = validate.seconds(timeout, field="MemoryStore timeout", maximum=86_400.0,
                                   allow_zero=True)
        if embedding is not None and not is_embedding_adapter(embedding):
            raise InvalidArgumentTypeError(
                f"MemoryStore embedding must be an embedding adapter (embed, count_tokens, "
                f"name, token_limit, dimensions), got {type(embedding).__name__}")
        location = os.fspath(path)
        if isinstance(location, str) and is_connection_string(location):
            # Not echoed: a Path folds a URI's "//", which the redaction would not recognise.
            raise MemoryStorePathError(
                "the memory store's location is a connection string; the store is a SQLite "
                "file: give its path")
        problem = uri_problem(location) if isinstance(location, str) else None
        if problem is not None:
            raise MemoryStorePathError(f"memory store {location!r} {problem}")
        self._db = Database(location, timeout)
        self._vectors = VectorCache(self._db, vector_cache_bytes)
        self._embedding = embedding
        # Every reading checked: a glitch (inf, nan, not a number) is refused, never stored.
        self._writer = Writer(
            self._db, embedding, SystemClock() if clock is None else finite_clock(clock)
        )
        self._lookups = Lookups(self._db)
        self._search = Search(self._db, embedding, self._vectors)

    @property
    def path(self) -> str:
        return self._db.path

    @property
    def embedding(self) -> EmbeddingAdapter | None:
        """The adapter of the semantic arm, or None when the store has none."""
        return self._embedding

    @property
    def cached_vector_bytes(self) -> int:
        """Bytes the semantic arm's cached matrices hold now (at most ``vector_cache_bytes``)."""
        return self._vectors.held_bytes

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> MemoryStore:
        await self._db.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; idempotent."""
        self._vectors.clear()
        await self._db.close()

    # -- memories you manage -------------------------------------------------------------------

    async def remember(
        self, text: str, *, principal: str, scope: str, id: str | None = None
    ) -> str:
        """Store ``text`` as a memory of this principal and scope and return its id.

        ``id`` None stores a new memory under a generated id; an id this principal and scope
        already hold is replaced (its text, its time and its vectors: an upsert). The memory's
        time is the store's clock (a replaced memory's never goes back, so a listing under way
        meets it once whatever the clock does). An id another principal or scope holds raises
        :class:`MemoryOwnershipError`; empty, oversized or invalid text, or a malformed id,
        raises :class:`InvalidMemoryError`. Either way nothing is written.
        """
        written = await self.remember_many(
            [MemoryWrite(text=text, principal=principal, scope=scope, id=id)]
        )
        return written[0]

    async def remember_many(self, memories: Iterable[MemoryWrite]) -> list[str]:
        """Remember every one of ``memories`` in one transaction, or none of them.

        Returns their ids in order. An id repeated within the batch is
        :class:`InvalidMemoryError`; an id held by another principal or scope is
        :class:`MemoryOwnershipError` (its ``id`` names it). With an embedding adapter the
        vectors are computed first, in a worker thread.
        """
        return await self._writer.remember(memories)

    async def forget(self, id: str, *, principal: str, scope: str) -> bool:
        """Delete the memory ``id`` of this principal and scope; whether it was there.

        In the same transaction the memory leaves the full-text index and its vectors are
        deleted, and the semantic arm's cache key moves, so no arm of any store object or
        process returns it again. Another principal's or scope's id is simply not there.
        """
        return await self._writer.forget(id, principal=principal, scope=scope)

    async def memories(
        self, *, principal: str, scope: str, page: int = 256
    ) -> AsyncIterator[Evidence]:
        """Every memory of one principal and scope, newest first (a tie on ``created_at``: the
        later write first, so two memories written within one clock reading list as written).

        Read ``page`` at a time: a write made while iterating may or may not be seen, but no
        memory is yielded twice. ``page`` is an int from 1 to 2**63 - 1, else ``ValueError``.
        """
        for field, value in (("principal", principal), ("scope", scope)):
            check_key(value, field)
        page = check_count(page, "page", least=1)
        after: tuple[float, int] | None = None
        while True:
            found, after = await self._lookups.memories_page(
                principal=principal, scope=scope, after=after, limit=page
            )
            for memory in found:
                yield memory
            if len(found) < page:
                return

    # -- writes ---------------------------------------------------------------------------------

    async def add_memory(
        self,
        id: str,
        text: str,
        *,
        principal: str,
        scope: str,
        created_at: float | None = None,
        cites: Iterable[str] = (),
    ) -> None:
        """Store one memory with this id and time, never replacing one (see
        :meth:`add_memories`); to write or update a memory, use :meth:`remember`."""
        await self.add_memories(
            [
                MemoryRecord(
                    id=id,
                    text=text,
                    principal=principal,
                    scope=scope,
                    created_at=created_at,
                    cites=tuple(cites),
                )
            ]
        )

    async def add_memories(self, memories: Iterable[MemoryRecord]) -> int:
        """Store ``memories`` in one transaction and return how many were stored.

        For seeding: each keeps its own id, ``created_at`` (the store's clock when None) and
        cited sources, and an existing id is an error, never replaced. To write or update
        memories, use :meth:`remember` and :meth:`remember_many`.

        With an embedding adapter, their vectors are computed first, in a worker thread. An id
        already stored for the same principal and scope (or repeated in the batch) raises
        :class:`MemoryConflictError` and stores nothing.
        """
        return await self._writer.add_memories(memories)

    async def embed_missing(self, *, batch: int = 256) -> int:
        """Compute vectors for stored memories that have none for this store's adapter.

        For a store filled before an adapter was configured. ``batch`` memories (at least 1)
        are read, embedded and written at a time, each memory looked at once (another
        ``batch`` is a ``ValueError`` naming it). Returns how many were embedded (0 without
        an adapter).
        """
        return await self._writer.embed_missing(batch=batch)

    async def unembedded(self, *, probe: int | None = None) -> int:
        """How many stored memories have no vector for this store's adapter (0 without one):
        the semantic arm does not see them until :meth:`embed_missing` computes them (a
        store filled while another model, or none, was configured).

        Every memory is checked (a read of every memory's vector key: about 0.4 s for
        100,000), unless ``probe`` (an int, 0 or more) is given: then only the ``probe``
        oldest and newest memories are, which is what opening the hooks does (a model switch
        leaves the oldest without vectors, a write without a model the newest). Another
        ``probe`` is a ``ValueError`` naming it.
        """
        return await self._writer.unembedded(probe=probe)

    async def add_person(self, name: str, *, principal: str, scope: str) -> None:
        """Make ``name`` a known person for this principal and scope; idempotent."""
        await self._writer.add_person(name, principal=principal, scope=scope)

    async def add_belief(
        self,
        id: str,
        person: str,
        text: str,
        *,
        principal: str,
        scope: str,
        created_at: float | None = None,
    ) -> None:
        """Store a belief held by ``person`` (who becomes a known person if not one yet)."""
        await self._writer.add_belief(
            id, person, text, principal=principal, scope=scope, created_at=created_at
        )

    async def add_correction(
        self,
        id: str,
        text: str,
        *,
        principal: str,
        scope: str,
        created_at: float | None = None,
        supersedes: Iterable[str] = (),
    ) -> None:
        """Store an active correction notice; those it ``supersedes`` stop being current."""
        await self._writer.add_correction(
            id,
            text,
            principal=principal,
            scope=scope,
            created_at=created_at,
            supersedes=supersedes,
        )

    async def add_source(
        self,
        id: str,
        text: str,
        *,
        principal: str,
        scope: str,
        created_at: float | None = None,
    ) -> None:
        """Store a source document that memories may cite."""
        await self._writer.add_source(
            id, text, principal=principal, scope=scope, created_at=created_at
        )

    # -- search ---------------------------------------------------------------------------------

    async def sparse_candidates(
        self, query: str, *, principal: str, scope: str, limit: int
    ) -> list[Evidence]:
        """Memories matching any word of ``query`` by bm25, best first (ties: oldest row first).

        Terms are stemmed (:data:`~plugin.memory.fts.TOKENIZER`), and bm25's statistics are
        this principal's and scope's memories alone: no other cell's rows change the order.

        ``query`` is user text, never FTS5 syntax: it goes through
        :func:`~plugin.memory.fts.fts5_match_expression`. When that leaves no term the arm does
        not run and the result is empty (callers that must report "reserved, not executed"
        check ``fts5_match_expression(query) is None`` first). Never raises on any ``str``.
        """
        return await self._search.sparse_candidates(
            query, principal=principal, scope=scope, limit=limit
        )

    async def semantic_candidates(
        self, vector: npt.ArrayLike, *, principal: str, scope: str, limit: int,
        words: WordQuery | None = None,
    ) -> list[Evidence]:
        """Memories by cosine similarity to ``vector`` (best first, ties by id).

        ``vector`` is a query embedding from this store's adapter (L2-normalised, of its
        dimensions; else ``ValueError``). Without an adapter the result is empty. With
        ``words`` and an adapter whose single words can be compared (``word_level``), by the
        mix of the cosine and the query words' best matches in each memory
        (:mod:`plugin.memory.store.words`).
        """
        return await self._search.semantic_candidates(
            vector, principal=principal, scope=scope, limit=limit, words=words
        )

    # -- lookups --------------------------------------------------------------------------------

    async def recent_candidates(self, *, principal: str, scope: str, limit: int) -> list[Evidence]:
        """The newest memories first (ties by id)."""
        return await self._lookups.recent_candidates(principal=principal, scope=scope, limit=limit)

    async def adjacent_memories(
        self, created_at: float, id: str, *, principal: str, scope: str, window_s: float
    ) -> list[Evidence]:
        """The memories written just before and just after ``created_at`` (the turns around
        one turn of a conversation): each only when at most ``window_s`` seconds away and not
        at the same instant (a batch written at once is not a conversation); never ``id``."""
        return await self._lookups.adjacent_memories(
            created_at, id, principal=principal, scope=scope, window_s=window_s
        )

    async def get_memories(
        self, ids: Iterable[str], *, principal: str, scope: str
    ) -> list[Evidence]:
        """The memories with these ids that this principal may see in this scope.

        In the order of ``ids`` (repeats once); unknown, foreign and unencodable ids are left
        out. Used to re-validate evidence a run already retained.
        """
        return await self._lookups.get_memories(ids, principal=principal, scope=scope)

    async def get_evidence(
        self, ids: Iterable[str], *, principal: str, scope: str
    ) -> list[Evidence]:
        """The memories, beliefs and sources with these ids that this principal may see in
        this scope (a memory first where ids collide), in the order of ``ids`` (repeats once).
        How evidence a run retained is re-read, whatever kind it was."""
        return await self._lookups.get_evidence(ids, principal=principal, scope=scope)

    async def discover_people(self, text: str, *, principal: str, scope: str) -> list[Person]:
        """Known people whose name occurs in ``text`` as a whole word, in order of appearance.

        Case-insensitive (NFKC and case folding on both sides); only the first
        :data:`~plugin.memory.terms.MAX_SCAN_CHARS` characters of ``text`` are scanned.
        """
        return await self._lookups.discover_people(text, principal=principal, scope=scope)

    async def beliefs_of(
        self, person: str, *, principal: str, scope: str, limit: int
    ) -> list[Evidence]:
        """The beliefs held by ``person`` (matched case-insensitively), newest first."""
        return await self._lookups.beliefs_of(person, principal=principal, scope=scope, limit=limit)

    async def current_corrections(
        self, *, principal: str, scope: str, limit: int | None = None
    ) -> list[Evidence]:
        """Active (not superseded) correction notices, newest first (ties by id)."""
        return await self._lookups.current_corrections(
            principal=principal, scope=scope, limit=limit
        )

    async def read_source(self, source_id: str, *, principal: str, scope: str) -> Evidence | None:
        """The source ``source_id`` if this principal may see it in this scope, else None."""
        return await self._lookups.read_source(source_id, principal=principal, scope=scope)
