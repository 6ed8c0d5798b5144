"""pydantic-ai runs driven by hand in one task: each run keeps its own invocation.

pydantic-ai hands what ``wrap_run`` binds to the caller's task, so two ``iter`` (or
``run_stream``) blocks open at once in one task both run their hooks there. Each must still
prepare its own automatic round, under its own identity, and show its model only its own
context. Asyncio only (pydantic-ai does not run under trio).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from plugin import ManualClock
from runtime_hooks import RecallHooks
from runtime_hooks.adapters.pydantic_ai import RecallCapability, RunIdentity

from ._pydantic_ai_env import ANA, BOB, private_note_hooks

pytestmark = [pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # pydantic-ai does not run under trio


@pytest.fixture
async def hooks(tmp_path: Path, clock: ManualClock) -> AsyncIterator[RecallHooks]:
    async with private_note_hooks(tmp_path, clock) as hooks:
        yield hooks


class _Script:
    """One search (``call_id``), then a text answer; the instructions of each request."""

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self.instructions: list[str] = []

    def _searching(self, info: AgentInfo) -> bool:
        self.instructions.append(info.instructions or "")
        return len(self.instructions) == 1

    async def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if self._searching(info):
            return ModelResponse(
                parts=[ToolCallPart("search_memory", {"query": "notes"}, tool_call_id=self.call_id)]
            )
        return ModelResponse(parts=[TextPart("done")])

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        if self._searching(info):
            yield {
                0: DeltaToolCall(
                    "search_memory", json.dumps({"query": "notes"}), tool_call_id=self.call_id
                )
            }
        else:
            yield "done"

    def agent(self, capability: RecallCapability) -> Agent[Any]:
        return Agent(
            FunctionModel(self.respond, stream_function=self.stream),
            deps_type=RunIdentity,
            capabilities=[capability],
        )


async def _usage(hooks: RecallHooks, run_id: str) -> tuple[int, int, int]:
    usage = await hooks.allowance.ledger.usage(run_id)
    return usage.rounds, usage.reserved, usage.executed


async def test_two_iter_runs_driven_in_turn_in_one_task_keep_their_own_invocation(
    hooks: RecallHooks,
) -> None:
    capability = RecallCapability(hooks)
    ana, bob = _Script("a1"), _Script("b1")
    async with ana.agent(capability).iter("Continue", deps=ANA) as run_a:
        async with bob.agent(capability).iter("Continue", deps=BOB) as run_b:
            node_a, node_b = run_a.next_node, run_b.next_node
            while not (Agent.is_end_node(node_a) and Agent.is_end_node(node_b)):
                if not Agent.is_end_node(node_a):
                    node_a = await run_a.next(node_a)
                if not Agent.is_end_node(node_b):
                    node_b = await run_b.next(node_b)

    for script, own, other in ((ana, "ana", "bob"), (bob, "bob", "ana")):
        assert len(script.instructions) == 2
        assert all(f"{own}'s private note" in text for text in script.instructions)
        assert not any(f"{other}'s" in text for text in script.instructions)
    # each run: its own automatic round, then its own search round
    assert await _usage(hooks, ANA.run_id) == (2, 3, 2)
    assert await _usage(hooks, BOB.run_id) == (2, 3, 2)


async def test_a_run_stream_opened_inside_another_keeps_each_invocation_apart(
    hooks: RecallHooks,
) -> None:
    capability = RecallCapability(hooks)
    ana, bob = _Script("a1"), _Script("b1")
    async with ana.agent(capability).run_stream("Continue", deps=ANA) as stream_a:
        async with bob.agent(capability).run_stream("Continue", deps=BOB) as stream_b:
            assert await stream_a.get_output() == "done"
            assert await stream_b.get_output() == "done"

    assert ana.instructions and all("ana's private note" in t for t in ana.instructions)
    assert bob.instructions and all("bob's private note" in t for t in bob.instructions)
    assert not any("bob's" in t for t in ana.instructions)
    assert not any("ana's" in t for t in bob.instructions)
    assert await _usage(hooks, ANA.run_id) == (2, 3, 2)
    assert await _usage(hooks, BOB.run_id) == (2, 3, 2)
