"""Runs on several event loops at once, through the adapters (asyncio only).

The ledger's and the store's locks, connections and pools belong to the loop the hooks were
opened on; a framework may run an agent on a loop of its own (``Runner.run_sync``,
``asyncio.run`` in a request thread). Each adapter recalls on the hooks' loop, so runs on
several loops at once share one allowance and never wait on a lock another loop holds.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.to_thread
import pytest
from agents import Agent
from agents.testing import ScriptedModel, assistant_message, function_call

from runtime_hooks import RecallHooks
from runtime_hooks.adapters import SEARCH_TOOL
from runtime_hooks.adapters.openai_agents import agents_recall
from runtime_hooks.demo import PRINCIPAL, SCOPE

from .test_adapter_openai_agents import config, hooks, offline, outputs

pytestmark = [pytest.mark.anyio]
__all__ = ["hooks", "offline"]  # fixtures


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the frameworks do not run under trio


def two_searches(prefix: str) -> ScriptedModel:
    return ScriptedModel([
        [function_call(SEARCH_TOOL.name, {"query": "invoice backfill"}, call_id=f"{prefix}1"),
         function_call(SEARCH_TOOL.name, {"query": "cutover date"}, call_id=f"{prefix}2")],
        [assistant_message("Done.")],
    ])


async def on_threads_and_loop(
    where: tuple[str, ...], one: Callable[[str], Coroutine[Any, Any, None]]
) -> None:
    """``one(run_id)`` for each place: on this loop, or on a loop of its own in a daemon
    thread (``asyncio.run``: a hang fails the test after 30 s instead of holding the suite)."""

    def in_thread(run_id: str, done: threading.Event) -> None:
        try:
            asyncio.run(one(run_id))
        finally:
            done.set()

    finished: list[threading.Event] = []
    async with anyio.create_task_group() as group:
        for index, place in enumerate(where):
            if place == "loop":
                group.start_soon(one, f"r{index}")
            else:
                done = threading.Event()
                finished.append(done)
                threading.Thread(target=in_thread, args=(f"r{index}", done), daemon=True).start()
        for done in finished:
            assert await anyio.to_thread.run_sync(functools.partial(done.wait, 30.0))
    gc.collect()  # a loop left open would warn here, not in a later test


@pytest.mark.parametrize("where", [("thread", "loop"), ("thread", "thread", "loop")])
async def test_agents_sdk_runs_on_other_loops_beside_the_hooks_loop_all_end(
    hooks: RecallHooks, where: tuple[str, ...]
) -> None:
    recall = agents_recall(hooks)
    models: dict[str, ScriptedModel] = {}

    async def one(run_id: str) -> None:
        model = models[run_id] = two_searches("c")
        agent = Agent(name="assistant", instructions="Help Ana.", model=model,
                      tools=[recall.tool])
        await recall.run(agent, "Continue", run_id=run_id, scope=SCOPE, principal=PRINCIPAL,
                         run_config=config())

    await on_threads_and_loop(where, one)
    for run_id, model in models.items():
        assert {c: v["status"] for c, v in outputs(model.calls[1]).items()} \
            == {"c1": "ok", "c2": "ok"}
        usage = await hooks.allowance.ledger.usage(run_id)
        assert (usage.rounds, usage.executed) == (2, 3)
    assert len(models) == len(where)


@pytest.mark.parametrize("where", [("thread", "loop"), ("thread", "thread", "loop")])
async def test_langchain_ainvoke_on_other_loops_beside_the_hooks_loop_all_end(
    hooks: RecallHooks, where: tuple[str, ...]
) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage

    from runtime_hooks.adapters.langchain import RecallContext, RecallMiddleware
    from runtime_hooks.testing import searches
    from runtime_hooks.testing.langchain import ScriptedChatModel

    middleware = RecallMiddleware(hooks)
    models: dict[str, ScriptedChatModel] = {}

    async def one(run_id: str) -> None:
        model = models[run_id] = ScriptedChatModel(
            searches("invoice backfill", "cutover date"), "On it.")
        agent = create_agent(model, tools=[], middleware=[middleware],
                             context_schema=RecallContext)
        await agent.ainvoke({"messages": [HumanMessage("Continue")]}, context=RecallContext(
            run_id=run_id, scope=SCOPE, principal=PRINCIPAL))

    await on_threads_and_loop(where, one)
    for run_id, model in models.items():
        assert {c: a["status"] for c, a in model.requests[-1].answers().items()} \
            == {"call-0": "ok", "call-1": "ok"}
        usage = await hooks.allowance.ledger.usage(run_id)
        assert (usage.rounds, usage.executed) == (2, 3)
    assert len(models) == len(where)
