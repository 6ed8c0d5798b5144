"""How the store answers reads by key or by time: recent memories, memories by id, known
People, beliefs, current corrections and sources. Every read filters by the trusted principal
and scope in SQL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Literal

import attrs

from ..terms import MAX_SCAN_CHARS
from .database import Database
from .schema import MEMORY_COLUMNS, memory_evidence, plain_evidence
from .values import Evidence, Person, check_limit, encodable, person_key, visible

__all__ = ["Lookups"]


_PAGE = (f"SELECT {MEMORY_COLUMNS}, m.seq FROM memories AS m "
         "WHERE m.principal = ? AND m.scope = ? {after}"
         "ORDER BY m.created_at DESC, m.seq DESC LIMIT ?")
FIRST_PAGE = _PAGE.format(after="")
"""A cell's first page of memories, newest first (a tie: the later write first)."""
NEXT_PAGE = (
    "SELECT * FROM (" + _PAGE.format(after="AND m.created_at = ? AND m.seq < ? ") + ") "
    "UNION ALL SELECT * FROM (" + _PAGE.format(after="AND m.created_at < ? ") + ") "
    "ORDER BY 5 DESC, 7 DESC LIMIT ?"
)
"""The page after a ``(created_at, seq)`` key: the rest of that time's tie, then the earlier
times, each one range of the ``memories_listing`` index, so a page costs the same however deep
into a large cell (or into a batch written at one clock reading) it starts. Its parameters:
:func:`next_page`."""


def next_page(principal: str, scope: str, after: tuple[float, int],
              limit: int) -> tuple[str | float | int, ...]:
    """:data:`NEXT_PAGE`'s parameters."""
    return (principal, scope, after[0], after[1], limit, principal, scope, after[0], limit,
            limit)


@attrs.define(eq=False)
class Lookups:
    """The store's non-search reads (see :class:`~plugin.memory.store.MemoryStore`)."""

    db: Database

    async def recent_candidates(self, *, principal: str, scope: str, limit: int) -> list[Evidence]:
        limit = check_limit(limit)
        if limit == 0 or not visible(principal, scope):
            return []
        rows = await self.db.fetch(
            f"SELECT {MEMORY_COLUMNS} FROM memories AS m "
            "WHERE m.principal = ? AND m.scope = ? ORDER BY m.created_at DESC, m.id LIMIT ?",
            (principal, scope, limit),
        )
        return [memory_evidence(row, score=float(row[4]), arm="recent") for row in rows]

    async def adjacent_memories(
        self, created_at: float, id: str, *, principal: str, scope: str, window_s: float
    ) -> list[Evidence]:
        """The memory written just before and the one written just after ``created_at``
        (the one before first; ties by id), each only when at most ``window_s`` seconds away
        and not at the same instant; never the memory ``id`` itself."""
        if not visible(principal, scope) or not window_s > 0:
            return []
        select = f"SELECT {MEMORY_COLUMNS} FROM memories AS m WHERE m.principal = ? AND m.scope = ?"
        rows = await self.db.fetch(
            f"SELECT * FROM ({select} AND m.created_at < ? AND m.created_at >= ? AND m.id != ? "
            "ORDER BY m.created_at DESC, m.id LIMIT 1) "
            f"UNION ALL SELECT * FROM ({select} AND m.created_at > ? AND m.created_at <= ? "
            "AND m.id != ? ORDER BY m.created_at, m.id LIMIT 1)",
            (principal, scope, created_at, created_at - window_s, id,
             principal, scope, created_at, created_at + window_s, id),
        )
        return [memory_evidence(row, score=float(row[4]), arm="lookup") for row in rows]

    async def memories_page(
        self, *, principal: str, scope: str, after: tuple[float, int] | None, limit: int
    ) -> tuple[list[Evidence], tuple[float, int] | None]:
        """One page of the cell's memories, newest first (a tie: the later write first), after
        ``after``; and the ``(created_at, write order)`` key the page ends on, to pass as the
        next page's ``after`` (None for an empty page)."""
        if not visible(principal, scope):
            return [], None
        if after is None:
            rows = await self.db.fetch(FIRST_PAGE, (principal, scope, limit))
        else:
            rows = await self.db.fetch(NEXT_PAGE, next_page(principal, scope, after, limit))
        last = (float(rows[-1][4]), int(rows[-1][6])) if rows else None
        return [memory_evidence(row, score=float(row[4]), arm="lookup") for row in rows], last

    async def get_memories(
        self, ids: Iterable[str], *, principal: str, scope: str
    ) -> list[Evidence]:
        wanted = _wanted(ids)
        if not wanted or not visible(principal, scope):
            return []
        rows = await self.db.fetch(
            f"SELECT {MEMORY_COLUMNS} FROM memories AS m "
            "WHERE m.principal = ? AND m.scope = ? "
            "AND m.id IN (SELECT value FROM json_each(?))",
            (principal, scope, json.dumps(wanted)),
        )
        by_id = {row[0]: row for row in rows}
        return [
            memory_evidence(by_id[memory_id], score=float(by_id[memory_id][4]), arm="lookup")
            for memory_id in wanted
            if memory_id in by_id
        ]

    async def get_evidence(
        self, ids: Iterable[str], *, principal: str, scope: str
    ) -> list[Evidence]:
        wanted = _wanted(ids)
        found = {item.id: item for item in
                 await self.get_memories(wanted, principal=principal, scope=scope)}
        rest = [evidence_id for evidence_id in wanted if evidence_id not in found]
        kinds: tuple[tuple[str, Literal["belief", "source"]], ...] = (
            ("beliefs", "belief"), ("sources", "source"))
        for table, kind in kinds:
            if not rest:
                break
            rows = await self.db.fetch(
                f"SELECT id, text, principal, scope, created_at FROM {table} "
                "WHERE principal = ? AND scope = ? AND id IN (SELECT value FROM json_each(?))",
                (principal, scope, json.dumps(rest)),
            )
            found.update((row[0], plain_evidence(row, kind=kind, arm=kind)) for row in rows)
            rest = [evidence_id for evidence_id in rest if evidence_id not in found]
        return [found[evidence_id] for evidence_id in wanted if evidence_id in found]

    async def discover_people(self, text: str, *, principal: str, scope: str) -> list[Person]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not visible(principal, scope):
            return []
        haystack = person_key(text[:MAX_SCAN_CHARS])
        if not haystack:
            return []
        words, marks = _name_starts(haystack)
        # A name the text holds starts where one of its words does (its first word is that
        # word) or at one of its other marks: an index range of the cell's names each, never
        # every name of the cell. What a range over-reads, the whole-word match leaves out.
        rows = await self.db.fetch(
            f"{_NAMES_FROM} json_each(?) AS w JOIN people AS p {_NAMES_ON} "
            "AND (length(p.key) = length(w.value) "
            "OR substr(p.key, length(w.value) + 1, 1) NOT GLOB '[0-9A-Za-z_]') "
            f"UNION {_NAMES_FROM} json_each(?) AS w JOIN people AS p {_NAMES_ON}",
            (json.dumps(words), principal, scope, json.dumps(marks), principal, scope),
        )
        found: list[tuple[int, str, str]] = []
        for key, name in rows:
            match = re.search(r"(?<!\w)" + re.escape(key) + r"(?!\w)", haystack)
            if match is not None:
                found.append((match.start(), key, name))
        found.sort()
        return [Person(name=name, principal=principal, scope=scope) for _, _, name in found]

    async def beliefs_of(
        self, person: str, *, principal: str, scope: str, limit: int
    ) -> list[Evidence]:
        limit = check_limit(limit)
        if not isinstance(person, str):
            raise TypeError(f"person must be a str, got {type(person).__name__}")
        if limit == 0 or not visible(principal, scope):
            return []
        rows = await self.db.fetch(
            "SELECT id, text, principal, scope, created_at FROM beliefs "
            "WHERE principal = ? AND scope = ? AND person_key = ? "
            "ORDER BY created_at DESC, id LIMIT ?",
            (principal, scope, person_key(person), limit),
        )
        return [plain_evidence(row, kind="belief", arm="belief") for row in rows]

    async def current_corrections(
        self, *, principal: str, scope: str, limit: int | None = None
    ) -> list[Evidence]:
        bound = -1 if limit is None else check_limit(limit)
        if bound == 0 or not visible(principal, scope):
            return []
        rows = await self.db.fetch(
            "SELECT id, text, principal, scope, created_at FROM corrections "
            "WHERE principal = ? AND scope = ? AND active = 1 "
            "ORDER BY created_at DESC, id LIMIT ?",
            (principal, scope, bound),
        )
        return [plain_evidence(row, kind="correction", arm="correction") for row in rows]

    async def read_source(self, source_id: str, *, principal: str, scope: str) -> Evidence | None:
        if not isinstance(source_id, str):
            raise TypeError(f"source_id must be a str, got {type(source_id).__name__}")
        if not visible(principal, scope) or not encodable(source_id):
            return None
        rows = await self.db.fetch(
            "SELECT id, text, principal, scope, created_at FROM sources "
            "WHERE principal = ? AND scope = ? AND id = ?",
            (principal, scope, source_id),
        )
        return plain_evidence(rows[0], kind="source", arm="source") if rows else None


def _wanted(ids: Iterable[str]) -> list[str]:
    """The ids asked for, in order, each once; one no store could hold is left out."""
    if isinstance(ids, str):
        raise TypeError("ids must be an iterable of ids, not a str")
    wanted: dict[str, None] = {}
    for evidence_id in ids:
        if not isinstance(evidence_id, str):
            raise TypeError(f"ids must be str, got {type(evidence_id).__name__}")
        if encodable(evidence_id):
            wanted.setdefault(evidence_id)
    return list(wanted)


_NAMES_FROM = "SELECT p.key, p.name FROM"
_NAMES_ON = ("ON p.principal = ? AND p.scope = ? "
             "AND p.key >= w.value AND p.key < w.value || char(1114111)")


def _name_starts(haystack: str) -> tuple[list[str], list[str]]:
    """Where a name may start in ``haystack``: its distinct words, and its distinct
    characters that are neither word characters nor spaces."""
    words = list(dict.fromkeys(re.findall(r"\w+", haystack)))
    marks = list(dict.fromkeys(re.findall(r"[^\w\s]", haystack)))
    return words, marks
