"""A host stopping a LangChain ``create_agent`` run streamed with ``astream`` at each cut point
leaves the recall contract intact (asyncio only).

Ways of stopping: cancelling the consumer's task, an anyio cancel scope around the consumer,
and (once the final answer arrived) breaking out of ``astream`` and closing it. After the cut:
nothing is left running, only ``CancelledError`` reaches the host, a search cancelled
mid-flight keeps its claim and a finished one replays ``ok``, and past the run's original
deadline the next invocation gets the deadline notice with no new round, no search and nothing
the cut invocation prepared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult

from plugin import Evidence, ManualClock, SimpleRetriever
from runtime_hooks import RecallHooks
from runtime_hooks.adapters.langchain import RecallContext, RecallMiddleware
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.testing import Step, search
from runtime_hooks.testing.langchain import ScriptedChatModel

from ._stream_cancel_env import (
    CUT_POINTS,
    POLICY,
    QUERY,
    RUN_ID,
    STEPS,
    Cue,
    continue_after_cut,
    cue_hooks,
    nothing_left_running,
    stop,
)

pytestmark = [pytest.mark.anyio]

CONTEXT = RecallContext(run_id=RUN_ID, scope="atlas", principal="ana")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # LangChain's async agents run on asyncio


class CuedChatModel(ScriptedChatModel):
    """The scripted model, telling ``cue`` once its final text is produced (where it may hang)."""

    cue: Cue

    def __init__(self, cue: Cue, *steps: Step) -> None:
        super().__init__(*steps, cue=cue)

    async def _agenerate(
        self, messages: list[BaseMessage], stop: list[str] | None = None,
        run_manager: Any = None, **kwargs: Any,
    ) -> ChatResult:
        result = await super()._agenerate(messages, stop, run_manager, **kwargs)
        if not result.generations[0].message.tool_calls:  # type: ignore[attr-defined]
            await self.cue.final_started()
        return result


def _agent(hooks: RecallHooks, model: ScriptedChatModel) -> Any:
    return create_agent(model, tools=[], middleware=[RecallMiddleware(hooks)],
                        context_schema=RecallContext)


async def _invoke(hooks: RecallHooks, model: ScriptedChatModel) -> None:
    await _agent(hooks, model).ainvoke({"messages": [HumanMessage("Continue")]},
                                       context=CONTEXT)


def _consumer(hooks: RecallHooks, cue: Cue, way: str) -> Any:
    agent = _agent(hooks, CuedChatModel(cue, *STEPS))

    async def consume() -> None:
        chunks = agent.astream({"messages": [HumanMessage("Continue")]}, context=CONTEXT,
                               stream_mode="values")
        async for chunk in chunks:
            last = chunk["messages"][-1]
            if way == "break" and isinstance(last, AIMessage) and not last.tool_calls:
                break
        await chunks.aclose()

    return consume


async def _cut_then_continue(
    hooks: RecallHooks, clock: ManualClock, cue: Cue, way: str
) -> None:
    async with nothing_left_running():
        await stop(way, _consumer(hooks, cue, way), cue)

    async def invoke(*steps: Step) -> CuedChatModel:
        model = CuedChatModel(cue, *steps)
        await _invoke(hooks, model)
        return model

    await continue_after_cut(hooks, clock, cue, invoke)


@pytest.mark.parametrize("point", CUT_POINTS)
@pytest.mark.parametrize("way", ["task", "scope"])
async def test_a_cancelled_stream_keeps_claims_and_never_renews(
    tmp_path: Path, clock: ManualClock, way: str, point: str
) -> None:
    cue = Cue(point)
    async with cue_hooks(tmp_path, clock, cue) as hooks:
        await _cut_then_continue(hooks, clock, cue, way)


async def test_breaking_out_once_the_final_answer_arrived_keeps_the_contract(
    tmp_path: Path, clock: ManualClock
) -> None:
    # The model is not streamed: the final answer reaches the host whole, so it cannot hang
    # half-way; the host breaks out as soon as it sees it.
    cue = Cue("final", armed=False)
    async with cue_hooks(tmp_path, clock, cue) as hooks:
        await _cut_then_continue(hooks, clock, cue, "break")


async def test_a_messages_stream_cancelled_mid_search_does_not_hold_up_the_next_turn(
    tmp_path: Path, clock: ManualClock
) -> None:
    """LangGraph's ``messages`` mode leaves the running node running when its consumer is
    cancelled, so the first turn's search goes on. The run's next turn (other calls) is not
    held up by it: its search runs at once, in its own round."""
    release, started, searched, ended = anyio.Event(), anyio.Event(), [], []

    async def slow_first(request: Any) -> list[Evidence]:
        searched.append(request.text)
        if request.text == QUERY:
            started.set()
            try:
                await release.wait()
            finally:
                ended.append(request.text)
        return [Evidence(id=f"m{len(searched)}", text=f"memo about {request.text}")]

    config = RecallConfig(ledger_path=tmp_path / "ledger.db", policy=POLICY)
    async with open_hooks(config, clock=clock, retriever=SimpleRetriever(slow_first)) as hooks:
        middleware = RecallMiddleware(hooks, automatic=False)  # one agent's, turn after turn
        first = create_agent(ScriptedChatModel([search(QUERY, call_id="s0")], "done"), tools=[],
                             middleware=[middleware], context_schema=RecallContext)

        async def consume() -> None:
            async for _ in first.astream({"messages": [HumanMessage("Continue")]},
                                         context=CONTEXT, stream_mode="messages"):
                pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await started.wait()
            tg.cancel_scope.cancel()
        second = create_agent(ScriptedChatModel([search("rollback plan", call_id="s1")], "ok"),
                              tools=[], middleware=[middleware], context_schema=RecallContext)
        with anyio.fail_after(30):  # a guard: the turn must not wait for the first search
            out = await second.ainvoke({"messages": [HumanMessage("and the rollback?")]},
                                       context=CONTEXT)
        answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
        assert [json.loads(str(m.content))["status"] for m in answers] == ["ok"]
        assert searched == [QUERY, "rollback plan"] and not ended  # the first still searches
        release.set()  # the node LangGraph left running ends; its slot was spent anyway
        with anyio.fail_after(30):
            while (await hooks.allowance.ledger.usage(RUN_ID)).executed < 2:
                await anyio.sleep(0.01)
        usage = await hooks.allowance.ledger.usage(RUN_ID)
        assert (usage.rounds, usage.reserved, usage.executed) == (2, 2, 2)
