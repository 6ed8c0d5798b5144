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

from plugin import ManualClock
from plugin.control.ledger import AttemptOutcome
from runtime_hooks import RecallHooks
from runtime_hooks.adapters import SEARCH_TOOL, RunRecall
from runtime_hooks.adapters.openai_agents import agents_recall
from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.demo import PRINCIPAL, SCOPE
from runtime_hooks.hooks import ToolCall

from ._calls_env import Counting
from ._hooks_env import seeded_hooks
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


class _Stuck(Counting):
    """A retriever whose search waits until it is cancelled (``started``, ``cancelled``)."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.cancelled = threading.Event(), threading.Event()

    async def search(self, request: Any) -> list[Any]:
        self.searches += 1
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("how", ["anyio scope on asyncio", "task.cancel()", "anyio scope on trio",
                                 "anyio scope on asyncio in debug mode", "task.cancel() twice"])
async def test_a_caller_on_another_loop_cancelled_mid_search_cancels_it_on_the_hooks_loop(
    hooks: RecallHooks, how: str
) -> None:
    # Cancelled on its own loop, a recall stops there; forwarded to the hooks' loop, the
    # caller's cancellation must reach it too, and the caller must not wait for it to end.
    import attrs

    stuck = _Stuck()
    run = RunRecall(attrs.evolve(hooks, retriever=stuck.retriever), "r-cancel", SCOPE,
                    PRINCIPAL)
    call = ToolCall(call_id="c1", arguments={"query": "invoice backfill"})

    async def cancelled_by_scope() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(run.dispatch_batch, [call])
            await anyio.to_thread.run_sync(stuck.started.wait)
            group.cancel_scope.cancel()

    async def cancelled_natively() -> None:
        task = asyncio.ensure_future(run.dispatch_batch([call]))
        await asyncio.get_running_loop().run_in_executor(None, stuck.started.wait)
        task.cancel()
        if how == "task.cancel() twice":
            await asyncio.sleep(0)
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    def in_thread(done: threading.Event) -> None:
        try:
            if how == "anyio scope on trio":
                anyio.run(cancelled_by_scope, backend="trio")
            else:
                asyncio.run(cancelled_natively() if how.startswith("task.cancel()")
                            else cancelled_by_scope(), debug="debug" in how)
        finally:
            done.set()

    done = threading.Event()
    threading.Thread(target=in_thread, args=(done,), daemon=True).start()
    assert await anyio.to_thread.run_sync(functools.partial(done.wait, 30.0))
    assert await anyio.to_thread.run_sync(functools.partial(stuck.cancelled.wait, 30.0))
    assert stuck.searches == 1
    with anyio.fail_after(30):  # its trace is written as the attempt ends
        while not (traces := [a.outcome for a in await hooks.allowance.ledger.attempts(
                "r-cancel") if a.outcome is not AttemptOutcome.IN_FLIGHT]):
            await anyio.sleep(0.01)
    assert traces == [AttemptOutcome.CANCELLED]  # by its caller, not by the deadline later
    gc.collect()


def test_hooks_whose_loop_is_idle_recall_where_they_are_awaited(tmp_path: Any) -> None:
    # Hooks opened with loop.run_until_complete (a session fixture, say) have a loop that runs
    # only between such calls: a run on another loop meanwhile recalls where it is awaited.
    import contextlib

    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db")
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()
    try:
        hooks = loop.run_until_complete(stack.enter_async_context(
            seeded_hooks(config, ManualClock(wall=1_700_000_000.0, monotonic=10.0))))
        run = RunRecall(hooks, "r-idle", SCOPE, PRINCIPAL)
        call = ToolCall(call_id="c1", arguments={"query": "invoice backfill"})

        def in_thread(done: threading.Event, results: list[Any]) -> None:
            try:
                results.extend(asyncio.run(run.dispatch_batch([call])))
            finally:
                done.set()

        done, results = threading.Event(), []
        threading.Thread(target=in_thread, args=(done, results), daemon=True).start()
        assert done.wait(30.0)
        assert [result.status for result in results] == ["ok"]
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()


async def test_a_recall_sent_to_the_hooks_loop_takes_no_worker_thread_of_either_loop(
    hooks: RecallHooks,
) -> None:
    # Worker threads are a loop's shared, bounded resource (40 by default); a caller that
    # holds them all must still recall, and so must the hooks' loop whose threads callers
    # started from it hold.
    run = RunRecall(hooks, "r-threads", SCOPE, PRINCIPAL)
    call = ToolCall(call_id="c1", arguments={"query": "invoice backfill"})
    release = threading.Event()

    async def with_every_thread_taken() -> list[str]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1
        async with anyio.create_task_group() as group:
            group.start_soon(anyio.to_thread.run_sync, release.wait)  # holds the one thread
            await anyio.sleep(0)
            with anyio.fail_after(30):
                results = await run.dispatch_batch([call])
            release.set()
        return [result.status for result in results]

    def in_thread(done: threading.Event, statuses: list[str]) -> None:
        try:
            statuses.extend(asyncio.run(with_every_thread_taken()))
        finally:
            release.set()
            done.set()

    done, statuses = threading.Event(), []
    threading.Thread(target=in_thread, args=(done, statuses), daemon=True).start()
    assert await anyio.to_thread.run_sync(functools.partial(done.wait, 60.0))
    assert statuses == ["ok"]


async def test_recall_computes_in_threads_of_its_own_when_callers_hold_the_loops_threads(
    tmp_path: Any,
) -> None:
    # A host that runs each agent from anyio.to_thread.run_sync holds one of the loop's
    # default worker threads per run; with all of them held, recall's vector math must still
    # get a thread, or the preparation bound withholds the semantic arm of every turn.
    from plugin import QueryStrategy, WorkingState
    from runtime_hooks.settings import Semantic

    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db",
                          semantic=Semantic.HASHING, query_planning=QueryStrategy.TASK_CONTEXT)
    release = threading.Event()
    async with seeded_hooks(config, ManualClock(wall=1_700_000_000.0, monotonic=10.0)) as hooks:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(anyio.to_thread.run_sync, release.wait)  # the loop's one thread
                await anyio.sleep(0)
                with anyio.fail_after(30):
                    context = await hooks.prepare(
                        WorkingState("Continue", next_action="invoice backfill dry-run"),
                        run_id="r-threads", scope=SCOPE, principal=PRINCIPAL)
                release.set()
        finally:
            release.set()
            anyio.to_thread.current_default_thread_limiter().total_tokens = 40
    assert context.evidence
    assert not [note for note in context.notes if "withheld" in note], context.notes
