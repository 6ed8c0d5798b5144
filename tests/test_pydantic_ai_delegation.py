"""pydantic-ai agent delegation: a tool that runs another agent inside the user's turn.

pydantic-ai's delegation pattern is a tool that calls ``delegate.run(..., deps=ctx.deps,
usage=ctx.usage)``. For the same host run, that inner run is part of the outer invocation (one
user turn): the automatic round ran once already, so the delegate's requests see the context
prepared for the turn and take no round of their own, and the searches keep the rounds they
are owed. A delegate given another run's identity is its own invocation and never sees the
outer run's context. Asyncio only (pydantic-ai does not run under trio).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from plugin import ManualClock
from runtime_hooks import RecallHooks
from runtime_hooks.adapters.pydantic_ai import RecallCapability, RunIdentity

from ._pydantic_ai_env import ANA, BOB, private_note_hooks

pytestmark = [pytest.mark.anyio]


Step = str | list[tuple[str, dict[str, Any], str]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # pydantic-ai does not run under trio


@pytest.fixture
async def hooks(tmp_path: Path, clock: ManualClock) -> AsyncIterator[RecallHooks]:
    async with private_note_hooks(tmp_path, clock) as hooks:
        yield hooks


class _Script:
    """A FunctionModel playing ``steps`` (text, or tool calls), noting each request's
    instructions."""

    def __init__(self, *steps: Step) -> None:
        self.steps = steps
        self.instructions: list[str] = []

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.instructions.append(info.instructions or "")
        step = self.steps[len(self.instructions) - 1]
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=call_id)
                                    for name, args, call_id in step])

    @property
    def model(self) -> FunctionModel:
        return FunctionModel(self.respond)


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    return {part.tool_call_id: part.content for message in messages
            if isinstance(message, ModelRequest) for part in message.parts
            if isinstance(part, ToolReturnPart)}


async def _kinds(hooks: RecallHooks, run_id: str) -> list[str]:
    return [r.kind.value for r in await hooks.allowance.ledger.reservations(run_id)]


def _delegating(
    outer: _Script, inner: _Script, capability: RecallCapability,
    inner_capability: RecallCapability, inner_deps: RunIdentity | None = None,
) -> tuple[Agent[RunIdentity, str], list[Any]]:
    delegate = Agent(inner.model, deps_type=RunIdentity, capabilities=[inner_capability])
    agent = Agent(outer.model, deps_type=RunIdentity, capabilities=[capability])
    inner_messages: list[Any] = []

    @agent.tool
    async def research(ctx: RunContext[RunIdentity], question: str) -> str:
        result = await delegate.run(question, deps=inner_deps or ctx.deps, usage=ctx.usage)
        inner_messages.extend(result.all_messages())
        return result.output

    return agent, inner_messages


@pytest.mark.parametrize("shared", [True, False], ids=["one_capability", "two_capabilities"])
async def test_a_delegate_of_the_same_run_takes_no_second_automatic_round(
    hooks: RecallHooks, shared: bool
) -> None:
    capability = RecallCapability(hooks)
    inner = _Script([("search_memory", {"query": "invoice backfill"}, "i1")], "found it")
    outer = _Script([("research", {"question": "the backfill"}, "r1")], "Done.")
    agent, inner_messages = _delegating(outer, inner, capability,
                                        capability if shared else RecallCapability(hooks))
    result = await agent.run("Continue", deps=ANA)

    assert result.output == "Done."
    # One automatic round for the whole turn; the delegate's search got round 2's slot.
    assert await _kinds(hooks, ANA.run_id) == ["automatic", "deliberate"]
    assert _returns(inner_messages)["i1"]["status"] == "ok"
    # Every request of the turn, the delegate's included, read the one prepared context.
    texts = outer.instructions + inner.instructions
    assert len(texts) == 4 and len(set(texts)) == 1
    assert "ana's private note" in texts[0]


async def test_a_delegate_for_another_run_is_its_own_invocation(hooks: RecallHooks) -> None:
    capability = RecallCapability(hooks)
    inner = _Script("found it")
    outer = _Script([("research", {"question": "the backfill"}, "r1")], "Done.")
    agent, _ = _delegating(outer, inner, capability, capability, inner_deps=BOB)
    await agent.run("Continue", deps=ANA)

    assert await _kinds(hooks, ANA.run_id) == ["automatic"]
    assert await _kinds(hooks, BOB.run_id) == ["automatic"]
    assert all("bob's private note" in text for text in inner.instructions)
    assert not any("ana's" in text for text in inner.instructions)
    assert not any("bob's" in text for text in outer.instructions)


async def test_the_next_turn_after_a_delegation_prepares_again(hooks: RecallHooks) -> None:
    """The shared context ends with the outer run: the next turn takes its own round."""
    capability = RecallCapability(hooks)
    inner = _Script("found it")
    outer = _Script([("research", {"question": "the backfill"}, "r1")], "Done.", "Again.")
    agent, _ = _delegating(outer, inner, capability, capability)
    await agent.run("Continue", deps=ANA)
    await agent.run("Continue", deps=ANA)
    assert await _kinds(hooks, ANA.run_id) == ["automatic", "automatic"]



def _scheduling(
    capability: RecallCapability, outer: _Script, inner: _Script
) -> tuple[Agent[RunIdentity, str], Any, list[Any]]:
    """An agent whose tool schedules a follow-up run of another agent for the same host run
    in a background task, which waits for ``go``."""
    import asyncio

    delegate = Agent(inner.model, deps_type=RunIdentity, capabilities=[capability])
    agent = Agent(outer.model, deps_type=RunIdentity, capabilities=[capability])
    go = asyncio.Event()
    later: list[asyncio.Task[Any]] = []

    @agent.tool
    async def schedule(ctx: RunContext[RunIdentity]) -> str:
        async def follow_up() -> None:
            await go.wait()
            await delegate.run("What changed in the cutover plan?", deps=ctx.deps)

        later.append(asyncio.create_task(follow_up()))
        return "scheduled"

    return agent, go, later


async def test_a_follow_up_that_starts_after_the_turn_ended_prepares_its_own_round(
    hooks: RecallHooks,
) -> None:
    """The follow-up starts once the outer invocation has ended: it is the next turn, so it
    prepares its own automatic round instead of sharing the ended turn's."""
    inner, outer = _Script("follow-up done"), _Script([("schedule", {}, "s1")], "Done.")
    agent, go, later = _scheduling(RecallCapability(hooks), outer, inner)
    await agent.run("Continue", deps=ANA)
    go.set()
    await later[0]
    assert await _kinds(hooks, ANA.run_id) == ["automatic", "automatic"]


async def test_a_follow_up_after_the_deadline_is_not_served_the_ended_turns_evidence(
    hooks: RecallHooks, clock: ManualClock
) -> None:
    inner, outer = _Script("follow-up done"), _Script([("schedule", {}, "s1")], "Done.")
    agent, go, later = _scheduling(RecallCapability(hooks), outer, inner)
    await agent.run("Continue", deps=ANA)
    assert "ana's private note" in outer.instructions[0]
    clock.advance(60.0)  # far past the run's original 10 s deadline
    go.set()
    await later[0]
    assert len(inner.instructions) == 1
    assert "ana's private note" not in inner.instructions[0]


async def test_a_delegate_that_started_in_the_turn_keeps_its_round_after_the_turn_ends(
    hooks: RecallHooks,
) -> None:
    """A delegate started in a background task whose first request comes while the turn runs
    shares the turn; its later requests, after the outer run returned, are the same
    invocation: no second automatic round, the same context."""
    import asyncio

    capability = RecallCapability(hooks)
    inner = _Script([("wait_outer", {}, "w1")], "inner done")
    outer = _Script([("spawn", {}, "s1")], "outer done")
    delegate = Agent(inner.model, deps_type=RunIdentity, capabilities=[capability])
    agent = Agent(outer.model, deps_type=RunIdentity, capabilities=[capability])
    outer_done, first_request = asyncio.Event(), asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []

    @delegate.tool
    async def wait_outer(ctx: RunContext[RunIdentity]) -> str:
        first_request.set()
        await outer_done.wait()
        return "ok"

    @agent.tool
    async def spawn(ctx: RunContext[RunIdentity]) -> str:
        tasks.append(asyncio.create_task(delegate.run("help", deps=ctx.deps)))
        await first_request.wait()  # the delegate's first request is in this turn
        return "spawned"

    await agent.run("Continue", deps=ANA)
    outer_done.set()
    await tasks[0]
    assert await _kinds(hooks, ANA.run_id) == ["automatic"]
    assert inner.instructions[0] == inner.instructions[1] == outer.instructions[0]


async def test_a_run_an_ended_delegate_scheduled_shares_the_turn_still_running(
    hooks: RecallHooks,
) -> None:
    """A's tool awaits delegate B; B's tool schedules C and B ends; C runs while A's tool still
    runs: one user turn, one automatic round."""
    capability = RecallCapability(hooks)
    a, b, c = (_Script([("delegate", {}, "d1")], "A done"),
               _Script([("schedule", {}, "s1")], "B done"), _Script("C done"))
    second, b_done, tasks = _scheduling(capability, b, c)
    first = Agent(a.model, deps_type=RunIdentity, capabilities=[capability])

    @first.tool
    async def delegate(ctx: RunContext[RunIdentity]) -> str:
        out = await second.run("help", deps=ctx.deps, usage=ctx.usage)
        b_done.set()
        await tasks[0]  # C runs entirely inside A's turn
        return out.output

    await first.run("Continue", deps=ANA)
    assert await _kinds(hooks, ANA.run_id) == ["automatic"]
    assert c.instructions == [a.instructions[0]]


@pytest.mark.parametrize("runs", [("thread", "loop"), ("thread", "thread")])
async def test_run_sync_in_a_worker_thread_beside_other_runs_recalls_on_the_hooks_loop(
    hooks: RecallHooks, runs: tuple[str, str]
) -> None:
    # run_sync runs the agent on an event loop of its own; the ledger and the store belong to
    # the loop the hooks were opened on (their locks, connections and pools). Built in that
    # loop, the capability forwards its recall there, so runs on two loops at once both end.
    import asyncio
    import functools
    import gc
    import threading

    import anyio

    capability = RecallCapability(hooks)
    results: dict[str, Any] = {}

    def agent() -> Agent[RunIdentity, str]:
        script = _Script([("search_memory", {"query": "invoice backfill"}, "c1"),
                          ("search_memory", {"query": "cutover"}, "c2")], "Done.")
        return Agent(script.model, deps_type=RunIdentity, capabilities=[capability])

    def in_thread(run_id: str, done: threading.Event) -> None:
        loop = asyncio.new_event_loop()  # the loop run_sync takes, closed when it is done
        asyncio.set_event_loop(loop)
        try:
            deps = RunIdentity(run_id=run_id, scope=ANA.scope, principal=ANA.principal)
            results[run_id] = _returns(agent().run_sync("Continue", deps=deps).all_messages())
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
            asyncio.set_event_loop(None)
            done.set()

    async def on_loop(run_id: str) -> None:
        deps = RunIdentity(run_id=run_id, scope=ANA.scope, principal=ANA.principal)
        results[run_id] = _returns((await agent().run("Continue", deps=deps)).all_messages())

    finished: list[threading.Event] = []
    async with anyio.create_task_group() as group:
        for index, where in enumerate(runs):
            if where == "loop":
                group.start_soon(on_loop, f"r{index}")
            else:  # a daemon thread: a hang fails the test instead of holding the suite
                done = threading.Event()
                finished.append(done)
                threading.Thread(target=in_thread, args=(f"r{index}", done),
                                 daemon=True).start()
        for done in finished:
            assert await anyio.to_thread.run_sync(functools.partial(done.wait, 30.0))
    for index in range(len(runs)):
        assert {call: result["status"] for call, result in results[f"r{index}"].items()} \
            == {"c1": "ok", "c2": "ok"}
        usage = await hooks.allowance.ledger.usage(f"r{index}")
        assert (usage.rounds, usage.executed) == (2, 3)
    gc.collect()  # a loop left open would warn here, not in a later test
