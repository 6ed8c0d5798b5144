"""The shipped store backends against the real libraries: an item from outside the run's
namespace prefix is dropped."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.store.memory import InMemoryStore

from plugin import ManualClock, QueryPlanner, QueryPreparation, RecallAllowance
from plugin.memory.langgraph_store import langgraph_store_retriever, memory_namespace
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
