"""A hand-built LangGraph graph's automatic round under pressure from other invocations.

The automatic round belongs to the graph invocation: ``LangChainRecall.automatic_context``
called at every model request of one invocation runs it once. Other invocations running
meanwhile (more of them than ``max_runs``) must not make a running invocation forget that it
prepared already, so that its next model request opened a second automatic round.
Asyncio only: LangGraph does not run under trio.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.runtime import Runtime

from plugin import ManualClock
from runtime_hooks import RecallHooks
from runtime_hooks.adapters import SEARCH_TOOL
from runtime_hooks.adapters.langchain import LangChainRecall, RecallContext, RecallToolNode
from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.demo import PRINCIPAL, SCOPE

from ._hooks_env import seeded_hooks

pytestmark = [pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def hooks(tmp_path: Path, clock: ManualClock) -> AsyncIterator[RecallHooks]:
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db")
    async with seeded_hooks(config, clock) as hooks:
        yield hooks


def _graph(recall: LangChainRecall, seen: dict[str, list[str]],
           prepared: dict[str, anyio.Event]) -> Any:
    """model -> tools -> model: ``a`` requests again only after ``b`` prepared (which makes
    the registry forget ``a``'s invocation under ``max_runs=1``)."""

    async def model(state: dict[str, Any], runtime: Runtime[Any]) -> dict[str, Any]:
        run_id = runtime.context.run_id
        if run_id == "b" and not seen["b"]:
            await prepared["a"].wait()
        if run_id == "a" and seen["a"]:
            await prepared["b"].wait()
        seen[run_id].append(await recall.automatic_context(state["messages"], runtime.context))
        if len(seen[run_id]) > 1:
            return {"messages": [AIMessage(content="Done.")]}
        prepared[run_id].set()
        call = {"name": SEARCH_TOOL.name, "args": {"query": "invoice backfill"},
                "id": f"{run_id}-c0", "type": "tool_call"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    def route(state: dict[str, Any]) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState, context_schema=RecallContext)
    graph.add_node("model", model)
    graph.add_node("tools", RecallToolNode.with_tools(recall).ainvoke)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route)
    graph.add_edge("tools", "model")
    return graph.compile()


async def test_other_invocations_do_not_make_a_running_one_prepare_again(
    hooks: RecallHooks,
) -> None:
    recall = LangChainRecall(hooks, max_runs=1)
    seen: dict[str, list[str]] = {"a": [], "b": []}
    prepared = {"a": anyio.Event(), "b": anyio.Event()}
    graph = _graph(recall, seen, prepared)

    async def invoke(run_id: str) -> None:
        context = RecallContext(run_id=run_id, scope=SCOPE, principal=PRINCIPAL)
        await graph.ainvoke({"messages": [HumanMessage("Continue the invoice backfill")]},
                            context=context)

    async with anyio.create_task_group() as group:
        group.start_soon(invoke, "a")
        group.start_soon(invoke, "b")
    for run_id in ("a", "b"):
        first, second = seen[run_id]
        assert "m-backfill" in first
        assert second == first  # the invocation's context, no second round
        usage = await hooks.allowance.ledger.usage(run_id)
        assert (usage.rounds, usage.refused) == (2, 0)


async def test_a_small_registry_never_shortens_the_shared_invocation_table(
    hooks: RecallHooks,
) -> None:
    from runtime_hooks.adapters.langchain import recall as recall_module

    LangChainRecall(hooks)
    LangChainRecall(hooks, max_runs=1)  # after the default one: it must not trim its entries
    table = recall_module._turns[hooks]
    assert table.bound == recall_module.INVOCATIONS_KEPT
    LangChainRecall(hooks, max_runs=5000)
    assert table.bound == 5000
