"""A retriever over a LangGraph ``BaseStore`` (extra ``langgraph-store``).

LangGraph's long-term memory is a ``BaseStore``: JSON values under a key, in a namespace (a
tuple of labels). :func:`langgraph_store_retriever` searches the run's own namespace, mapped
from the trusted principal and scope::

    (*prefix, principal_label, scope_label)     # prefix defaults to ("memories",)

Each of principal and scope becomes one label, with ``%`` and ``.`` percent-encoded (LangGraph
refuses a ``.`` in a label): :func:`memory_namespace` gives the namespace to ``put`` a user's
memories in. A search is ``store.asearch(namespace, query=text, limit=limit)`` (semantic when
the store was built with an index, otherwise the store's own order); a memory's text is
``value[text_key]`` (the whole value as JSON when that is not a string). Any store works:
``InMemoryStore``, and LangGraph's PostgreSQL store (``langgraph-checkpoint-postgres``). An
``InMemoryStore`` built with an index embeds a query through asyncio's own loop, so off asyncio
(trio) its synchronous ``search`` runs in a worker thread instead, left at the deadline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import sniffio

from .simple import SearchRequest, SimpleRetriever
from .store import Evidence
from .threads import memory_threads

if TYPE_CHECKING:
    from langgraph.store.base import BaseStore, Item

DEFAULT_PREFIX = ("memories",)


def _label(value: str) -> str:
    return value.replace("%", "%25").replace(".", "%2E")


def _unlabel(label: str) -> str:
    return label.replace("%2E", ".").replace("%25", "%")


def memory_namespace(
    principal: str, scope: str, prefix: Sequence[str] = DEFAULT_PREFIX
) -> tuple[str, ...]:
    """The namespace holding ``principal``'s memories in ``scope`` (see the module docstring)."""
    if not principal or not scope:
        raise ValueError("memory_namespace needs a non-empty principal and scope")
    return (*prefix, _label(principal), _label(scope))


def _evidence(item: Item, prefix: tuple[str, ...], text_key: str) -> Evidence:
    value: Any = item.value
    text = value.get(text_key) if isinstance(value, dict) else None
    if not isinstance(text, str):
        text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    namespace = tuple(item.namespace)
    owner = namespace[len(prefix):len(prefix) + 2]
    if namespace[:len(prefix)] == prefix and len(owner) == 2:
        principal, scope = _unlabel(owner[0]), _unlabel(owner[1])
    else:  # not under the prefix: nobody's, so the hooks drop it
        principal, scope = "", ""
    score = getattr(item, "score", None)
    return Evidence(
        id=item.key, text=text, arm="langgraph",
        score=float(score) if isinstance(score, (int, float)) and math.isfinite(score) else 0.0,
        principal=principal, scope=scope, created_at=item.created_at.timestamp(),
    )


def _embeds_on_asyncio(store: BaseStore) -> bool:
    """Whether ``store`` is an ``InMemoryStore`` with an index: its ``asearch`` embeds the
    query through asyncio's own loop, while its ``search`` embeds in threads of its own."""
    from langgraph.store.memory import InMemoryStore

    return isinstance(store, InMemoryStore) and bool(store.index_config)


def langgraph_store_retriever(
    store: BaseStore, *, prefix: Sequence[str] = DEFAULT_PREFIX, text_key: str = "text"
) -> SimpleRetriever:
    """A :class:`~plugin.SimpleRetriever` over ``store`` (see the module docstring).

    Retained evidence is re-read with ``store.aget`` in the run's namespace. Every item
    carries the principal and scope of the namespace it came from, so an item a store returns
    from outside the run's namespace is dropped by the hooks.
    """
    base = tuple(prefix)
    threaded = _embeds_on_asyncio(store)

    async def search(request: SearchRequest) -> list[Evidence]:
        namespace = memory_namespace(request.principal, request.scope, base)
        if threaded and sniffio.current_async_library() != "asyncio":
            # Off asyncio, its synchronous search in a worker thread, left at the deadline.
            found = await anyio.to_thread.run_sync(
                partial(store.search, namespace, query=request.text, limit=request.limit),
                abandon_on_cancel=True, limiter=memory_threads(store),
            )
        else:
            found = await store.asearch(namespace, query=request.text, limit=request.limit)
        return [_evidence(item, base, text_key) for item in found]

    async def get(evidence_id: str, *, principal: str, scope: str) -> Evidence | None:
        item = await store.aget(memory_namespace(principal, scope, base), evidence_id)
        return None if item is None else _evidence(item, base, text_key)

    return SimpleRetriever(search, get=get)
