"""A host stopping a streaming pydantic-ai run (``run_stream``, ``iter``,
``run_stream_events``) at each cut point leaves the recall contract intact (asyncio only).

After the cut: nothing is left running and no coroutine is left never awaited; only
``CancelledError`` reaches the host; a search cancelled mid-flight keeps its claim (sent again
by the next invocation it answers ``in_flight`` and is never searched again), a finished one
replays ``ok``; once the clock passes the run's original deadline the next invocation gets the
deadline notice, with no new round and no search; and nothing the cut invocation prepared
reaches a later one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCalls

from plugin import ManualClock
from runtime_hooks import RecallHooks
from runtime_hooks.adapters.pydantic_ai import RecallCapability, RunIdentity
from runtime_hooks.testing import Step
from runtime_hooks.testing.pydantic_ai import ScriptedModel

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

IDENTITY = RunIdentity(run_id=RUN_ID, scope="atlas", principal="ana")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # pydantic-ai does not run under trio


class CuedModel(ScriptedModel):
    """The scripted model, telling ``cue`` once its final text has begun (where it may hang)."""

    def __init__(self, cue: Cue, *steps: Step) -> None:
        self.cue = cue
        super().__init__(*steps)

    async def _respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        response = await super()._respond(messages, info)
        if isinstance(response.parts[0], TextPart):
            await self.cue.final_started()
        return response

    async def _stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        async for chunk in super()._stream(messages, info):
            yield chunk
            if isinstance(chunk, str):
                await self.cue.final_started()


def _consumer(agent: Agent[RunIdentity, str], api: str, breaks: bool) -> object:
    async def run_stream() -> None:
        async with agent.run_stream("Continue", deps=IDENTITY) as stream:
            async for _ in stream.stream_text(delta=True):
                if breaks:
                    break

    async def run_iter() -> None:
        async with agent.iter("Continue", deps=IDENTITY) as run:
            async for _ in run:
                pass

    async def run_stream_events() -> None:
        async with agent.run_stream_events("Continue", deps=IDENTITY) as events:
            async for event in events:
                text = ((isinstance(event, PartStartEvent) and isinstance(event.part, TextPart))
                        or (isinstance(event, PartDeltaEvent)
                            and isinstance(event.delta, TextPartDelta)))
                if breaks and text:
                    break

    return {"run_stream": run_stream, "iter": run_iter,
            "run_stream_events": run_stream_events}[api]


async def _cut_then_continue(
    hooks: RecallHooks, clock: ManualClock, cue: Cue, api: str, way: str
) -> None:
    agent = Agent(CuedModel(cue, *STEPS), deps_type=RunIdentity,
                  capabilities=[RecallCapability(hooks)])
    async with nothing_left_running():
        await stop(way, _consumer(agent, api, breaks=way == "break"), cue)  # type: ignore[arg-type]

    async def invoke(*steps: Step) -> CuedModel:
        model = CuedModel(cue, *steps)
        await agent.run("Continue", deps=IDENTITY, model=model)
        return model

    await continue_after_cut(hooks, clock, cue, invoke)


@pytest.mark.parametrize("point", CUT_POINTS)
@pytest.mark.parametrize("way", ["task", "scope"])
@pytest.mark.parametrize("api", ["run_stream", "iter", "run_stream_events"])
async def test_a_cancelled_stream_keeps_claims_and_never_renews(
    tmp_path: Path, clock: ManualClock, api: str, way: str, point: str
) -> None:
    cue = Cue(point)
    async with cue_hooks(tmp_path, clock, cue) as hooks:
        await _cut_then_continue(hooks, clock, cue, api, way)


@pytest.mark.parametrize("api", ["run_stream", "run_stream_events"])
async def test_breaking_out_once_the_final_answer_streams_keeps_the_contract(
    tmp_path: Path, clock: ManualClock, api: str
) -> None:
    cue = Cue("final")
    async with cue_hooks(tmp_path, clock, cue) as hooks:
        await _cut_then_continue(hooks, clock, cue, api, "break")
