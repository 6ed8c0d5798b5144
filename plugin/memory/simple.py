"""SimpleRetriever: bring your own memory with one async search function.

``SimpleRetriever(search)`` is a whole :class:`~plugin.memory.protocol.Retriever`. The hooks
call ``search`` inside a slot they took, with a :class:`SearchRequest`: the planned query text,
its embedding when the semantic arm prepared one, the trusted principal and scope, the result
limit and the seconds left. It returns an iterable of :class:`~plugin.memory.store.Evidence`
(``Evidence(id=..., text=...)`` is enough), best first: a list, a tuple, or a lazy iterable,
which is read only up to the context caps (a lazy iterable of corrections, up to its first
:data:`LAZY_CORRECTIONS`). Beliefs and People have honest defaults
(none: no People are known, so no belief read is reserved); corrections come from the optional
``corrections`` function; retained evidence is re-read by id through the optional ``get``,
and without it reads as gone.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, cast

import attrs

from plugin.errors import RetrieverFailedError, RetrieverProtocolError

from .embedding import Vector
from .preparation import PreparedRecall
from .protocol import CORRECTIONS_EXAMINED, AttemptHandle, ContextCaps, Found, is_async_callable
from .query import RecallQuery
from .store import Evidence


@attrs.frozen(kw_only=True)
class SearchRequest:
    """What one search asks of a :class:`SimpleRetriever`'s search function."""

    text: str
    """The planned query text (the one the ledger's trace fingerprints)."""
    embedding: Vector | None = attrs.field(eq=False, repr=False)
    """The query's embedding (read-only float32) when the semantic arm prepared one."""
    principal: str
    """The run's trusted principal: search only this principal's memories."""
    scope: str
    """The run's trusted scope."""
    limit: int
    """The most evidence items worth returning (the context caps render at most this many)."""
    query: RecallQuery = attrs.field(eq=False, repr=False)
    """The whole planned query (fragments, strategy, fingerprint), for backends that use it."""
    _seconds_left: Callable[[], float] = attrs.field(eq=False, repr=False, alias="seconds_left")

    def seconds_left(self) -> float:
        """Seconds until the attempt's deadline (0 once it ended)."""
        return self._seconds_left()


Search = Callable[[SearchRequest], Awaitable[Iterable[Evidence]]]
Get = Callable[..., Awaitable["Evidence | None"]]
"""``async def get(evidence_id, *, principal, scope) -> Evidence | None``."""
Corrections = Callable[..., Awaitable[Iterable[Evidence]]]
"""``async def corrections(*, principal, scope) -> Iterable[Evidence]``."""


def _async(name: str) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is None and name != "search":
            return
        if not callable(value) or not is_async_callable(value):
            raise RetrieverProtocolError(
                f"SimpleRetriever's {name} must be an async function (async def), "
                f"got {type(value).__name__}"
            )

    return check


LAZY_CORRECTIONS = CORRECTIONS_EXAMINED + 1
"""The most items read from a lazy iterable of corrections (a list or a tuple is kept whole):
those the hooks examine and one more, which tells that more were left out."""


def _close(value: object) -> None:
    """Close a coroutine a function returned where its evidence belongs (an ``await`` left
    out): it never runs, and Python does not warn later, after the host's run, that it was
    never awaited."""
    if inspect.iscoroutine(value):
        value.close()


def _items(value: object, *, limit: int) -> tuple[Evidence, ...]:
    """A function's iterable of evidence, as a tuple (the hooks check every item they examine).

    A list or a tuple is kept whole (it is already in memory, and its length is what the caps
    count as left out). Anything else is read lazily, at most ``limit`` items, so a generator
    with no end costs what its first ``limit`` items do. A coroutine among the first ``limit``
    items (``[fetch(i) for i in ids]``, an ``await`` left out) is closed; the hooks refuse it
    as malformed evidence."""
    if value is None or isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        _close(value)
        raise RetrieverFailedError("bad_result")
    if type(value) in (list, tuple):
        found = tuple(value)
        examined = found[:limit]
    else:
        found = examined = tuple(itertools.islice(value, limit))
    for item in examined:
        _close(item)
    return found


@attrs.define(eq=False)
class SimpleRetriever:
    """A :class:`~plugin.memory.protocol.Retriever` around one async search function.

    ``search(request)`` is required; ``get`` and ``corrections`` are optional. Each must be
    ``async def``: anything else raises :class:`~plugin.errors.RetrieverProtocolError` (a
    ``TypeError``) here, naming it.
    """

    search_fn: Search = attrs.field(validator=_async("search"), alias="search")
    get: Get | None = attrs.field(default=None, kw_only=True, validator=_async("get"))
    corrections_fn: Corrections | None = attrs.field(
        default=None, kw_only=True, validator=_async("corrections"), alias="corrections"
    )

    def searchable(self, prepared: PreparedRecall) -> bool:
        return bool(prepared.query.text.strip())

    async def named_people(self, prepared: PreparedRecall) -> tuple[str, ...]:
        return ()

    async def search(
        self,
        prepared: PreparedRecall,
        handle: AttemptHandle,
        *,
        caps: ContextCaps,
        nested_beliefs: bool,
    ) -> Found:
        query = prepared.query
        if query.principal is None or query.scope is None:
            raise ValueError("a search needs the trusted principal and scope of the run")
        request = SearchRequest(
            text=query.text, embedding=prepared.semantic.vector, principal=query.principal,
            scope=query.scope, limit=caps.max_items, query=query,
            seconds_left=handle.seconds_left,
        )
        # One item past the examined ones tells the caps that more were left out.
        found = _items(await self.search_fn(request), limit=caps.examined + 1)
        return Found(evidence=found, arms=("retriever",))

    async def read_beliefs(
        self,
        people: Sequence[str],
        handle: AttemptHandle,
        *,
        principal: str,
        scope: str,
        caps: ContextCaps,
    ) -> tuple[Evidence, ...]:
        return ()

    async def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:
        if self.corrections_fn is None:
            return ()
        return _items(await self.corrections_fn(principal=principal, scope=scope),
                      limit=LAZY_CORRECTIONS)

    async def revalidate(
        self, ids: Sequence[str], *, principal: str, scope: str
    ) -> tuple[Evidence, ...]:
        if self.get is None:  # nothing to re-read with: never claim the items are gone
            raise RetrieverFailedError("cannot_reread")
        found: list[Evidence] = []
        for evidence_id in ids:
            item = await self.get(evidence_id, principal=principal, scope=scope)
            if inspect.iscoroutine(cast(object, item)):  # an ``await`` left out
                _close(item)
                raise RetrieverFailedError("bad_evidence")
            if item is not None:
                found.append(item)
        return tuple(found)
