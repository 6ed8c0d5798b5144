"""What the LangChain adapter costs a ``create_agent`` run, on asyncio.

The same offline run (a fake chat model says "Continue" and emits 6 parallel search calls,
then a final answer) is timed four ways, alternating, with fresh run ids:

* ``bare``: the agent with a plain ``search_memory`` tool that returns a fixed string (each
  call runs in the tools node);
* ``shape``: the agent with a middleware of the adapter's shape (``awrap_model_call`` passes
  through, ``aafter_model`` answers the 6 calls with fixed ``ToolMessage``s): what the
  framework's hook points cost, with no recall;
* ``adapter``: the agent with :class:`RecallMiddleware` (``automatic="per_request"``: an
  automatic round on each model request, the same hooks calls as ``hooks``; the batch in
  ``after_model``) over the real hooks, SQLite ledger on a temporary file;
* ``adapter, once``: the same with the default, one automatic round per invocation (one
  ``prepare`` fewer; printed for reference, not part of the overhead ratio);
* ``hooks``: the same hooks calls the adapter makes (two ``prepare``, one 6-call ``dispatch``),
  called directly, without any agent;
* ``node``: those hooks calls inside the one node of a bare LangGraph graph.

``adapter / bare`` is what bounded recall costs the whole run, the hooks' durable commits and
searches included. ``adapter - shape - hooks`` is what is left for the adapter, but it also
holds the hooks' thread hand-offs (aiosqlite, fsync) being slower inside a LangGraph run
(``node - hooks`` shows that part with no adapter at all); so the adapter's own code is also
timed directly (``glue``: reading the batch
from the messages, the working state, the system message, one ``ToolMessage`` per result, the
run lookup) on the messages of a real adapted run.

    python -m bench.bench_adapter_langchain
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from itertools import count
from pathlib import Path
from typing import Any

import anyio
from attrs import evolve
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph

from plugin.memory.state import WorkingState
from runtime_hooks.adapters import SEARCH_TOOL
from runtime_hooks.adapters.langchain import (
    RecallContext,
    RecallMiddleware,
    pending_search_calls,
    system_with_context,
    tool_message,
)
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed_store
from runtime_hooks.hooks import RecallHooks, ToolCall

ROUNDS = 150
QUERIES = ("invoice backfill", "rounding rule", "cutover date", "deploy window",
           "rollback runbook", "kickoff notes")
CALLS = [{"name": SEARCH_TOOL.name, "args": {"query": q}, "id": f"c{i}", "type": "tool_call"}
         for i, q in enumerate(QUERIES)]


class ScriptedModel(GenericFakeChatModel):
    """Six search calls after the user's message, a final answer after the tool results."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content="Done.")
        else:
            reply = AIMessage(content="", tool_calls=CALLS)
        return ChatResult(generations=[ChatGeneration(message=reply)])


class Shape(AgentMiddleware[AgentState[Any], Any, Any]):
    """The adapter's hook points with fixed answers: the framework's part of the cost."""

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        return await handler(request)

    async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        last = state["messages"][-1]
        if not isinstance(last, AIMessage) or not last.tool_calls:
            return None
        return {"messages": [ToolMessage(content="{}", tool_call_id=call["id"],
                                         name=SEARCH_TOOL.name) for call in last.tool_calls]}


@tool(SEARCH_TOOL.name)
def plain_search(query: str) -> str:
    """A search tool that searches nothing (the baseline)."""
    return "No matching memory was found."


def _state(messages: Any) -> WorkingState:
    return evolve(STATE, current_request="Continue")


async def _median(calls: dict[str, Callable[[], Awaitable[Any]]]) -> dict[str, float]:
    """Median milliseconds of each, timed one call at a time, alternating (fsync drifts)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(5):  # warm-up
        for call in calls.values():
            await call()
    for _ in range(ROUNDS):
        for name, call in calls.items():
            start = time.perf_counter_ns()
            await call()
            times[name].append((time.perf_counter_ns() - start) / 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


def _glue(middleware: RecallMiddleware, messages: list[AnyMessage], context: object) -> float:
    """Median milliseconds of the adapter's own work for one run (no hooks, no framework)."""
    recall = middleware.recall
    batch_at = next(i for i, m in enumerate(messages) if isinstance(m, AIMessage))
    before, batch = messages[:batch_at], messages[:batch_at + 1]
    (run,) = [recall.run(context)]
    results = [r for c in CALLS if (r := run.result(c["id"])) is not None]
    block = "x" * 2000  # about the size of a rendered automatic context
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter_ns()
        for seen in (before, messages):  # two model requests
            recall.run(context)
            recall.working_state(seen)
            system_with_context(SystemMessage(content="You are helpful."), block)
        recall.run(context)
        pending_search_calls(batch)
        [tool_message(result) for result in results]
        times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times)


async def main() -> None:
    runs = count()
    model = ScriptedModel(messages=iter(()))
    with tempfile.TemporaryDirectory() as folder:

        async def admit(_: str) -> bool:
            return True

        config = RecallConfig(ledger_path=Path(folder) / "l.db", store_path=Path(folder) / "m.db",
                              query_planning="task_context", admission=admit)
        await seed_store(config)
        async with open_hooks(config) as hooks:
            bare = create_agent(model, tools=[plain_search])
            shape = create_agent(model, tools=[plain_search], middleware=[Shape()])
            adapted = create_agent(model, middleware=[RecallMiddleware(
                hooks, working_state=_state, automatic="per_request")],
                context_schema=RecallContext)
            once: Any = create_agent(
                model, middleware=[RecallMiddleware(hooks, working_state=_state)],
                context_schema=RecallContext)
            start = {"messages": [HumanMessage("Continue")]}

            async def run_bare() -> None:
                await bare.ainvoke(start)

            async def run_shape() -> None:
                await shape.ainvoke(start)

            async def run_adapter() -> None:
                context = RecallContext(run_id=f"a{next(runs)}", scope=SCOPE,
                                        principal=PRINCIPAL)
                await adapted.ainvoke(start, context=context)

            async def run_once() -> None:
                context = RecallContext(run_id=f"o{next(runs)}", scope=SCOPE,
                                        principal=PRINCIPAL)
                await once.ainvoke(start, context=context)

            async def run_hooks(hooks: RecallHooks = hooks) -> None:
                run = {"run_id": f"h{next(runs)}", "scope": SCOPE, "principal": PRINCIPAL}
                await hooks.prepare(_state(None), **run)
                await hooks.dispatch([ToolCall(call_id=c["id"], arguments=c["args"])
                                      for c in CALLS], **run)
                await hooks.prepare(_state(None), **run)

            async def hooks_node(state: Any) -> dict[str, Any]:
                await run_hooks()
                return {}

            graph = StateGraph(MessagesState)
            graph.add_node("recall", hooks_node)
            graph.add_edge(START, "recall")
            graph.add_edge("recall", END)
            one_node = graph.compile()

            async def run_node() -> None:
                await one_node.ainvoke({"messages": []})

            medians = await _median({"bare": run_bare, "shape": run_shape,
                                     "adapter": run_adapter, "once": run_once,
                                     "hooks": run_hooks, "node": run_node})
            middleware = RecallMiddleware(hooks, working_state=_state)
            context = RecallContext(run_id="g", scope=SCOPE, principal=PRINCIPAL)
            final = await create_agent(model, middleware=[middleware],
                                       context_schema=RecallContext).ainvoke(start,
                                                                             context=context)
            medians["glue"] = _glue(middleware, final["messages"], context)
    bare_ms, shape_ms = medians["bare"], medians["shape"]
    adapter_ms, hooks_ms = medians["adapter"], medians["hooks"]
    left = adapter_ms - shape_ms - hooks_ms
    glue = medians["glue"]
    print(f"LangChain create_agent, fake model, 6 search calls; medians of {ROUNDS} "
          "alternating runs, SQLite ledger on a temporary file")
    print(f"  bare agent (plain tool)          {bare_ms:8.2f} ms")
    print(f"  agent + a no-recall middleware   {shape_ms:8.2f} ms")
    print(f"  agent + RecallMiddleware         {adapter_ms:8.2f} ms   "
          f"{adapter_ms / bare_ms:5.2f}x bare")
    print(f"  RecallMiddleware, once (default) {medians['once']:8.2f} ms")
    print(f"  the same hooks calls, no agent   {hooks_ms:8.2f} ms")
    print(f"  the same hooks calls, in a node  {medians['node']:8.2f} ms")
    print(f"  left over (adapter-shape-hooks)  {left:8.2f} ms   "
          f"{left / adapter_ms:6.1%} of the adapted run")
    print(f"  adapter glue, timed directly     {glue:8.3f} ms   "
          f"{glue / adapter_ms:6.1%} of the adapted run")


if __name__ == "__main__":
    anyio.run(main)
