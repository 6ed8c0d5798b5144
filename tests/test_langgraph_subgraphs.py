"""Agents and graphs nested in one LangGraph invocation share its one automatic round.

An outer graph invocation is one user turn, whatever runs inside it: a ``create_agent`` agent
used as a node (a supervisor's workers), a hand-built subgraph, or an agent a tool invokes.
LangGraph hands the outer run's control to every graph nested in it, so each of them finds the
context the turn prepared and takes no automatic round of its own; a nested run for another
run id prepares its own. Asyncio only (LangChain and LangGraph do not run under trio).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.runtime import Runtime

from plugin import ManualClock
from runtime_hooks import RecallHooks
from runtime_hooks.adapters.langchain import LangChainRecall, RecallContext, RecallMiddleware
from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.demo import PRINCIPAL, SCOPE
from runtime_hooks.testing import ScriptedCall, searches
from runtime_hooks.testing.langchain import ScriptedChatModel

from ._hooks_env import seeded_hooks

pytestmark = [pytest.mark.anyio]

RUN = "run-nested"
CONTEXT = RecallContext(run_id=RUN, scope=SCOPE, principal=PRINCIPAL)
ASK = "When is the invoice backfill cutover?"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def hooks(tmp_path: Path, clock: ManualClock) -> AsyncIterator[RecallHooks]:
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db")
    async with seeded_hooks(config, clock) as hooks:
        yield hooks


def _worker(hooks: RecallHooks, model: ScriptedChatModel) -> Any:
    return create_agent(model, middleware=[RecallMiddleware(hooks)], context_schema=RecallContext)


def _pipeline(*nodes: tuple[str, Any]) -> Any:
    graph = StateGraph(MessagesState, context_schema=RecallContext)
    previous = START
    for name, node in nodes:
        graph.add_node(name, node)
        graph.add_edge(previous, name)
        previous = name
    graph.add_edge(previous, END)
    return graph.compile()


async def _kinds(hooks: RecallHooks, run_id: str = RUN) -> list[str]:
    return [r.kind.value for r in await hooks.allowance.ledger.reservations(run_id)]


async def test_two_agents_used_as_nodes_share_the_turns_automatic_round(
    hooks: RecallHooks,
) -> None:
    """A supervisor's two workers, each a ``create_agent`` with its own middleware: the second
    worker's searches get the round the turn has left, not a refusal."""
    planner = ScriptedChatModel("Plan: look up the cutover.")
    researcher = ScriptedChatModel(searches("invoice backfill", "cutover date"), "Found it.")
    graph = _pipeline(("plan", _worker(hooks, planner)),
                      ("research", _worker(hooks, researcher)))
    await graph.ainvoke({"messages": [HumanMessage(ASK)]}, context=CONTEXT)

    assert await _kinds(hooks) == ["automatic", "deliberate"]  # one automatic round per turn
    (plan,) = planner.requests
    first, second = researcher.requests
    assert "Recalled memory" in plan.instructions
    assert first.instructions == second.instructions == plan.instructions
    assert [a["status"] for a in second.answers().values()] == ["ok", "ok"]
    assert await hooks.allowance.ledger.refusals(RUN) == []


async def test_an_agent_in_a_hand_built_graph_reuses_the_context_its_model_node_prepared(
    hooks: RecallHooks,
) -> None:
    recall = LangChainRecall(hooks)
    seen: list[str] = []

    async def triage(state: MessagesState, runtime: Runtime[RecallContext]) -> Any:
        seen.append(await recall.automatic_context(state["messages"], runtime.context))
        return {"messages": [AIMessage("Triaged.")]}

    worker = ScriptedChatModel(searches("cutover date"), "Done.")
    graph = _pipeline(("triage", triage), ("work", _worker(hooks, worker)))
    await graph.ainvoke({"messages": [HumanMessage(ASK)]}, context=CONTEXT)

    assert await _kinds(hooks) == ["automatic", "deliberate"]
    assert [request.instructions for request in worker.requests] == seen * 2
    assert [a["status"] for a in worker.requests[1].answers().values()] == ["ok"]


async def test_an_agent_a_tool_invokes_is_part_of_the_same_turn(hooks: RecallHooks) -> None:
    helper_model = ScriptedChatModel(searches("cutover date"), "The cutover is on Friday.")
    helper = _worker(hooks, helper_model)

    @tool
    async def ask_helper(question: str) -> str:
        """Ask the helper agent."""
        out = await helper.ainvoke({"messages": [HumanMessage(question)]}, context=CONTEXT)
        return str(out["messages"][-1].content)

    model = ScriptedChatModel(
        (ScriptedCall(name="ask_helper", arguments={"question": "When?"}, call_id="h1"),),
        "Friday.")
    agent = create_agent(model, tools=[ask_helper], middleware=[RecallMiddleware(hooks)],
                         context_schema=RecallContext)
    await agent.ainvoke({"messages": [HumanMessage(ASK)]}, context=CONTEXT)

    assert await _kinds(hooks) == ["automatic", "deliberate"]
    assert [a["status"] for a in helper_model.requests[1].answers().values()] == ["ok"]
    assert helper_model.requests[0].instructions == model.requests[0].instructions


async def test_a_nested_agent_for_another_run_prepares_its_own(hooks: RecallHooks) -> None:
    other = dataclasses.replace(CONTEXT, run_id="run-other")
    inner_model = ScriptedChatModel("Done.")
    inner = _worker(hooks, inner_model)

    async def delegate(state: MessagesState) -> Any:
        await inner.ainvoke({"messages": state["messages"]}, context=other)
        return {"messages": [AIMessage("Delegated.")]}

    outer_model = ScriptedChatModel("Done.")
    graph = _pipeline(("first", _worker(hooks, outer_model)), ("delegate", delegate))
    await graph.ainvoke({"messages": [HumanMessage(ASK)]}, context=CONTEXT)
    assert await _kinds(hooks) == ["automatic"]
    assert await _kinds(hooks, "run-other") == ["automatic"]


async def test_each_outer_invocation_still_prepares_again(hooks: RecallHooks) -> None:
    planner = ScriptedChatModel("One.", "Two.")
    graph = _pipeline(("plan", _worker(hooks, planner)))
    for _ in range(2):
        await graph.ainvoke({"messages": [HumanMessage(ASK)]}, context=CONTEXT)
    assert await _kinds(hooks) == ["automatic", "automatic"]
    first, second = (request.instructions for request in planner.requests)
    assert "Recalled memory" in first and "Recalled memory" in second




async def test_a_sync_invoke_of_nested_agents_shares_the_round_too(hooks: RecallHooks) -> None:
    planner = ScriptedChatModel("Plan: look up the cutover.")
    researcher = ScriptedChatModel(searches("cutover date"), "Found it.")
    graph = _pipeline(("plan", _worker(hooks, planner)),
                      ("research", _worker(hooks, researcher)))
    await anyio.to_thread.run_sync(functools.partial(
        graph.invoke, {"messages": [HumanMessage(ASK)]}, context=CONTEXT))
    assert await _kinds(hooks) == ["automatic", "deliberate"]
    assert researcher.requests[0].instructions == planner.requests[0].instructions
    assert [a["status"] for a in researcher.requests[1].answers().values()] == ["ok"]


def _scheduling_agent(hooks: RecallHooks, follow_up: Any, later: list[Any], go: Any) -> Any:
    """An agent whose tool schedules a follow-up run of ``follow_up`` for the same run in a
    background task, which waits for ``go`` (it inherits the tool's run control)."""
    import asyncio

    @tool
    async def schedule() -> str:
        """Schedule a follow-up."""

        async def run_later() -> None:
            await go.wait()
            await follow_up.ainvoke({"messages": [HumanMessage("What changed?")]},
                                    context=CONTEXT)

        later.append(asyncio.create_task(run_later()))
        return "scheduled"

    model = ScriptedChatModel(
        (ScriptedCall(name="schedule", arguments={}, call_id="s1"),), "Done.")
    return create_agent(model, tools=[schedule], middleware=[RecallMiddleware(hooks)],
                        context_schema=RecallContext), model


async def test_a_follow_up_that_starts_after_the_turn_ended_prepares_its_own_round(
    hooks: RecallHooks,
) -> None:
    """The follow-up starts once the outer agent's invocation has ended: it is the next turn,
    so it prepares again instead of sharing the ended turn's context."""
    import asyncio

    follow_model = ScriptedChatModel("Follow-up done.")
    go, later = asyncio.Event(), []
    agent, _ = _scheduling_agent(hooks, _worker(hooks, follow_model), later, go)
    await agent.ainvoke({"messages": [HumanMessage(ASK)]}, context=CONTEXT)
    go.set()
    await later[0]
    assert await _kinds(hooks) == ["automatic", "automatic"]


async def test_a_follow_up_after_the_deadline_is_not_served_the_ended_turns_evidence(
    hooks: RecallHooks, clock: ManualClock
) -> None:
    import asyncio

    follow_model = ScriptedChatModel("Follow-up done.")
    go, later = asyncio.Event(), []
    agent, model = _scheduling_agent(hooks, _worker(hooks, follow_model), later, go)
    await agent.ainvoke({"messages": [HumanMessage(ASK)]}, context=CONTEXT)
    assert "Recalled memory" in model.requests[0].instructions
    clock.advance(60.0)  # far past the run's original 10 s deadline
    go.set()
    await later[0]
    (request,) = follow_model.requests
    assert "Recalled memory" not in request.instructions


async def test_a_hand_built_graph_started_in_the_turn_keeps_its_round_after_the_turn_ends(
    hooks: RecallHooks,
) -> None:
    """A graph whose model node calls ``automatic_context`` at every request, started in a
    background task by the agent's tool: its first request shares the turn; its next, after
    the agent's invocation ended, is the same graph invocation and takes no round."""
    import asyncio

    recall = LangChainRecall(hooks)
    seen: list[str] = []
    first_done, outer_done = asyncio.Event(), asyncio.Event()

    async def call_model(state: MessagesState, runtime: Runtime[RecallContext]) -> Any:
        seen.append(await recall.automatic_context(state["messages"], runtime.context))
        if len(seen) == 1:
            first_done.set()
            await outer_done.wait()
        return {"messages": [AIMessage(f"step {len(seen)}")]}

    graph = StateGraph(MessagesState, context_schema=RecallContext)
    graph.add_node("model", call_model)
    graph.add_conditional_edges("model", lambda _: "model" if len(seen) < 2 else END,
                                ["model", END])
    graph.add_edge(START, "model")
    inner = graph.compile()
    tasks: list[Any] = []

    @tool
    async def spawn() -> str:
        """Start the helper graph."""
        tasks.append(asyncio.create_task(
            inner.ainvoke({"messages": [HumanMessage(ASK)]}, context=CONTEXT)))
        await first_done.wait()
        return "spawned"

    model = ScriptedChatModel((ScriptedCall(name="spawn", arguments={}, call_id="s1"),), "Done.")
    agent = create_agent(model, tools=[spawn], middleware=[RecallMiddleware(hooks)],
                         context_schema=RecallContext)
    await agent.ainvoke({"messages": [HumanMessage(ASK)]}, context=CONTEXT)
    outer_done.set()
    await tasks[0]
    assert await _kinds(hooks) == ["automatic"]
    assert seen[0] == seen[1] == model.requests[0].instructions
