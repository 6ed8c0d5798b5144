"""What crosses a :class:`~plugin.memory.process.ProcessRetriever`'s pipe, in both directions:
a request's plain values, an answer rebuilt into evidence, and how much of an answer either side
reads (the caps first)."""

from __future__ import annotations

import math
from typing import Any

from plugin.errors import RetrieverFailedError

from .preparation import PreparedRecall
from .protocol import ContextCaps
from .simple import LAZY_CORRECTIONS
from .store import Evidence

_EVIDENCE_FIELDS = ("id", "text", "kind", "score", "arm", "principal", "scope", "created_at")


def _evidence(value: object) -> Evidence:
    if type(value) is not dict:
        raise RetrieverFailedError("bad_result")
    fields: dict[str, Any] = {name: value.get(name) for name in _EVIDENCE_FIELDS}
    cites = value.get("cites")
    if type(cites) is not list or not all(type(c) is str for c in cites):
        raise RetrieverFailedError("bad_evidence")
    for name in ("score", "created_at"):
        if type(fields[name]) not in (int, float) or not math.isfinite(fields[name]):
            raise RetrieverFailedError("bad_evidence")
        fields[name] = float(fields[name])
    try:
        return Evidence(cites=tuple(cites), **fields)
    except (TypeError, ValueError):
        raise RetrieverFailedError("bad_evidence") from None


def evidence_list(value: object, limit: int) -> tuple[Evidence, ...]:
    """The first ``limit`` items of a worker's list, rebuilt into evidence (the rest are never
    looked at: the worker already cuts its answer to the caps)."""
    if type(value) is not list:
        raise RetrieverFailedError("bad_result")
    return tuple(_evidence(item) for item in value[:limit])


def names(value: object, limit: int) -> tuple[str, ...]:
    if type(value) is not list:
        raise RetrieverFailedError("bad_result")
    names = value[:limit]
    if not all(type(name) is str for name in names):
        raise RetrieverFailedError("bad_result")
    return tuple(names)


def read_limit(request: dict[str, Any]) -> int:
    """How many items of an answer to ``request`` are read, on both sides of the pipe: a
    search's or belief read's caps (their examined items and one more, which tells that more
    were left out), a re-read's ids, a corrections read's :data:`LAZY_CORRECTIONS`."""
    caps = request.get("caps")
    if isinstance(caps, dict):
        return ContextCaps(**caps).examined + 1
    if request.get("op") == "revalidate":
        return len(request["ids"])
    return LAZY_CORRECTIONS


def text_limit(request: dict[str, Any]) -> int:
    """Where the worker cuts each text of an answer to ``request``: a search's or belief
    read's caps' ``max_bytes + 1`` characters, as the host cuts them (a longer text cannot be
    rendered whole); for a read that takes no caps (corrections, re-reads of retained
    evidence), the default caps' own cut."""
    caps = request.get("caps")
    return (ContextCaps(**caps) if isinstance(caps, dict) else ContextCaps()).max_bytes + 1


def _query(query: Any) -> dict[str, Any]:
    return {
        "fragments": list(query.fragments), "strategy": query.strategy.value,
        "baseline_reason": None if query.baseline_reason is None else query.baseline_reason.value,
        "scope": query.scope, "principal": query.principal,
        "roles": [role.value for role in query.roles],
    }


def _vector(vector: Any) -> list[float] | None:
    return None if vector is None else [float(x) for x in vector]


def prepared_values(prepared: PreparedRecall) -> dict[str, Any]:
    semantic = prepared.semantic
    return {
        "query": _query(prepared.query), "recent": _query(prepared.recent_query),
        "semantic": {
            "vector": _vector(semantic.vector),
            "withheld": None if semantic.withheld_reason is None
            else semantic.withheld_reason.value,
            "tokens": semantic.tokens, "model": semantic.model,
            "fragment_vectors": [_vector(v) for v in semantic.fragment_vectors],
        },
    }


def caps_values(caps: ContextCaps) -> dict[str, int]:
    return {"max_items": caps.max_items, "max_bytes": caps.max_bytes,
            "candidates_per_arm": caps.candidates_per_arm,
            "beliefs_per_person": caps.beliefs_per_person}
