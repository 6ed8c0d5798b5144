"""The shipped backends, offline: a LangGraph store (in memory and on PostgreSQL) and any
LlamaIndex retriever (a keyword one, and a vector index on a mock embedding).

LangGraph's in-memory store and LlamaIndex run on both loops; LangGraph's PostgreSQL store
drives psycopg's asyncio connection, so that one runs on asyncio only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import pytest
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore
from langgraph.store.postgres import AsyncPostgresStore
from llama_index.core import VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.retrievers import BaseRetriever as LlamaRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from plugin import ManualClock, QueryPlanner, QueryPreparation, RecallAllowance, WorkingState
from plugin.memory.langgraph_store import langgraph_store_retriever, memory_namespace
from plugin.memory.llamaindex import llamaindex_retriever
from runtime_hooks import RecallHooks, ToolCall

from . import _pg
from ._fakes import MemoryLedger

pytestmark = pytest.mark.anyio


P, S = "mara@example.org", "notes.work"


@pytest.fixture
async def pg_store() -> AsyncIterator[BaseStore]:
    with _pg.fresh_schema("lgstore") as schema:
        with _pg.connect() as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        dsn = f"{_pg.DSN}?options={quote(f'-csearch_path={schema}')}"
        async with AsyncPostgresStore.from_conn_string(dsn) as pg_store:
            await pg_store.setup()
            yield pg_store


def _hooks(retriever: Any) -> RecallHooks:
    clock = ManualClock(wall=1_800_000_000.0, monotonic=10.0)
    return RecallHooks(allowance=RecallAllowance(MemoryLedger(), clock=clock),
                       preparer=QueryPreparation(QueryPlanner()), retriever=retriever)


def test_the_namespace_is_mapped_from_principal_and_scope() -> None:
    assert memory_namespace(P, S) == ("memories", "mara@example%2Eorg", "notes%2Ework")
    assert memory_namespace("a%2E", "s", prefix=("app", "mem")) == ("app", "mem", "a%252E", "s")
    with pytest.raises(ValueError, match="non-empty"):
        memory_namespace("", S)


async def test_an_in_memory_store_is_searched_in_the_runs_namespace_only() -> None:
    await _searched_in_the_runs_namespace_only(InMemoryStore())


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_postgres_store_is_searched_in_the_runs_namespace_only(
    pg_store: BaseStore, anyio_backend: str
) -> None:
    await _searched_in_the_runs_namespace_only(pg_store)


async def _searched_in_the_runs_namespace_only(store: BaseStore) -> None:
    await store.aput(memory_namespace(P, S), "m1", {"text": "the cutover is on friday"})
    await store.aput(memory_namespace(P, S), "m2", {"note": "no text key", "n": 2})
    await store.aput(memory_namespace("bob", S), "b1", {"text": "bob's cutover secret"})
    await store.aput(memory_namespace(P, "personal"), "p1", {"text": "dentist on friday"})
    hooks = _hooks(langgraph_store_retriever(store))
    (result,) = await hooks.dispatch([ToolCall(call_id="c1", arguments={"query": "cutover"})],
                                     run_id="r", scope=S, principal=P)
    assert result.status == "ok"
    assert sorted(i.id for i in result.evidence) == ["m1", "m2"]
    assert {(i.principal, i.scope, i.arm) for i in result.evidence} == {(P, S, "langgraph")}
    assert '{"n": 2, "note": "no text key"}' in result.content
    (checked,) = await hooks.validate_retained(["m1"], run_id="r", scope=S, principal=P)
    assert checked.status == "valid" and checked.evidence is not None
    await store.adelete(memory_namespace(P, S), "m2")
    context = await hooks.prepare(WorkingState("cutover"), run_id="r2", scope=S, principal=P)
    assert [i.id for i in context.evidence] == ["m1"]


async def test_an_item_from_outside_the_namespace_is_dropped() -> None:
    class Leaky(InMemoryStore):
        async def asearch(self, namespace_prefix: tuple[str, ...], /,
                          **kwargs: Any) -> Any:
            return await super().asearch(("memories",), **kwargs)  # a buggy store

    store = Leaky()
    await store.aput(memory_namespace(P, S), "m1", {"text": "mine"})
    await store.aput(memory_namespace("bob", S), "b1", {"text": "bob's"})
    hooks = _hooks(langgraph_store_retriever(store))
    (result,) = await hooks.dispatch([ToolCall(call_id="c1", arguments={"query": "mine"})],
                                     run_id="r", scope=S, principal=P)
    assert [i.id for i in result.evidence] == ["m1"] and result.dropped == 1


# -- LlamaIndex -------------------------------------------------------------------------------


class KeywordRetriever(LlamaRetriever):
    """A LlamaIndex retriever over a list of nodes (offline, no model)."""

    def __init__(self, nodes: list[TextNode]) -> None:
        self._nodes = nodes
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        words = set(query_bundle.query_str.split())
        return [NodeWithScore(node=node, score=1.0) for node in self._nodes
                if words & set(node.text.split())]


def _node(key: str, text: str, **metadata: str) -> TextNode:
    return TextNode(id_=key, text=text, metadata=metadata)


async def test_a_llamaindex_retriever_is_searched_and_foreign_nodes_dropped() -> None:
    nodes = [_node("m1", "the cutover is on friday", principal=P, scope=S),
             _node("m2", "cutover runbook drafted"),  # untagged: the run's
             _node("b1", "bob's cutover secret", principal="bob", scope=S)]
    hooks = _hooks(llamaindex_retriever(KeywordRetriever(nodes)))
    (result,) = await hooks.dispatch([ToolCall(call_id="c1", arguments={"query": "cutover"})],
                                     run_id="r", scope=S, principal=P)
    assert [(i.id, i.arm, i.score) for i in result.evidence] == [
        ("m1", "llamaindex", 1.0), ("m2", "llamaindex", 1.0)]
    assert result.dropped == 1 and "secret" not in result.content
    (checked,) = await hooks.validate_retained(["m1"], run_id="r", scope=S, principal=P)
    assert checked.status == "failed"  # LlamaIndex has no read by id: never "gone"


async def test_a_vector_index_retriever_per_tenant() -> None:
    built: list[tuple[str, str]] = []
    index = VectorStoreIndex(
        [_node("m1", "the cutover is on friday"), _node("m2", "lunch on thursday")],
        embed_model=MockEmbedding(embed_dim=8),
    )

    def retriever_for(principal: str, scope: str) -> LlamaRetriever:
        built.append((principal, scope))
        return index.as_retriever(similarity_top_k=1)

    hooks = _hooks(llamaindex_retriever(retriever_for))
    context = await hooks.prepare(WorkingState("cutover"), run_id="r", scope=S, principal=P)
    assert built == [(P, S)] and len(context.evidence) == 1
    assert context.evidence[0].principal == P
