"""The shipped store backends against the real libraries: an item from outside the run's
namespace prefix is dropped, a node or item scored NaN is still evidence, and an indexed
in-memory LangGraph store is searched on trio too."""

from __future__ import annotations

import gc
from datetime import datetime, timezone
from typing import Any

import pytest
from langgraph.store.base import SearchItem
from langgraph.store.memory import InMemoryStore
from llama_index.core.retrievers import BaseRetriever as LlamaRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from plugin import ManualClock, QueryPlanner, QueryPreparation, RecallAllowance, WorkingState
from plugin.memory.langgraph_store import langgraph_store_retriever, memory_namespace
from plugin.memory.llamaindex import llamaindex_retriever
from runtime_hooks import RecallHooks, ToolCall

from ._fakes import MemoryLedger
from ._loops import VIRTUAL_TIME_LOOPS

pytestmark = pytest.mark.anyio
P, S = "mara", "atlas"
CALL = ToolCall(call_id="c1", arguments={"query": "cutover"})


@pytest.fixture(params=VIRTUAL_TIME_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


def _hooks(retriever: Any) -> RecallHooks:
    clock = ManualClock(wall=1_800_000_000.0, monotonic=10.0)
    return RecallHooks(allowance=RecallAllowance(MemoryLedger(), clock=clock),
                       preparer=QueryPreparation(QueryPlanner()), retriever=retriever)


async def test_an_item_from_under_another_prefix_is_dropped() -> None:
    class Leaky(InMemoryStore):
        async def asearch(self, namespace_prefix: tuple[str, ...], /, **kwargs: Any) -> Any:
            return await super().asearch((), **kwargs)  # a buggy store: every namespace

    store = Leaky()
    await store.aput(memory_namespace(P, S, prefix=("org-a",)), "m1", {"text": "mine"})
    await store.aput(memory_namespace(P, S, prefix=("org-b",)), "b1", {"text": "org b's"})
    await store.aput(("org-b",), "b2", {"text": "org b's top"})
    hooks = _hooks(langgraph_store_retriever(store, prefix=("org-a",)))
    (result,) = await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
    assert [i.id for i in result.evidence] == ["m1"]
    assert result.dropped == 2 and "org b" not in result.content


async def test_a_langgraph_item_scored_nan_is_still_evidence() -> None:
    class NanScored(InMemoryStore):
        async def asearch(self, namespace_prefix: tuple[str, ...], /, **kwargs: Any) -> Any:
            now = datetime.now(timezone.utc)
            return [SearchItem(namespace_prefix, "m1", {"text": "the cutover is friday"},
                               now, now, score=float("nan"))]

    hooks = _hooks(langgraph_store_retriever(NanScored()))
    (result,) = await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
    assert result.status == "ok" and [i.id for i in result.evidence] == ["m1"]
    assert result.evidence[0].score == 0.0


class Scored(LlamaRetriever):
    """Nodes scored as a cosine similarity over an all-zero embedding is (NaN)."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(id_="m1", text="the cutover is friday"),
                              score=float("nan")),
                NodeWithScore(node=TextNode(id_="m2", text="cutover runbook"), score=0.5)]


async def test_a_llamaindex_node_scored_nan_is_still_evidence() -> None:
    hooks = _hooks(llamaindex_retriever(Scored()))
    (result,) = await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
    assert result.status == "ok"
    assert sorted((i.id, i.score) for i in result.evidence) == [("m1", 0.0), ("m2", 0.5)]


def _embed(texts: list[str]) -> list[list[float]]:
    return [[float(len(text) % 7 + 1), 1.0, 0.5] for text in texts]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # real time: a worker thread
async def test_an_indexed_in_memory_store_is_searched_on_both_loops(anyio_backend: str) -> None:
    store = InMemoryStore(index={"dims": 3, "embed": _embed})
    store.put(memory_namespace(P, S), "m1", {"text": "the cutover is friday"})
    store.put(memory_namespace("bob", S), "b1", {"text": "bob's cutover secret"})
    hooks = _hooks(langgraph_store_retriever(store))
    (result,) = await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
    assert result.status == "ok" and [i.id for i in result.evidence] == ["m1"]
    context = await hooks.prepare(WorkingState("cutover"), run_id="r2", scope=S, principal=P)
    assert [i.id for i in context.evidence] == ["m1"]
    gc.collect()  # a query coroutine left unawaited would warn here
