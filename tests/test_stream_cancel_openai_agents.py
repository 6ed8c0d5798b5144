"""A host stopping ``Runner.run_streamed`` (through ``agents_recall``) at each cut point leaves
the recall contract intact (asyncio only).

Ways of stopping: cancelling the consumer's task, an anyio cancel scope around the consumer,
``result.cancel()`` while consuming, and (once the final answer streams) breaking out of
``stream_events()`` and closing it. After the cut: nothing is left running, only
``CancelledError`` reaches the host, a search cancelled mid-flight keeps its claim and a
finished one replays ``ok``, and past the run's original deadline the next invocation gets the
deadline notice with no new round, no search and nothing the cut invocation prepared.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from agents import Agent, RunConfig
from agents.items import TResponseStreamEvent
from agents.stream_events import RawResponsesStreamEvent

from plugin import ManualClock
from runtime_hooks import RecallHooks
from runtime_hooks.adapters.openai_agents import AgentsRecall, agents_recall
from runtime_hooks.testing import Step
from runtime_hooks.testing.openai_agents import ScriptedAgentsModel

from ._stream_cancel_env import (
    CUT_POINTS,
    RUN_ID,
    STEPS,
    Cue,
    continue_after_cut,
    cue_hooks,
    nothing_left_running,
    stop,
)

pytestmark = [pytest.mark.anyio]

IDENTITY: dict[str, Any] = {"run_id": RUN_ID, "scope": "atlas", "principal": "ana",
                            "run_config": RunConfig(tracing_disabled=True)}
TEXT_DELTA = "response.output_text.delta"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Agents SDK runs on asyncio


class CuedAgentsModel(ScriptedAgentsModel):
    """The scripted model, telling ``cue`` once its final text has begun (where it may hang)."""

    def __init__(self, cue: Cue, *steps: Step) -> None:
        super().__init__(*steps)
        self.cue = cue

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        return self._cued(super().stream_response(*args, **kwargs))

    async def _cued(
        self, events: AsyncIterator[TResponseStreamEvent]
    ) -> AsyncIterator[TResponseStreamEvent]:
        async for event in events:
            yield event
            if event.type == TEXT_DELTA:
                await self.cue.final_started()


def _agent(recall: AgentsRecall, model: ScriptedAgentsModel) -> Agent[Any]:
    return Agent(name="assistant", instructions="Answer.", model=model, tools=[recall.tool])


def _consumer(recall: AgentsRecall, cue: Cue, way: str) -> Any:
    result = recall.run_streamed(_agent(recall, CuedAgentsModel(cue, *STEPS)), "Continue",
                                 **IDENTITY)

    async def consume() -> None:
        async for _ in result.stream_events():
            pass

    async def cancel_result() -> None:
        async with anyio.create_task_group() as tg:
            async def cancel_when_reached() -> None:
                await cue.reached.wait()
                result.cancel()
            tg.start_soon(cancel_when_reached)
            await consume()
            tg.cancel_scope.cancel()

    async def break_out() -> None:
        events = result.stream_events()
        async for event in events:
            if isinstance(event, RawResponsesStreamEvent) and event.data.type == TEXT_DELTA:
                break
        await events.aclose()

    return {"cancel": cancel_result, "break": break_out}.get(way, consume)


async def _cut_then_continue(
    hooks: RecallHooks, clock: ManualClock, cue: Cue, way: str
) -> None:
    recall = agents_recall(hooks)
    async with nothing_left_running():
        await stop(way, _consumer(recall, cue, way), cue)

    async def invoke(*steps: Step) -> CuedAgentsModel:
        model = CuedAgentsModel(cue, *steps)
        await recall.run(_agent(recall, model), "Continue", **IDENTITY)
        return model

    await continue_after_cut(hooks, clock, cue, invoke)


@pytest.mark.parametrize("point", CUT_POINTS)
@pytest.mark.parametrize("way", ["task", "scope", "cancel"])
async def test_a_cancelled_stream_keeps_claims_and_never_renews(
    tmp_path: Path, clock: ManualClock, way: str, point: str
) -> None:
    cue = Cue(point)
    async with cue_hooks(tmp_path, clock, cue) as hooks:
        await _cut_then_continue(hooks, clock, cue, way)


async def test_breaking_out_once_the_final_answer_streams_keeps_the_contract(
    tmp_path: Path, clock: ManualClock
) -> None:
    # Closing ``stream_events()`` waits for the run to finish (the SDK's rule; ``cancel()``
    # is how a host ends it early), so here the model does not hang after its first text.
    cue = Cue("final", armed=False)
    async with cue_hooks(tmp_path, clock, cue) as hooks:
        await _cut_then_continue(hooks, clock, cue, "break")
