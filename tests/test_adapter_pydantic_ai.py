"""The pydantic-ai adapter in pydantic-ai's real agent loop, offline (FunctionModel; asyncio).

The fake model answers the first request with six parallel ``search_memory`` calls and every
later one with text, and records what it was sent, so each test asserts what the model saw
beside the ledger's counts. Queries are about the demo's seeded memories.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import AgentNode, WrapNodeRunHandler
from pydantic_ai.exceptions import RunCancelled
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.tools import ToolDefinition

from plugin import AllowancePolicy, ManualClock, WorkingState, compose_baseline
from plugin.control import AttemptKind, AttemptOutcome
from plugin.memory.enforce import AttemptHandle
from plugin.memory.pipeline import MemoryRetriever
from plugin.memory.preparation import PreparedRecall
from runtime_hooks import RecallHooks
from runtime_hooks.adapters import SEARCH_TOOL
from runtime_hooks.adapters.pydantic_ai import (
    RecallCapability,
    RunIdentity,
    RunIdentityError,
)
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed
from runtime_hooks.hooks import ToolCall

pytestmark = [pytest.mark.anyio]

QUERIES = (
    "invoice backfill dry-run",
    "currency rounding rule",
    "cutover date",
    "deploy window",
    "rollback runbook",
    "billing migration kickoff",
)
IDENTITY = RunIdentity(run_id="host-run-1", scope=SCOPE, principal=PRINCIPAL)
START_WALL = 1_800_000_000.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # pydantic-ai does not run under trio

# The ``clock`` fixture (tests/conftest.py) starts at START_WALL.


async def _open(tmp_path: Path, clock: ManualClock, policy: AllowancePolicy) -> Any:
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db",
                          policy=policy)
    return open_hooks(config, clock=clock)


@pytest.fixture
async def hooks(tmp_path: Path, clock: ManualClock) -> AsyncIterator[RecallHooks]:
    async with await _open(tmp_path, clock, AllowancePolicy()) as hooks:
        await seed(_store(hooks))
        yield hooks


def _store(hooks: RecallHooks) -> Any:
    assert isinstance(hooks.retriever, MemoryRetriever)
    return hooks.retriever.store


@attrs.define
class SixSearches:
    """A FunctionModel script: six parallel searches (plus ``extra``), then "done"."""

    extra: tuple[ToolCallPart, ...] = ()
    on_calls: Callable[[], None] | None = None
    """Runs as the model emits its calls: between the automatic round and the tools."""
    requests: list[list[ModelMessage]] = attrs.Factory(list)
    instructions: list[str | None] = attrs.Factory(list)
    tool_names: list[list[str]] = attrs.Factory(list)

    def _calls(self) -> list[ToolCallPart]:
        if self.on_calls is not None:
            self.on_calls()
        searches = [
            ToolCallPart(SEARCH_TOOL.name, {"query": query}, tool_call_id=f"c{i}")
            for i, query in enumerate(QUERIES)
        ]
        return [*searches, *self.extra]

    def _record(self, messages: list[ModelMessage], info: AgentInfo) -> bool:
        self.requests.append(list(messages))
        self.instructions.append(info.instructions)
        self.tool_names.append([tool.name for tool in info.function_tools])
        return len(self.requests) == 1

    async def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if self._record(messages, info):
            return ModelResponse(parts=self._calls())
        return ModelResponse(parts=[TextPart("done")])

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        if self._record(messages, info):
            yield {
                i: DeltaToolCall(part.tool_name, json.dumps(part.args),
                                 tool_call_id=part.tool_call_id)
                for i, part in enumerate(self._calls())
            }
        else:
            yield "done"

    def model(self) -> FunctionModel:
        return FunctionModel(self.respond, stream_function=self.stream)


def _returns(messages: Sequence[ModelMessage]) -> dict[str, Any]:
    """The tool results of the last request, by call id."""
    last = messages[-1]
    assert isinstance(last, ModelRequest)
    return {p.tool_call_id: p.content for p in last.parts if isinstance(p, ToolReturnPart)}


def _agent(model: SixSearches, capability: AbstractCapability[Any], **kwargs: Any) -> Agent[Any]:
    return Agent(model.model(), deps_type=RunIdentity, capabilities=[capability], **kwargs)


async def _drain(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
    async for _ in events:
        pass


async def _drive(agent: Agent[Any], mode: str, **kwargs: Any) -> None:
    if mode == "run":
        await agent.run("Continue", deps=IDENTITY, **kwargs)
    elif mode == "iter":
        async with agent.iter("Continue", deps=IDENTITY, **kwargs) as run:
            async for _ in run:
                pass
    elif mode == "run_stream":
        async with agent.run_stream("Continue", deps=IDENTITY, **kwargs) as stream:
            await stream.get_output()
    else:
        assert mode == "events"
        await agent.run("Continue", deps=IDENTITY, event_stream_handler=_drain, **kwargs)


async def _usage(hooks: RecallHooks, run_id: str = IDENTITY.run_id) -> tuple[int, int, int, int]:
    usage = await hooks.allowance.ledger.usage(run_id)
    return usage.rounds, usage.reserved, usage.executed, usage.refused


async def _slots(hooks: RecallHooks, kind: AttemptKind) -> list[int]:
    return sorted(
        trace.slot for trace in await hooks.allowance.ledger.attempts(IDENTITY.run_id)
        if trace.kind == kind.value
    )


def _by_status(returns: dict[str, Any]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for call_id, content in sorted(returns.items()):
        grouped.setdefault(content["status"], []).append(call_id)
    return grouped


# -- the required offline runs ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["run", "iter", "run_stream", "events"])
async def test_automatic_round_then_one_batch_two_slots_four_typed_refusals(
    hooks: RecallHooks, mode: str
) -> None:
    model = SixSearches()
    capability = RecallCapability(hooks, working_state=lambda ctx: STATE)
    await _drive(_agent(model, capability), mode)

    assert len(model.requests) == 2
    # The automatic round's evidence reached the first request's instructions.
    assert model.instructions[0] is not None
    assert "Recalled memory:" in model.instructions[0]
    assert "[correction c-snapshot]" in model.instructions[0]
    returns = _returns(model.requests[1])
    assert sorted(returns) == [f"c{i}" for i in range(6)]
    grouped = _by_status(returns)
    assert len(grouped["ok"]) == 2 and len(grouped["refused"]) == 4
    for call_id in grouped["refused"]:
        refusal = returns[call_id]["refusal"]
        assert refusal["status"] == "recall_bounded" and refusal["reason"] == "slots"
        assert "not evidence" in refusal["message"]
    # The automatic round took slots 1-2 (base ran; no people, so no delta), the batch 3 and 4.
    assert await _slots(hooks, AttemptKind.BASE) == [1]
    assert await _slots(hooks, AttemptKind.DELIBERATE) == [3, 4]
    # The next request of the same invocation sees the same prepared context and takes no
    # round: no third round is asked for, so none is refused.
    assert model.instructions[1] == model.instructions[0]
    # rounds, reserved, executed, refused: 2 rounds of 2 slots; base + 2 searches ran;
    # the 4 attempts without a slot were refused.
    assert await _usage(hooks) == (2, 4, 3, 4)



@pytest.mark.parametrize("framework_timeout", [None, 30.0])
async def test_automatic_round_and_tool_calls_share_one_deadline(
    hooks: RecallHooks, clock: ManualClock, framework_timeout: float | None
) -> None:
    """Past the allowance's 10 s between the model request and the tools: every call is
    refused with reason deadline; a later framework deadline does not extend it."""
    model = SixSearches(on_calls=lambda: clock.advance(10.5))
    kwargs = {} if framework_timeout is None else {"timeout": framework_timeout}
    await _drive(_agent(model, RecallCapability(hooks)), "run", **kwargs)

    returns = _returns(model.requests[1])
    assert _by_status(returns) == {"refused": [f"c{i}" for i in range(6)]}
    assert {content["refusal"]["reason"] for content in returns.values()} == {"deadline"}
    usage = await hooks.allowance.ledger.usage(IDENTITY.run_id)
    assert usage.deadline_wall == START_WALL + 10.0
    # Only the automatic round was reserved; the batch's round was refused at its deadline.
    assert (usage.rounds, usage.reserved, usage.executed) == (1, 2, 1)


@attrs.define
class _ManualRunClock(AbstractCapability[Any]):
    """Measures pydantic-ai's ``run(timeout=)`` against the test's ManualClock."""

    clock: ManualClock

    def get_run_clock(self) -> Callable[[], datetime]:
        return lambda: datetime.fromtimestamp(self.clock.wall(), tz=timezone.utc)


@pytest.mark.parametrize("automatic", [True, "per_request"])
async def test_the_framework_deadline_when_earlier_bounds_recall_too(
    tmp_path: Path, clock: ManualClock, automatic: bool | str
) -> None:
    """``run(timeout=30)`` under a 60 s allowance: at 40 s the batch is refused (deadline)
    without reserving, although the permit would still have 20 s."""
    async with await _open(tmp_path, clock, AllowancePolicy(deadline_s=60.0)) as hooks:
        await seed(_store(hooks))
        model = SixSearches(on_calls=lambda: clock.advance(40.0))
        agent = Agent(model.model(), deps_type=RunIdentity,
                      capabilities=[_ManualRunClock(clock),
                                    RecallCapability(hooks, automatic=automatic)])
        await agent.run("Continue", deps=IDENTITY, timeout=30.0)

        returns = _returns(model.requests[1])
        assert _by_status(returns) == {"refused": [f"c{i}" for i in range(6)]}
        assert {content["refusal"]["reason"] for content in returns.values()} == {"deadline"}
        assert model.instructions[1] is not None
        if automatic == "per_request":
            # The next request's automatic round is not run either: the notice says deadline.
            assert "recall deadline has passed" in model.instructions[1]
        else:  # the invocation's context, prepared before the first request, unchanged
            assert model.instructions[1] == model.instructions[0]
        usage = await hooks.allowance.ledger.usage(IDENTITY.run_id)
        assert usage.deadline_wall == START_WALL + 60.0  # the allowance's own, unchanged
        assert (usage.rounds, usage.reserved, usage.executed) == (1, 2, 1)


@attrs.define
class _CancelInFlight:
    """A retriever that takes its slot, then has the framework cancel the run mid-search."""

    inner: MemoryRetriever
    ctxs: list[RunContext[Any]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def search(self, prepared: PreparedRecall, handle: AttemptHandle, **kwargs: Any) -> Any:
        if handle.kind is not AttemptKind.DELIBERATE:
            return await self.inner.search(prepared, handle, **kwargs)
        # The hooks hold this call's slot: cancel the run while it searches.
        self.ctxs[-1].cancel()  # what pydantic-ai's deadline timer does (expiry = cancel)
        await anyio.sleep_forever()
        raise AssertionError("the run was cancelled inside the attempt")


@attrs.define
class _KeepContext(AbstractCapability[Any]):
    ctxs: list[RunContext[Any]]

    async def before_node_run(self, ctx: RunContext[Any], *, node: AgentNode[Any]) -> Any:
        self.ctxs.append(ctx)
        return node


async def test_the_frameworks_cancellation_ends_in_flight_searches(hooks: RecallHooks) -> None:
    """The run's end (its deadline or a cancel) reaches searches in flight: they stop, and
    their slots stay consumed; the permit never outlives the framework's run."""
    ctxs: list[RunContext[Any]] = []
    assert isinstance(hooks.retriever, MemoryRetriever)
    hooks = attrs.evolve(hooks, retriever=_CancelInFlight(hooks.retriever, ctxs))
    model = SixSearches()
    agent = Agent(model.model(), deps_type=RunIdentity,
                  capabilities=[_KeepContext(ctxs), RecallCapability(hooks)])
    with anyio.fail_after(10), pytest.raises(RunCancelled):
        await agent.run("Continue", deps=IDENTITY)

    traces = await hooks.allowance.ledger.attempts(IDENTITY.run_id)
    deliberate = [t for t in traces if t.kind == AttemptKind.DELIBERATE.value]
    # Calls take their slots in call order; the first search cancels the run at once, so the
    # second call may not have reached its slot. Whatever started was cancelled, and the
    # round's slots stay consumed (no refund).
    assert sorted(t.slot for t in deliberate) in ([3], [3, 4])
    assert {t.outcome for t in deliberate} == {AttemptOutcome.CANCELLED}
    rounds, reserved, executed, _ = await _usage(hooks)
    assert (rounds, reserved, executed) == (2, 4, 1 + len(deliberate))
    assert len(model.requests) == 1  # no tool result ever reached a model


# -- resume, and the designs that lose calls --------------------------------------------------


async def test_approval_resume_skips_answered_calls_and_never_reserves_again(
    hooks: RecallHooks,
) -> None:
    """Six searches and one tool needing approval: the first run ends deferred; the resume
    (a new pydantic-ai run id, and here a fresh capability, as after a restart) sees the
    answered calls again and must not open a round for them."""
    model = SixSearches(extra=(ToolCallPart("deploy", {}, tool_call_id="d1"),))
    run_ids: list[str] = []

    def agent(capability: RecallCapability) -> Agent[Any]:
        built = _agent(model, capability, output_type=[str, DeferredToolRequests])

        @built.tool(requires_approval=True)
        async def deploy(ctx: RunContext[Any]) -> str:
            run_ids.append(str(ctx.run_id))
            return "deployed"

        return built

    first = await agent(RecallCapability(hooks, automatic=False)).run("Continue",
                                                                      deps=IDENTITY)
    assert isinstance(first.output, DeferredToolRequests)
    assert [call.tool_call_id for call in first.output.approvals] == ["d1"]
    after_first = await _usage(hooks)
    assert after_first == (1, 4, 4, 2)

    second = await agent(RecallCapability(hooks, automatic=False)).run(
        message_history=first.all_messages(), deps=IDENTITY,
        deferred_tool_results=DeferredToolResults(approvals={"d1": True}),
    )
    assert second.output == "done"
    assert run_ids and run_ids[0] != first.run_id  # pydantic-ai's run id is new on resume
    assert await _usage(hooks) == after_first
    returns = _returns(model.requests[-1])
    assert returns["d1"] == "deployed"
    assert len(_by_status({k: v for k, v in returns.items() if k != "d1"})["ok"]) == 4


async def test_a_batch_seen_twice_by_one_capability_reserves_once(hooks: RecallHooks) -> None:
    """The same host run on the same capability (a resume in one process) reuses stored
    results: a second run replaying the response with all calls unanswered opens no round."""
    capability = RecallCapability(hooks, automatic=False)
    model = SixSearches()
    await _drive(_agent(model, capability), "run")
    assert await _usage(hooks) == (1, 4, 4, 2)
    again = SixSearches()
    await _drive(_agent(again, capability), "run")
    assert await _usage(hooks) == (1, 4, 4, 2)
    assert _returns(again.requests[1]) == _returns(model.requests[1])


class _PerCall(RecallCapability):
    """The losing design: no batch hook, so each tool call opens its own round."""

    async def before_node_run(self, ctx: RunContext[Any], *, node: AgentNode[Any]) -> Any:
        return node

    async def after_model_request(self, ctx: RunContext[Any], *, request_context: Any,
                                  response: Any) -> Any:
        return response


async def test_regression_per_call_dispatch_loses_calls(hooks: RecallHooks) -> None:
    model = SixSearches()
    await _drive(_agent(model, _PerCall(hooks)), "run")

    returns = _returns(model.requests[1])
    grouped = _by_status(returns)
    assert len(grouped["ok"]) == 1  # the batch design runs 2 (see above)
    assert {returns[c]["refusal"]["reason"] for c in grouped["refused"]} == {"rounds"}
    rounds, reserved, _, _ = await _usage(hooks)
    # Refused for rounds while slot 4 was never reserved.
    assert (rounds, reserved) == (2, 3)


# Each query's own memory, as the demo store holds it.
OWN_MEMORY = {"c0": "m-backfill", "c1": "m-rounding", "c2": "m-cutover", "c3": "m-deploy",
              "c4": "m-runbook", "c5": "m-kickoff"}


async def test_a_call_outside_a_batch_is_searched_with_its_own_query(hooks: RecallHooks) -> None:
    """The tool looks a call's stored result up before building anything for it; a call with
    none (here: no batch hook) still gets a round of its own, for its own query."""
    model = SixSearches()
    await _drive(_agent(model, _PerCall(hooks)), "run")

    returns = _returns(model.requests[1])
    [ok] = _by_status(returns)["ok"]
    assert OWN_MEMORY[ok] in returns[ok]["evidence_ids"]


class _WrapNodeRun(RecallCapability):
    """The wrong hook: the batch dispatched in ``wrap_node_run`` instead of before_node_run."""

    async def before_node_run(self, ctx: RunContext[Any], *, node: AgentNode[Any]) -> Any:
        return node

    async def wrap_node_run(self, ctx: RunContext[Any], *, node: AgentNode[Any],
                            handler: WrapNodeRunHandler[Any]) -> Any:
        await RecallCapability.before_node_run(self, ctx, node=node)
        return await handler(node)

    async def after_model_request(self, ctx: RunContext[Any], *, request_context: Any,
                                  response: Any) -> Any:
        return response  # nor the latest response's batch


@pytest.mark.parametrize(("mode", "ran"), [("run", 2), ("run_stream", 1)])
async def test_regression_wrap_node_run_loses_calls_under_run_stream(
    hooks: RecallHooks, mode: str, ran: int
) -> None:
    model = SixSearches()
    await _drive(_agent(model, _WrapNodeRun(hooks)), mode)
    grouped = _by_status(_returns(model.requests[1]))
    assert len(grouped["ok"]) == ran
    rounds, reserved, _, _ = await _usage(hooks)
    assert (rounds, reserved) == (2, 4 if ran == 2 else 3)


# -- the edge itself --------------------------------------------------------------------------


async def test_the_tool_is_rendered_from_search_tool(hooks: RecallHooks) -> None:
    model = SixSearches()
    agent = _agent(model, RecallCapability(hooks))
    await agent.run("Continue", deps=IDENTITY)
    assert model.tool_names[0] == [SEARCH_TOOL.name]
    toolset = RecallCapability(hooks).get_toolset()
    tool = toolset.tools[SEARCH_TOOL.name]
    assert tool.description == SEARCH_TOOL.description
    assert tool.function_schema.json_schema == SEARCH_TOOL.json_schema()


async def test_an_invalid_call_gets_no_slot_and_says_why(hooks: RecallHooks) -> None:
    model = SixSearches(extra=(
        ToolCallPart(SEARCH_TOOL.name, {"query": "backfill", "scope": "personal"},
                     tool_call_id="bad"),
    ))
    await _drive(_agent(model, RecallCapability(hooks, automatic=False)), "run")
    bad = _returns(model.requests[1])["bad"]
    assert bad["status"] == "invalid" and "scope" in bad["content"]
    assert await _usage(hooks) == (1, 4, 4, 2)  # six valid calls: one round, as before


async def test_the_run_identity_comes_from_the_host(hooks: RecallHooks) -> None:
    agent = _agent(SixSearches(), RecallCapability(hooks))
    with pytest.raises(RunIdentityError, match="RunIdentity"):
        await agent.run("Continue", deps=None)
    capability = RecallCapability(hooks)
    owner = capability.recall(IDENTITY)
    # Nothing bound yet: the registry leaves another identity for the ledger to judge.
    stranger = capability.recall(attrs.evolve(IDENTITY, scope="personal"))
    await owner.dispatch_batch([ToolCall(call_id="c0", arguments={"query": QUERIES[0]})])
    assert capability.recall(IDENTITY) is owner  # the ledger bound it: the registry keeps it
    with pytest.raises(RunIdentityError, match="another scope"):
        capability.recall(attrs.evolve(IDENTITY, scope="personal"))
    with pytest.raises(RunIdentityError):
        await stranger.dispatch_batch([ToolCall(call_id="c1", arguments={"query": QUERIES[1]})])
    assert await _usage(hooks) == (1, 1, 1, 0)



async def test_the_default_state_is_the_latest_user_message(hooks: RecallHooks) -> None:
    model = SixSearches()
    await _drive(_agent(model, RecallCapability(hooks)), "run")
    expected = compose_baseline(WorkingState("Continue"), scope=SCOPE, principal=PRINCIPAL)
    traces = await hooks.allowance.ledger.attempts(IDENTITY.run_id)
    assert [t.fingerprint for t in traces if t.kind == AttemptKind.BASE.value] == [
        expected.fingerprint
    ]
    # A bare "Continue" finds no evidence under the baseline query; corrections still show.
    assert model.instructions[0] is not None
    assert model.instructions[0].startswith("Current corrections:")


async def test_no_user_text_means_no_automatic_round(hooks: RecallHooks) -> None:
    model = SixSearches()
    agent = _agent(model, RecallCapability(hooks))
    await agent.run(message_history=[ModelRequest.user_text_prompt("   ")], deps=IDENTITY)
    assert model.instructions == [None, None]
    assert await _usage(hooks) == (1, 4, 4, 2)  # the batch's round only


def test_the_example_runs_offline_and_shows_what_the_model_saw() -> None:
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, str(root / "examples" / "pydantic_ai_agent.py")],
        capture_output=True, text=True, cwd=root, check=False, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "--- model request 2 ---" in out
    assert out.count('"status": "refused"') == 4 and out.count('"status": "ok"') == 2
    assert "rounds=2 reserved=4 executed=3 refused=4" in out
    assert "slot 3: deliberate (ok)" in out and "slot 4: deliberate (ok)" in out


def test_only_the_adapter_module_imports_pydantic_ai() -> None:
    code = (
        "import sys, runtime_hooks, runtime_hooks.adapters\n"
        "print('pydantic_ai' in sys.modules)\n"
        "import runtime_hooks.adapters.pydantic_ai\n"
        "print('pydantic_ai' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=root, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


# -- agent turns as the framework runs them: one automatic round per invocation ---------------


def _search(call_id: str, query: str) -> ToolCallPart:
    return ToolCallPart(SEARCH_TOOL.name, {"query": query}, tool_call_id=call_id)


@attrs.define
class Scripted:
    """A FunctionModel script: one response per request (tool calls, or text), recorded."""

    steps: list[list[ToolCallPart] | str]
    requests: list[list[ModelMessage]] = attrs.Factory(list)
    instructions: list[str | None] = attrs.Factory(list)

    def _next(self, messages: list[ModelMessage], info: AgentInfo) -> list[ToolCallPart] | str:
        self.requests.append(list(messages))
        self.instructions.append(info.instructions)
        index = len(self.requests) - 1
        return self.steps[index] if index < len(self.steps) else "done"

    async def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = self._next(messages, info)
        return ModelResponse(parts=[TextPart(step)] if isinstance(step, str) else list(step))

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        step = self._next(messages, info)
        if isinstance(step, str):
            yield step
        else:
            yield {
                i: DeltaToolCall(part.tool_name, json.dumps(part.args),
                                 tool_call_id=part.tool_call_id)
                for i, part in enumerate(step)
            }

    def agent(self, capability: AbstractCapability[Any]) -> Agent[Any]:
        agent = Agent(FunctionModel(self.respond, stream_function=self.stream),
                      deps_type=RunIdentity, capabilities=[capability])

        @agent.tool_plain
        def lookup_ticket() -> str:
            """The ticket the user works on."""
            return "BILL-7: invoice backfill"

        return agent


def _all_returns(messages: Sequence[ModelMessage]) -> dict[str, Any]:
    return {p.tool_call_id: p.content for m in messages if isinstance(m, ModelRequest)
            for p in m.parts if isinstance(p, ToolReturnPart)}


@pytest.mark.parametrize("mode", ["run", "iter", "run_stream", "events"])
async def test_another_tool_first_then_six_searches_two_run_on_slots_3_and_4(
    hooks: RecallHooks, mode: str
) -> None:
    """The turn the frameworks really run: a non-search tool, then six parallel searches.
    One automatic round for the whole invocation; the searches get round 2's slots 3-4."""
    model = Scripted([[ToolCallPart("lookup_ticket", {}, tool_call_id="t1")],
                      [_search(f"c{i}", q) for i, q in enumerate(QUERIES)]])
    await _drive(model.agent(RecallCapability(hooks, working_state=lambda ctx: STATE)), mode)

    assert len(model.requests) == 3
    assert model.instructions[0] is not None and "Recalled memory:" in model.instructions[0]
    # later requests see the invocation's context, and took no round of their own
    assert model.instructions[1] == model.instructions[2] == model.instructions[0]
    returns = _returns(model.requests[2])
    grouped = _by_status(returns)
    assert len(grouped["ok"]) == 2 and len(grouped["refused"]) == 4
    for call_id in grouped["refused"]:
        refusal = returns[call_id]["refusal"]
        assert (refusal["status"], refusal["reason"]) == ("recall_bounded", "slots")
        assert "Memory recall was bounded" in refusal["message"]
    assert await _slots(hooks, AttemptKind.DELIBERATE) == [3, 4]
    # one automatic round (slots 1-2), one deliberate round; only the 4 calls refused
    assert await _usage(hooks) == (2, 4, 3, 4)
    assert [r.kind.value for r in await hooks.allowance.ledger.reservations(IDENTITY.run_id)
            ] == ["automatic", "deliberate"]



async def test_two_searches_in_each_of_two_messages_without_automatic(
    hooks: RecallHooks,
) -> None:
    model = Scripted([[_search("a0", QUERIES[0]), _search("a1", QUERIES[1])],
                      [_search("b0", QUERIES[2]), _search("b1", QUERIES[3])]])
    await _drive(model.agent(RecallCapability(hooks, automatic=False)), "run")
    returns = _all_returns(model.requests[-1])
    assert {c: returns[c]["status"] for c in returns} == dict.fromkeys(returns, "ok")
    assert sorted(returns) == ["a0", "a1", "b0", "b1"]
    assert await _slots(hooks, AttemptKind.DELIBERATE) == [1, 2, 3, 4]
    assert await _usage(hooks) == (2, 4, 4, 0)



async def test_a_response_the_framework_refuses_for_a_repeated_call_id_reserves_nothing(
    hooks: RecallHooks,
) -> None:
    # pydantic-ai rejects a response whose tool calls repeat an id: its searches never run,
    # so no round is reserved for them.
    model = Scripted([[_search("c1", QUERIES[0]), _search("c1", QUERIES[0])]])
    with pytest.raises(Exception, match="tool_call_id"):
        await _drive(model.agent(RecallCapability(hooks, automatic=False)), "run")
    assert await _usage(hooks) == (0, 0, 0, 0)


@dataclasses.dataclass(frozen=True)
class _Answer:
    answer: str


@attrs.define
class OutputWithSearches:
    """A FunctionModel script: one response with an output tool call (``final_result`` with
    ``answer``) and two searches, then a valid output call."""

    answer: object
    searched: list[str] = attrs.Factory(list)
    requests: int = 0

    def _parts(self) -> list[ToolCallPart]:
        self.requests += 1
        if self.requests > 1:
            return [ToolCallPart("final_result", {"answer": "done"}, tool_call_id="out-2")]
        return [ToolCallPart("final_result", {"answer": self.answer}, tool_call_id="out"),
                *(ToolCallPart(SEARCH_TOOL.name, {"query": query}, tool_call_id=f"c{i}")
                  for i, query in enumerate(QUERIES[:2]))]

    async def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=self._parts())

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[DeltaToolCalls]:
        yield {i: DeltaToolCall(part.tool_name, json.dumps(part.args),
                                tool_call_id=part.tool_call_id)
               for i, part in enumerate(self._parts())}

    def model(self) -> FunctionModel:
        return FunctionModel(self.respond, stream_function=self.stream)


def _with_output(hooks: RecallHooks, script: OutputWithSearches, end_strategy: str) -> Agent[Any]:
    return Agent(script.model(), deps_type=RunIdentity, output_type=_Answer,
                 end_strategy=end_strategy,  # type: ignore[arg-type]
                 capabilities=[RecallCapability(hooks, automatic=False)])


@pytest.mark.parametrize("end_strategy", ["graceful", "exhaustive"])
@pytest.mark.parametrize("mode", ["run", "run_stream"])
async def test_searches_beside_a_final_output_share_one_round_however_the_run_streams(
    hooks: RecallHooks, end_strategy: str, mode: str
) -> None:
    # Under run_stream pydantic-ai runs the tools of a response whose output is final itself
    # (no CallToolsNode): its searches still take one round, distinct slots.
    await _drive(_with_output(hooks, OutputWithSearches("42"), end_strategy), mode)
    assert await _usage(hooks) == (1, 2, 2, 0)


async def test_under_run_stream_a_search_skipped_by_early_is_never_reserved(
    hooks: RecallHooks,
) -> None:
    await _drive(_with_output(hooks, OutputWithSearches("42"), "early"), "run_stream")
    assert await _usage(hooks) == (0, 0, 0, 0)


@pytest.mark.parametrize(("end_strategy", "answer", "expected"), [
    ("early", "42", (0, 0, 0, 0)),  # the output call succeeds: "Tool not executed"
    ("early", ["not", "text"], (1, 2, 2, 0)),  # every output call failed: the searches run
    ("graceful", "42", (1, 2, 2, 0)),
    ("exhaustive", "42", (1, 2, 2, 0)),
])
@pytest.mark.parametrize("mode", ["run", "iter", "events"])
async def test_searches_the_end_strategy_skips_are_never_reserved(
    hooks: RecallHooks, end_strategy: str, answer: object, expected: tuple[int, ...], mode: str
) -> None:
    """Under ``end_strategy="early"`` pydantic-ai runs no function tool of a response whose
    output tool call succeeds: its searches get no round and no search; when the output call
    fails, they run as one batch. Under the other strategies they always run."""
    await _drive(_with_output(hooks, OutputWithSearches(answer), end_strategy), mode)
    assert await _usage(hooks) == expected
    recorded = await hooks.replay([ToolCall(call_id="c0", arguments={"query": QUERIES[0]})],
                                  run_id=IDENTITY.run_id, scope=SCOPE, principal=PRINCIPAL)
    assert (recorded[0] is None) == (expected[0] == 0)  # no record of a search never run


async def test_a_reused_call_id_with_other_arguments_is_a_new_call(hooks: RecallHooks) -> None:
    """``c0`` for the backfill, then ``c0`` again for the cutover date: the second call gets
    its own search (its own round and slot), never the backfill's evidence."""
    model = Scripted([[_search("c0", "invoice backfill dry-run")],
                      [_search("c0", "cutover date")]])
    await _drive(model.agent(RecallCapability(hooks, automatic=False)), "run")

    first = _returns(model.requests[1])["c0"]
    second = _returns(model.requests[2])["c0"]
    assert (first["status"], second["status"]) == ("ok", "ok")
    assert await _slots(hooks, AttemptKind.DELIBERATE) == [1, 2]
    assert "m-backfill" in first["evidence_ids"]
    assert "m-cutover" in second["evidence_ids"] and "m-backfill" not in second["evidence_ids"]
    assert await _usage(hooks) == (2, 2, 2, 0)


async def test_a_genuine_replay_returns_the_stored_result(hooks: RecallHooks) -> None:
    """The same id and the same arguments on a re-run of the host's run: stored, no round."""
    capability = RecallCapability(hooks, automatic=False)
    first = Scripted([[_search("c0", "invoice backfill dry-run")]])
    await _drive(first.agent(capability), "run")
    again = Scripted([[_search("c0", '"invoice backfill dry-run"'[1:-1])]])
    await _drive(again.agent(capability), "run")
    assert _returns(again.requests[1]) == _returns(first.requests[1])
    assert await _usage(hooks) == (1, 1, 1, 0)


async def test_after_eviction_another_principal_is_still_refused(hooks: RecallHooks) -> None:
    """The run registry forgets (max_runs=1), the ledger does not: the run stays bound to the
    principal and scope of its first use."""
    capability = RecallCapability(hooks, automatic=False, max_runs=1)
    await _drive(Scripted([[_search("c0", QUERIES[0])]]).agent(capability), "run")
    other = RunIdentity(run_id="host-run-2", scope=SCOPE, principal=PRINCIPAL)
    await Scripted([[_search("c0", QUERIES[1])]]).agent(capability).run("Continue", deps=other)
    intruder = attrs.evolve(IDENTITY, principal="mallory")
    with pytest.raises(RunIdentityError, match="host-run-1"):
        await Scripted([[_search("c9", QUERIES[2])]]).agent(capability).run(
            "Continue", deps=intruder)
    assert await _usage(hooks) == (1, 1, 1, 0)  # the intruder reserved nothing


def test_one_run_identity_error_for_every_adapter() -> None:
    import plugin
    from plugin.errors import RecallboundError

    assert RunIdentityError is plugin.RunIdentityError
    assert issubclass(RunIdentityError, RecallboundError) and issubclass(RunIdentityError,
                                                                          ValueError)


@attrs.define
class _Evictor(AbstractCapability[Any]):
    """Before each tool runs, other runs push the host's run out of the capability's registry
    (``max_runs=1``): the window between a batch and its tools."""

    target: RecallCapability
    made: list[str] = attrs.Factory(list)

    async def before_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart,
                                  tool_def: ToolDefinition, args: Any) -> Any:
        run_id = f"other-{len(self.made)}"
        self.made.append(run_id)
        self.target.recall(RunIdentity(run_id=run_id, scope=SCOPE, principal=PRINCIPAL))
        return args


async def test_a_run_forgotten_between_its_batch_and_its_tools_is_not_dispatched_again(
    hooks: RecallHooks,
) -> None:
    """The searches that ran on slots 1-4 reach the model as ok, never as refused, although the
    registry forgot the run before each tool read its result: the invocation holds it."""
    capability = RecallCapability(hooks, automatic=False, max_runs=1)
    model = SixSearches()
    agent = Agent(model.model(), deps_type=RunIdentity,
                  capabilities=[_Evictor(capability), capability])
    await agent.run("Continue", deps=IDENTITY)
    grouped = _by_status(_returns(model.requests[1]))
    assert len(grouped["ok"]) == 4 and len(grouped["refused"]) == 2
    assert await _usage(hooks) == (1, 4, 4, 2)  # one round: nothing dispatched again
