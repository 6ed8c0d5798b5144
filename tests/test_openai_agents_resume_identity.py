"""The Agents SDK adapter: a resumed run with another principal or scope raises
``RunIdentityError`` itself, under ``recall.run`` and ``recall.run_streamed``.

A ``RunState`` resumed with its searches approved runs their tools before any other hook, so
the search tool's guardrail is where the ledger first sees the run's identity. The SDK wraps
other errors of a tool in its ``UserError``; the host must still catch the one error class
every other hook raises. Asyncio only (the SDK does not run under trio).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, RunState

from plugin import Evidence, ManualClock, SimpleRetriever
from plugin.errors import RunIdentityError
from runtime_hooks import RecallHooks
from runtime_hooks.adapters.openai_agents import AgentsRecall, agents_recall
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.testing import searches
from runtime_hooks.testing.openai_agents import ScriptedAgentsModel

pytestmark = [pytest.mark.anyio]

RUN = "agents-resumed-run"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Agents SDK does not run under trio


@pytest.fixture
def searched() -> list[str]:
    return []


@pytest.fixture
async def hooks(
    tmp_path: Path, clock: ManualClock, searched: list[str]
) -> AsyncIterator[RecallHooks]:
    async def search(request: Any) -> list[Evidence]:
        searched.append(request.principal)
        return [Evidence(id=f"{request.principal}-1", text=f"{request.principal}'s note")]

    config = RecallConfig(ledger_path=tmp_path / "ledger.db")
    async with open_hooks(config, clock=clock, retriever=SimpleRetriever(search)) as hooks:
        yield hooks


async def _resume(
    recall: AgentsRecall,
    agent: Agent[Any],
    state: RunState[Any],
    *,
    streamed: bool,
    scope: str,
    principal: str,
) -> None:
    config = RunConfig(tracing_disabled=True)
    if streamed:
        result = recall.run_streamed(
            agent, state, run_id=RUN, scope=scope, principal=principal, run_config=config
        )
        async for _ in result.stream_events():
            pass
    else:
        await recall.run(
            agent, state, run_id=RUN, scope=scope, principal=principal, run_config=config
        )


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize(
    ("scope", "principal"), [("atlas", "mallory"), ("other", "ana")], ids=["principal", "scope"]
)
async def test_a_resume_under_another_identity_raises_run_identity_error(
    hooks: RecallHooks, searched: list[str], streamed: bool, scope: str, principal: str
) -> None:
    recall = agents_recall(hooks)
    gated = dataclasses.replace(recall.tool, needs_approval=True)
    model = ScriptedAgentsModel(searches("invoice backfill", "cutover date"), "Done.")
    agent = Agent(name="assistant", instructions="You help Ana.", model=model, tools=[gated])
    paused = await recall.run(
        agent,
        "Continue",
        run_id=RUN,
        scope="atlas",
        principal="ana",
        run_config=RunConfig(tracing_disabled=True),
    )
    assert len(paused.interruptions) == 2
    before = await hooks.allowance.ledger.usage(RUN)
    saved = paused.to_state().to_json()

    # a new process: a new adapter over the same ledger, the state restored from JSON
    state = await RunState.from_json(agent, saved)
    for item in state.get_interruptions():
        state.approve(item)
    with pytest.raises(RunIdentityError, match=RUN):
        await _resume(
            agents_recall(hooks), agent, state, streamed=streamed, scope=scope, principal=principal
        )

    assert await hooks.allowance.ledger.usage(RUN) == before
    assert searched == ["ana", "ana", "ana"]  # the automatic round and the two searches
    assert len(model.requests) == 1  # the model never read anything of Ana's run
