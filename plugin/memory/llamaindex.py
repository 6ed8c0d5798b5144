"""A retriever over any LlamaIndex ``BaseRetriever`` (extra ``llamaindex``).

LlamaIndex reaches the vector stores it supports (pgvector, Qdrant, Chroma, Pinecone, ...)
through one interface, ``BaseRetriever.aretrieve``. :func:`llamaindex_retriever` turns one
into a :class:`~plugin.SimpleRetriever`: the query text goes in as a ``QueryBundle``, each
``NodeWithScore`` comes back as evidence (id: the node id, text: its content, score: its score,
0.0 when it has none that is finite, arm: ``llamaindex``).

A LlamaIndex retriever knows nothing of principals. Either give a factory
``retriever_for(principal, scope)`` that builds one per tenant (for example
``index.as_retriever(filters=MetadataFilters(...))``), or tag every node with ``principal`` and
``scope`` metadata: a node whose metadata names another principal or scope is dropped by the
hooks, one without them is taken as the run's. LlamaIndex has no read by id, so retained
evidence cannot be re-read: a re-check is ``failed``, never ``gone``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from .simple import SearchRequest, SimpleRetriever
from .store import Evidence

if TYPE_CHECKING:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.schema import NodeWithScore

RetrieverFor = Callable[[str, str], "BaseRetriever"]


def _owner(metadata: object, key: str) -> str | None:
    value = metadata.get(key) if isinstance(metadata, dict) else None
    return None if value is None else str(value)


def _score(score: float | None) -> float:
    """A node's score, 0.0 when it has none or none that is finite (a cosine similarity over
    an all-zero embedding is NaN): the node itself is still evidence."""
    return float(score) if score is not None and math.isfinite(score) else 0.0


def _evidence(found: NodeWithScore, principal_key: str, scope_key: str) -> Evidence:
    node = found.node
    metadata = getattr(node, "metadata", None)
    return Evidence(
        id=str(node.node_id), text=str(node.get_content()), arm="llamaindex",
        score=_score(found.score),
        principal=_owner(metadata, principal_key), scope=_owner(metadata, scope_key),
    )


def llamaindex_retriever(
    retriever: BaseRetriever | RetrieverFor,
    *,
    principal_key: str = "principal",
    scope_key: str = "scope",
) -> SimpleRetriever:
    """A :class:`~plugin.SimpleRetriever` over a LlamaIndex retriever, or over a factory
    ``(principal, scope) -> BaseRetriever`` (see the module docstring)."""
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.schema import QueryBundle

    def pick(principal: str, scope: str) -> BaseRetriever:
        if isinstance(retriever, BaseRetriever):
            return retriever
        return retriever(principal, scope)

    async def search(request: SearchRequest) -> list[Evidence]:
        chosen = pick(request.principal, request.scope)
        found = await chosen.aretrieve(QueryBundle(query_str=request.text))
        return [_evidence(item, principal_key, scope_key) for item in found[: request.limit]]

    return SimpleRetriever(search)
