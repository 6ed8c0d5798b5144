"""The OpenAI Agents SDK adapter, offline, with the SDK's own ScriptedModel (asyncio only).

Every run uses the real hooks (``open_hooks`` on a temporary ledger and store), the real
``Runner`` loop, ``RunConfig(tracing_disabled=True)`` and no API key; a socket guard fails
any test that tries the network.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
from agents import (
    Agent,
    FunctionTool,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    RunState,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailData,
    function_tool,
)
from agents.items import ModelResponse
from agents.run_config import CallModelData, ModelInputData
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from plugin import ManualClock, QueryStrategy, WorkingState
from runtime_hooks import RecallHooks
from runtime_hooks.adapters import SEARCH_TOOL
from runtime_hooks.adapters.openai_agents import (
    AgentsRecall,
    RecallRunner,
    RunIdentityError,
    RunNotBoundError,
    agents_recall,
    latest_user_request,
)
from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE
from runtime_hooks.hooks import ToolCall

from ._hooks_env import seeded_hooks

pytestmark = [pytest.mark.anyio]

RUN = "run-oai"
INSTRUCTIONS = "You are Ana's assistant."
QUERIES = ("invoice backfill", "rounding rule", "cutover date", "deploy window",
           "rollback runbook", "kickoff notes")
CALL_IDS = [f"call_{i}" for i in range(len(QUERIES))]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the SDK does not run under trio


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No API key, and any connection attempt fails the test."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a test tried the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


async def admit(experiment: str) -> bool:
    return experiment == "task_context"


def host_state(data: CallModelData[Any]) -> WorkingState:
    """The host's working state: the demo's task in progress, and the user's "Continue"."""
    return attrs.evolve(STATE, current_request=latest_user_request(data).current_request)



@pytest.fixture
async def hooks(tmp_path: Path, clock: ManualClock) -> AsyncIterator[RecallHooks]:
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db",
                          query_planning=QueryStrategy.TASK_CONTEXT, admission=admit)
    async with seeded_hooks(config, clock) as hooks:
        yield hooks


def six_calls() -> list[Any]:
    return [function_call(SEARCH_TOOL.name, {"query": q}, call_id=c)
            for q, c in zip(QUERIES, CALL_IDS, strict=True)]


def script() -> ScriptedModel:
    """A model that emits 6 parallel search calls, then answers."""
    return ScriptedModel([six_calls(), [assistant_message("Done.")]])


def agent(model: ScriptedModel, recall: AgentsRecall, *extra: Any) -> Agent[Any]:
    return Agent(name="assistant", instructions=INSTRUCTIONS, model=model,
                 tools=[recall.tool, *extra])


def config() -> RunConfig:
    return RunConfig(tracing_disabled=True)


async def run(recall: AgentsRecall, model: ScriptedModel, *, streamed: bool = False,
              input: Any = "Continue", **kwargs: Any) -> Any:
    kwargs.setdefault("run_config", config())
    the_agent = kwargs.pop("the_agent", None) or agent(model, recall)
    if streamed:
        result = recall.run_streamed(the_agent, input, run_id=RUN, scope=SCOPE,
                                     principal=PRINCIPAL, **kwargs)
        async for _ in result.stream_events():
            pass
        return result
    return await recall.run(the_agent, input, run_id=RUN, scope=SCOPE, principal=PRINCIPAL,
                            **kwargs)


def outputs(call: ModelCall) -> dict[str, dict[str, Any]]:
    """The tool outputs a model request carried, by call id, parsed from JSON."""
    return {
        item["call_id"]: json.loads(item["output"])
        for item in call.input
        if isinstance(item, Mapping) and item.get("type") == "function_call_output"
    }


async def usage(hooks: RecallHooks) -> tuple[int, int, int, int]:
    u = await hooks.allowance.ledger.usage(RUN)
    return u.rounds, u.reserved, u.executed, u.refused


async def slots(hooks: RecallHooks) -> list[tuple[int, str]]:
    return [(t.slot, t.kind) for t in await hooks.allowance.ledger.attempts(RUN)
            if t.slot is not None]


# -- the required behaviour ----------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_automatic_round_then_six_calls_two_run_four_refused_visibly(
    hooks: RecallHooks, streamed: bool
) -> None:
    recall = agents_recall(hooks, working_state=host_state)
    model = script()
    result = await run(recall, model, streamed=streamed)
    assert result.final_output == "Done."
    first, second = model.calls

    # The automatic round's context reached the first request's instructions.
    assert first.system_instructions is not None
    assert first.system_instructions.startswith(INSTRUCTIONS + "\n\n")
    assert "Current corrections:" in first.system_instructions
    assert "Recalled memory:" in first.system_instructions

    # The batch: 2 calls on slots 3 and 4, the other 4 refused, all visible next request.
    run_recall = recall.runner.recall_for(RUN, scope=SCOPE, principal=PRINCIPAL)
    ran = {c: run_recall.result(c) for c in CALL_IDS}
    ok = sorted(r.slot for r in ran.values() if r is not None and r.status == "ok"
                and r.slot is not None)
    assert ok == [3, 4]
    seen = outputs(second)
    assert list(seen) == CALL_IDS
    assert [v["status"] for v in seen.values()].count("ok") == 2
    refused = [v for v in seen.values() if v["status"] == "refused"]
    assert len(refused) == 4
    for value in refused:
        assert value["refusal"]["reason"] == "slots"
        assert value["refusal"]["status"] == "recall_bounded"
        assert "bounded" in value["content"] and "not evidence" in value["content"]
    # The second request of the invocation sees the same context and takes no round.
    assert second.system_instructions == first.system_instructions

    # The ledger: the automatic round (base, then the delta for Priya) on slots 1-2, the batch
    # on 3-4; 2 rounds, 4 reserved, 4 executed, 4 refused (the calls without a slot).
    assert await slots(hooks) == [(1, "base"), (2, "delta"), (3, "deliberate"),
                                  (4, "deliberate")]
    assert await usage(hooks) == (2, 4, 4, 4)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_per_request_runs_the_automatic_round_before_every_request(
    hooks: RecallHooks, streamed: bool
) -> None:
    recall = agents_recall(hooks, working_state=host_state, automatic="per_request")
    model = script()
    await run(recall, model, streamed=streamed)
    first, second = model.calls
    assert first.system_instructions is not None
    assert "Recalled memory:" in first.system_instructions
    # The second request's own round is refused (2 rounds used): the notice says so.
    assert second.system_instructions is not None
    assert "Note: Memory recall was bounded" in second.system_instructions
    assert await usage(hooks) == (2, 4, 4, 5)



@pytest.mark.parametrize("automatic", [True, "per_request"])
async def test_automatic_round_and_tool_calls_share_one_deadline(
    hooks: RecallHooks, clock: ManualClock, automatic: bool | str
) -> None:
    recall = agents_recall(hooks, working_state=host_state, automatic=automatic)

    def late(call: ModelCall) -> list[Any]:
        # Between the model request (the automatic round opened the reservation) and the
        # tools: the run's 10-second deadline passes.
        clock.advance(10.5)
        return six_calls()

    model = ScriptedModel([ModelStep.respond(late), [assistant_message("Done.")]])
    await run(recall, model)
    first, second = model.calls
    assert first.system_instructions is not None
    assert "Recalled memory:" in first.system_instructions
    seen = outputs(second)
    assert [v["refusal"]["reason"] for v in seen.values()] == ["deadline"] * 6
    assert second.system_instructions is not None
    if automatic == "per_request":
        assert "recall deadline has passed" in second.system_instructions
    else:  # the invocation's context, prepared before the deadline
        assert second.system_instructions == first.system_instructions
    rounds, reserved, _, _ = await usage(hooks)
    assert (rounds, reserved) == (1, 2)  # only the automatic round; the batch was refused
    assert all(kind != "deliberate" for _, kind in await slots(hooks))


async def test_an_out_of_scope_call_is_rejected_without_a_slot(hooks: RecallHooks) -> None:
    recall = agents_recall(hooks, automatic=False)
    model = ScriptedModel([
        [function_call(SEARCH_TOOL.name, {"query": "dentist", "scope": "personal"},
                       call_id="foreign"),
         function_call(SEARCH_TOOL.name, '{"query": ', call_id="broken"),
         function_call(SEARCH_TOOL.name, {"query": "deploy window"}, call_id="fine")],
        [assistant_message("Done.")],
    ])
    await run(recall, model)
    seen = outputs(model.calls[1])
    assert [seen[c]["status"] for c in ("foreign", "broken", "fine")] == [
        "invalid", "invalid", "ok"]
    assert "scope" in seen["foreign"]["content"]
    assert await usage(hooks) == (1, 1, 1, 0)  # one valid call, one slot


# -- the framework's resume paths never double-reserve --------------------------------------


def deploy_tool(ran: list[str]) -> FunctionTool:
    async def invoke(context: Any, arguments: str) -> str:
        ran.append(context.tool_call_id)
        return json.dumps({"status": "deployed"})

    return FunctionTool(
        name="deploy", description="Deploy (needs approval).",
        params_json_schema={"type": "object", "properties": {}, "additionalProperties": False},
        on_invoke_tool=invoke, strict_json_schema=False, needs_approval=True,
    )


def calls_and_deploy() -> list[Any]:
    return [*six_calls(), function_call("deploy", {}, call_id="deploy_1")]


async def test_approval_resume_reuses_the_stored_answers(hooks: RecallHooks) -> None:
    recall = agents_recall(hooks)
    ran: list[str] = []
    model = ScriptedModel([calls_and_deploy(), [assistant_message("Done.")]])
    the_agent = agent(model, recall, deploy_tool(ran))
    paused = await run(recall, model, the_agent=the_agent)
    assert [item.name for item in paused.interruptions] == ["deploy"]
    before = await usage(hooks)
    assert before[:2] == (2, 4)

    state = paused.to_state()
    state.approve(paused.interruptions[0])
    resumed = await run(recall, model, the_agent=the_agent, input=state)
    assert resumed.final_output == "Done."
    assert ran == ["deploy_1"]
    seen = outputs(model.calls[-1])
    assert [v["status"] for k, v in seen.items() if k in CALL_IDS].count("ok") == 2
    rounds, reserved, executed, _ = await usage(hooks)
    assert (rounds, reserved, executed) == before[:3]  # nothing reserved again


@pytest.mark.parametrize("same_process", [True, False], ids=["same-process", "new-process"])
async def test_search_needing_approval_resumed_from_json_never_reserves_twice(
    hooks: RecallHooks, same_process: bool
) -> None:
    recall = agents_recall(hooks, automatic=False)
    gated = dataclasses.replace(recall.tool, needs_approval=True)
    model = ScriptedModel([six_calls(), [assistant_message("Done.")]])
    the_agent = Agent(name="assistant", instructions=INSTRUCTIONS, model=model, tools=[gated])
    paused = await run(recall, model, the_agent=the_agent)
    assert len(paused.interruptions) == 6
    before = await usage(hooks)
    assert before == (1, 4, 4, 2)  # the batch ran at on_llm_end, before the approval

    saved = paused.to_state().to_json()
    resumer = recall if same_process else agents_recall(hooks, automatic=False)
    state = await RunState.from_json(the_agent, saved)
    for item in state.get_interruptions():
        state.approve(item)
    await run(resumer, model, the_agent=the_agent, input=state)
    seen = outputs(model.calls[-1])
    assert list(seen) == CALL_IDS
    rounds, reserved, executed, _ = await usage(hooks)
    assert (rounds, reserved, executed) == before[:3]
    # In a new process (a new adapter over the same ledger) the ledger's call records answer:
    # the searches that ran keep their evidence, the refused calls their refusal.
    assert [v["status"] for v in seen.values()] == ["ok"] * 4 + ["refused"] * 2
    assert all(v["evidence_ids"] for v in list(seen.values())[:4])
    assert {v["refusal"]["reason"] for v in list(seen.values())[4:]} == {"slots"}


async def test_continuing_with_to_input_list_never_reserves_a_call_twice(
    hooks: RecallHooks,
) -> None:
    recall = agents_recall(hooks, automatic=False)
    model = ScriptedModel([
        six_calls(), [assistant_message("Done.")],
        six_calls(), [assistant_message("Done again.")],  # the same response replayed
    ])
    first = await run(recall, model)
    before = await usage(hooks)
    assert before == (1, 4, 4, 2)
    history = [*first.to_input_list(), {"role": "user", "content": "Continue"}]
    again = await run(recall, model, input=history)
    assert again.final_output == "Done again."
    assert await usage(hooks) == before
    # The replayed calls got the answers stored for them, not a second reservation.
    replayed = [json.loads(item["output"]) for item in model.calls[3].input
                if isinstance(item, Mapping) and item.get("type") == "function_call_output"]
    assert replayed == list(outputs(model.calls[1]).values())


# -- the regression: a per-call design loses calls ------------------------------------------


def per_call_tool(runner: RecallRunner) -> FunctionTool:
    """The wrong design: one dispatch per tool call, from the tool's own guardrail."""

    async def guard(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        context = data.context
        run_recall = runner.recall_for(RUN, scope=SCOPE, principal=PRINCIPAL)
        (result,) = await run_recall.dispatch_batch(
            [ToolCall(call_id=context.tool_call_id, arguments=context.tool_arguments)]
        )
        if result.status == "ok":
            return ToolGuardrailFunctionOutput.allow()
        return ToolGuardrailFunctionOutput.reject_content(json.dumps(result.as_dict()))

    async def invoke(context: Any, arguments: str) -> str:
        return json.dumps({"status": "ok"})

    return FunctionTool(
        name=SEARCH_TOOL.name, description=SEARCH_TOOL.description,
        params_json_schema=SEARCH_TOOL.json_schema(), on_invoke_tool=invoke,
        strict_json_schema=False,
        tool_input_guardrails=[ToolInputGuardrail(guardrail_function=guard)],
    )


def two_calls() -> ScriptedModel:
    return ScriptedModel([six_calls()[:2], [assistant_message("Done.")]])


async def test_per_call_dispatch_loses_a_call_while_a_slot_is_unreserved(
    hooks: RecallHooks,
) -> None:
    recall = agents_recall(hooks)
    model = two_calls()
    wrong = Agent(name="assistant", instructions=INSTRUCTIONS, model=model,
                  tools=[per_call_tool(recall.runner)])
    # The automatic round and the bound run as in the adapter, but no batching hook.
    await recall.runner.run(wrong, "Continue", run_id=RUN, scope=SCOPE, principal=PRINCIPAL,
                            run_config=recall.run_config(config()))
    seen = outputs(model.calls[1])
    reasons = [v.get("refusal", {}).get("reason") for v in seen.values()]
    assert reasons.count("rounds") == 1
    assert (await usage(hooks))[:2] == (2, 3)  # slot 4 was never reserved, yet a call lost


async def test_the_batch_hook_runs_both_calls(hooks: RecallHooks) -> None:
    recall = agents_recall(hooks)
    model = two_calls()
    await run(recall, model)
    assert [v["status"] for v in outputs(model.calls[1]).values()] == ["ok", "ok"]
    assert [s for s, kind in await slots(hooks) if kind == "deliberate"] == [3, 4]
    assert (await usage(hooks))[:2] == (2, 4)


# -- the pieces ------------------------------------------------------------------------------


async def test_tool_is_rendered_from_the_one_definition(hooks: RecallHooks) -> None:
    recall = agents_recall(hooks)
    tool = recall.tool
    assert (tool.name, tool.description) == (SEARCH_TOOL.name, SEARCH_TOOL.description)
    assert tool.params_json_schema == SEARCH_TOOL.json_schema()
    model = script()
    await run(recall, model)
    assert [t.name for t in model.calls[0].tools] == [SEARCH_TOOL.name]


async def test_identity_comes_from_the_host_and_cannot_change(hooks: RecallHooks) -> None:
    recall = agents_recall(hooks)
    owner = recall.runner.recall_for(RUN, scope=SCOPE, principal=PRINCIPAL)
    # Nothing bound yet: the registry leaves another identity for the ledger to judge.
    stranger = recall.runner.recall_for(RUN, scope=SCOPE, principal="bo")
    await owner.dispatch_batch([ToolCall(call_id="c0", arguments={"query": QUERIES[0]})])
    assert recall.runner.recall_for(RUN, scope=SCOPE, principal=PRINCIPAL) is owner
    with pytest.raises(RunIdentityError):
        recall.runner.recall_for(RUN, scope=SCOPE, principal="bo")
    with pytest.raises(RunIdentityError):
        recall.runner.recall_for(RUN, scope="personal", principal=PRINCIPAL)
    with pytest.raises(RunIdentityError):
        await stranger.dispatch_batch([ToolCall(call_id="c1", arguments={"query": QUERIES[1]})])


@pytest.mark.parametrize("piece", ["hooks", "filter", "tool"])
async def test_an_unbound_run_fails_with_a_typed_error(hooks: RecallHooks, piece: str) -> None:
    from agents import Runner

    recall = agents_recall(hooks)
    model = script()
    kwargs: dict[str, Any] = {"run_config": config()}
    if piece == "hooks":
        kwargs["hooks"] = recall.run_hooks()
    elif piece == "filter":
        kwargs["run_config"] = recall.run_config(config())
    with pytest.raises(Exception, match="outside a bound run") as caught:
        await Runner.run(agent(model, recall), "Continue", **kwargs)
    # The SDK wraps an error raised in a tool guardrail in its UserError, with ours as cause.
    error = caught.value if piece != "tool" else caught.value.__cause__
    assert isinstance(error, RunNotBoundError)
    assert await usage(hooks) == (0, 0, 0, 0)


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_bare_follow_up_after_the_turn_ended_is_refused_not_served_its_context(
    hooks: RecallHooks, streamed: bool
) -> None:
    # A tool schedules a follow-up in a background task, which inherits the turn's bound
    # context and starts after the turn returned: it must never see the ended turn's prepared
    # context nor run inside its round. A bare Runner.run cannot be told from the turn's own
    # runs, so it is refused as unbound; started with recall.run it is the next turn.
    from agents import Runner

    recall = agents_recall(hooks)
    go, scheduled = asyncio.Event(), []
    follower = ScriptedModel([[assistant_message("Followed up.")]])

    async def follow_up(bare: bool) -> Any:
        await go.wait()
        the_agent = agent(follower, recall)
        if bare:
            return await Runner.run(the_agent, "Follow up on the cutover", hooks=recall.run_hooks(),
                                    run_config=recall.run_config(config()))
        return await recall.run(the_agent, "Follow up on the cutover", run_id=RUN, scope=SCOPE,
                                principal=PRINCIPAL, run_config=config())

    @function_tool
    async def schedule() -> str:
        """Schedule the follow-ups."""
        scheduled.extend(asyncio.get_running_loop().create_task(follow_up(bare))
                         for bare in (True, False))
        return "scheduled"

    model = ScriptedModel([[function_call("schedule", {}, call_id="s1")],
                           [assistant_message("Done.")]])
    await run(recall, model, streamed=streamed, the_agent=agent(model, recall, schedule))
    assert (await usage(hooks))[0] == 1
    go.set()
    bare, bound = await asyncio.gather(*scheduled, return_exceptions=True)
    assert isinstance(bare, RunNotBoundError) and "ended" in str(bare)
    assert not isinstance(bound, BaseException)
    assert len(follower.calls) == 1  # the bound follow-up's request alone
    assert (await usage(hooks))[0] == 2  # the next turn's own round


async def test_host_hooks_and_filter_still_run(hooks: RecallHooks) -> None:
    recall = agents_recall(hooks)
    events: list[str] = []

    class HostHooks(RunHooks[Any]):
        async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any],
                             response: ModelResponse) -> None:
            events.append(f"llm_end:{len(response.output)}")

        async def on_tool_end(self, context: RunContextWrapper[Any], agent: Agent[Any],
                              tool: Any, result: object) -> None:
            events.append("tool_end")

    def host_filter(data: CallModelData[Any]) -> ModelInputData:
        return ModelInputData(input=data.model_data.input,
                              instructions=f"{data.model_data.instructions}\n\nHOST")

    model = script()
    await run(recall, model, hooks=HostHooks(),
              run_config=RunConfig(tracing_disabled=True, call_model_input_filter=host_filter))
    assert events == ["llm_end:6", "tool_end", "tool_end", "llm_end:1"]
    instructions = model.calls[0].system_instructions
    assert instructions is not None
    assert instructions.startswith(f"{INSTRUCTIONS}\n\nHOST\n\nCurrent corrections:")


async def test_working_state_comes_from_the_host(hooks: RecallHooks) -> None:
    from runtime_hooks.demo import STATE

    seen: list[str] = []

    def state(data: CallModelData[Any]) -> Any:
        seen.append(type(data.context).__name__)
        return STATE

    recall = agents_recall(hooks, working_state=state)
    model = ScriptedModel([[assistant_message("Done.")]])
    await run(recall, model, context={"host": True})
    assert seen == ["dict"]
    instructions = model.calls[0].system_instructions
    assert instructions is not None
    assert "m-backfill" in instructions or "backfill" in instructions


async def test_concurrent_runs_share_the_tool_but_not_their_allowance(
    hooks: RecallHooks,
) -> None:
    recall = agents_recall(hooks, automatic=False)
    models = {run_id: script() for run_id in ("run-a", "run-b")}

    async def one(run_id: str) -> None:
        await recall.run(agent(models[run_id], recall), "Continue", run_id=run_id,
                         scope=SCOPE, principal=PRINCIPAL, run_config=config())

    await asyncio.gather(one("run-a"), one("run-b"))
    for run_id, model in models.items():
        u = await hooks.allowance.ledger.usage(run_id)
        assert (u.rounds, u.reserved, u.executed, u.refused) == (1, 4, 4, 2)
        assert [v["status"] for v in outputs(model.calls[1]).values()].count("ok") == 4


async def test_installing_the_pieces_twice_never_doubles_a_round(hooks: RecallHooks) -> None:
    recall = agents_recall(hooks, working_state=host_state)
    model = script()
    # A host that installed the filter and the hooks itself, then used recall.run anyway.
    await run(recall, model, hooks=recall.run_hooks(), run_config=recall.run_config(config()))
    assert await usage(hooks) == (2, 4, 4, 4)


def test_the_default_state_is_the_latest_user_message() -> None:
    def data(*items: Any) -> CallModelData[Any]:
        return CallModelData(model_data=ModelInputData(input=list(items), instructions=None),
                             agent=Agent(name="a"), context=None)

    parts = {"role": "user", "content": [{"type": "input_text", "text": "Continue"},
                                         {"type": "input_image", "image_url": "x"},
                                         {"type": "input_text", "text": "the backfill"}]}
    assert latest_user_request(data(
        {"role": "user", "content": "old"}, {"role": "assistant", "content": "hi"}, parts,
        {"type": "function_call_output", "call_id": "c", "output": "{}"},
    )).current_request == "Continue\nthe backfill"
    assert latest_user_request(data({"role": "assistant", "content": "hi"})).current_request == ""


async def test_a_run_without_user_text_still_runs(hooks: RecallHooks) -> None:
    recall = agents_recall(hooks)
    model = ScriptedModel([[assistant_message("Done.")]])
    result = await run(recall, model, input=[{"role": "assistant", "content": "Hello."}])
    assert result.final_output == "Done."
    rounds, reserved, _, _ = await usage(hooks)
    assert (rounds, reserved) == (1, 2)  # the automatic round ran on the empty request


# -- agent turns as the SDK runs them: one automatic round per Runner.run --------------------


def lookup_ticket_tool() -> FunctionTool:
    async def invoke(context: Any, arguments: str) -> str:
        return "BILL-7: invoice backfill"

    return FunctionTool(name="lookup_ticket", description="The ticket the user works on.",
                        params_json_schema={"type": "object", "properties": {},
                                            "additionalProperties": False},
                        on_invoke_tool=invoke)


def search_outputs(call: ModelCall, *call_ids: str) -> dict[str, dict[str, Any]]:
    """The outputs of these search calls that a model request carried, parsed from JSON."""
    return {
        item["call_id"]: json.loads(item["output"])
        for item in call.input
        if isinstance(item, Mapping) and item.get("type") == "function_call_output"
        and item["call_id"] in call_ids
    }


def deliberate_slots(traces: list[tuple[int, str]]) -> list[int]:
    return sorted(slot for slot, kind in traces if kind == "deliberate")


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_another_tool_first_then_six_searches_two_run_on_slots_3_and_4(
    hooks: RecallHooks, streamed: bool
) -> None:
    recall = agents_recall(hooks, working_state=host_state)
    model = ScriptedModel([[function_call("lookup_ticket", {}, call_id="t1")], six_calls(),
                           [assistant_message("Done.")]])
    the_agent = agent(model, recall, lookup_ticket_tool())
    await run(recall, model, streamed=streamed, the_agent=the_agent)

    first, second, third = model.calls
    assert first.system_instructions is not None
    assert "Recalled memory:" in first.system_instructions
    assert second.system_instructions == third.system_instructions == first.system_instructions
    seen = search_outputs(third, *CALL_IDS)
    assert list(seen) == CALL_IDS
    assert [v["status"] for v in seen.values()].count("ok") == 2
    refused = [v for v in seen.values() if v["status"] == "refused"]
    assert len(refused) == 4
    assert {v["refusal"]["reason"] for v in refused} == {"slots"}
    assert all("Memory recall was bounded" in v["content"] for v in refused)
    assert deliberate_slots(await slots(hooks)) == [3, 4]
    kinds = [r.kind.value for r in await hooks.allowance.ledger.reservations(RUN)]
    assert kinds == ["automatic", "deliberate"]
    assert await usage(hooks) == (2, 4, 4, 4)



async def test_a_handoffs_specialist_can_still_search(hooks: RecallHooks) -> None:
    """One Runner.run with a handoff: the automatic round runs once for the whole run, so the
    specialist (the search tool on both agents) searches on round 2's slots."""
    recall = agents_recall(hooks, working_state=host_state)
    model = ScriptedModel([
        [function_call("transfer_to_specialist", {}, call_id="h1")],
        [function_call(SEARCH_TOOL.name, {"query": QUERIES[0]}, call_id="s0"),
         function_call(SEARCH_TOOL.name, {"query": QUERIES[2]}, call_id="s1")],
        [assistant_message("Done.")],
    ])
    specialist = Agent(name="specialist", instructions="You know billing.", model=model,
                       tools=[recall.tool])
    triage = Agent(name="triage", instructions=INSTRUCTIONS, model=model,
                   tools=[recall.tool], handoffs=[specialist])
    result = await run(recall, model, the_agent=triage)
    assert result.final_output == "Done."
    seen = search_outputs(model.calls[2], "s0", "s1")
    assert {c: v["status"] for c, v in seen.items()} == {"s0": "ok", "s1": "ok"}
    assert deliberate_slots(await slots(hooks)) == [3, 4]
    kinds = [r.kind.value for r in await hooks.allowance.ledger.reservations(RUN)]
    assert kinds == ["automatic", "deliberate"]
    # the specialist's requests carry the context prepared for the run
    assert model.calls[1].system_instructions is not None
    assert "Recalled memory:" in model.calls[1].system_instructions
    assert (await usage(hooks))[3] == 0



async def test_after_eviction_another_principal_is_still_refused(hooks: RecallHooks) -> None:
    runner = RecallRunner(hooks, max_runs=1)
    recall = attrs.evolve(agents_recall(hooks, automatic=False), runner=runner)
    await run(recall, ScriptedModel([[function_call(SEARCH_TOOL.name, {"query": QUERIES[0]},
                                                    call_id="c0")],
                                     [assistant_message("Done.")]]))
    runner.recall_for("another-run", scope=SCOPE, principal=PRINCIPAL)  # evicts RUN
    model = ScriptedModel([[function_call(SEARCH_TOOL.name, {"query": QUERIES[1]},
                                          call_id="c1")], [assistant_message("Done.")]])
    with pytest.raises(RunIdentityError, match=RUN):
        await recall.run(agent(model, recall), "Continue", run_id=RUN, scope=SCOPE,
                         principal="mallory", run_config=config())
    assert await usage(hooks) == (1, 1, 1, 0)


async def test_a_run_forgotten_between_its_batch_and_its_tools_keeps_its_answers(
    hooks: RecallHooks,
) -> None:
    """Other runs push the run out of the registry (``max_runs=1``) as each tool starts: the
    bound run still answers every call from its batch, nothing is dispatched again."""
    runner = RecallRunner(hooks, max_runs=1)
    recall = attrs.evolve(agents_recall(hooks, automatic=False), runner=runner)
    crowd: list[str] = []

    class Crowd(RunHooks[Any]):
        async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
            crowd.append(f"other-{len(crowd)}")
            runner.recall_for(crowd[-1], scope=SCOPE, principal=PRINCIPAL)

    model = script()
    await run(recall, model, hooks=Crowd())
    seen = outputs(model.calls[1])
    assert crowd and [v["status"] for v in seen.values()].count("ok") == 4
    assert await usage(hooks) == (1, 4, 4, 2)


def crm_tool(ran: list[str]) -> list[Any]:
    """The host's own ``search_memory``, in the tool namespace ``crm``."""
    from agents import tool_namespace

    async def invoke(context: Any, arguments: str) -> str:
        ran.append(arguments)
        return json.dumps({"crm": "3 tickets"})

    tool = FunctionTool(name=SEARCH_TOOL.name, description="Search the CRM's notes.",
                        params_json_schema=SEARCH_TOOL.json_schema(), on_invoke_tool=invoke,
                        strict_json_schema=False)
    return list(tool_namespace(name="crm", description="CRM tools", tools=[tool]))


@pytest.mark.parametrize("offer", ["no tool", "disabled", "disabled later"])
async def test_search_calls_to_an_agent_that_does_not_offer_the_tool_are_never_searched(
    hooks: RecallHooks, offer: str
) -> None:
    # The SDK runs a call only on a tool the agent offers and has enabled; recall's batch
    # must not reserve or search for one it will not run (a triage agent, a disabled tool).
    recall = agents_recall(hooks, automatic=False)
    calls = [function_call(SEARCH_TOOL.name, {"query": q}, call_id=c)
             for q, c in (("invoice backfill", "c1"), ("cutover date", "c2"))]
    asked: list[str] = []

    async def later(context: Any, agent: Any) -> bool:
        asked.append(agent.name)
        return False

    tools = {"no tool": [], "disabled": [dataclasses.replace(recall.tool, is_enabled=False)],
             "disabled later": [dataclasses.replace(recall.tool, is_enabled=later)]}[offer]
    model = ScriptedModel([calls, [assistant_message("Done.")]])
    triage = Agent(name="triage", instructions=INSTRUCTIONS, model=model, tools=tools)
    run_config = RunConfig(tracing_disabled=True, tool_not_found_behavior="return_error_to_model")
    await recall.run(triage, "Continue", run_id=RUN, scope=SCOPE, principal=PRINCIPAL,
                     run_config=run_config)
    assert await usage(hooks) == (0, 0, 0, 0)
    assert all("not found" in output for output in _raw_outputs(model.calls[1]).values())
    assert set(asked) == ({"triage"} if offer == "disabled later" else set())


def _raw_outputs(call: ModelCall) -> dict[str, str]:
    return {item["call_id"]: str(item["output"]) for item in call.input
            if isinstance(item, Mapping) and item.get("type") == "function_call_output"}


async def test_a_call_to_the_hosts_own_namespaced_search_tool_is_not_recalls(
    hooks: RecallHooks,
) -> None:
    from openai.types.responses import ResponseFunctionToolCall

    recall = agents_recall(hooks, automatic=False)
    ran: list[str] = []
    theirs = ResponseFunctionToolCall(
        type="function_call", id="fc_n0", call_id="n0", name=SEARCH_TOOL.name, namespace="crm",
        arguments=json.dumps({"query": "acme renewal"}), status="completed")
    ours = function_call(SEARCH_TOOL.name, {"query": "cutover date"}, call_id="c1")
    model = ScriptedModel([[theirs, ours], [assistant_message("Done.")]])
    await run(recall, model, the_agent=agent(model, recall, *crm_tool(ran)))
    assert ran == [json.dumps({"query": "acme renewal"})]  # the host's tool ran for its call
    assert await usage(hooks) == (1, 1, 1, 0)  # and recall searched its own call alone
    assert outputs(model.calls[1])["c1"]["status"] == "ok"


@pytest.mark.parametrize("namespace", ["search_memory", None])
async def test_a_deferred_loading_search_tool_is_searched_as_the_sdk_resolves_its_calls(
    hooks: RecallHooks, namespace: str | None
) -> None:
    # A tool loaded through tool search is called with the synthetic namespace equal to its
    # name, which the SDK resolves to it and runs; a bare call finds no tool.
    from agents import ToolSearchTool
    from openai.types.responses import ResponseFunctionToolCall

    recall = agents_recall(hooks, automatic=False)
    call = ResponseFunctionToolCall(
        type="function_call", id="fc_c1", call_id="c1", name=SEARCH_TOOL.name,
        arguments=json.dumps({"query": "invoice backfill"}), status="completed",
        **({"namespace": namespace} if namespace else {}))
    model = ScriptedModel([[call], [assistant_message("Done.")]])
    deferred = dataclasses.replace(recall.tool, defer_loading=True)
    the_agent = Agent(name="assistant", instructions=INSTRUCTIONS, model=model,
                      tools=[deferred, ToolSearchTool()])
    await recall.run(the_agent, "Continue", run_id=RUN, scope=SCOPE, principal=PRINCIPAL,
                     run_config=RunConfig(tracing_disabled=True,
                                          tool_not_found_behavior="return_error_to_model"))
    if namespace:
        assert outputs(model.calls[1])["c1"]["status"] == "ok"
        assert await usage(hooks) == (1, 1, 1, 0)
    else:
        assert "not found" in _raw_outputs(model.calls[1])["c1"]
        assert await usage(hooks) == (0, 0, 0, 0)


async def test_a_tool_enabled_only_after_the_request_started_is_not_searched(
    hooks: RecallHooks,
) -> None:
    # The SDK asks is_enabled before the request; the answer it acted on is the one that
    # counts, not a later one (after the request, run state has moved on).
    recall = agents_recall(hooks, automatic=False)

    def after_the_first_request(context: RunContextWrapper[Any], agent: Any) -> bool:
        return context.usage.requests >= 1

    model = ScriptedModel([[function_call(SEARCH_TOOL.name, {"query": "invoice"},
                                          call_id="c1")], [assistant_message("Done.")]])
    late = dataclasses.replace(recall.tool, is_enabled=after_the_first_request)
    the_agent = Agent(name="assistant", instructions=INSTRUCTIONS, model=model, tools=[late])
    await recall.run(the_agent, "Continue", run_id=RUN, scope=SCOPE, principal=PRINCIPAL,
                     run_config=RunConfig(tracing_disabled=True,
                                          tool_not_found_behavior="return_error_to_model"))
    assert "not found" in _raw_outputs(model.calls[1])["c1"]
    assert await usage(hooks) == (0, 0, 0, 0)


async def test_run_hooks_shared_by_many_runs_keep_a_bounded_record_of_their_requests(
    hooks: RecallHooks,
) -> None:
    # One RecallRunHooks object may serve every run (hooks=recall.run_hooks() built once);
    # a request whose response never comes (a model error) must not be remembered for ever.
    from runtime_hooks.adapters.openai_agents.deliberate import _OFFERED_KEPT

    recall = agents_recall(hooks, automatic=False)
    shared = recall.run_hooks()
    the_agent = agent(ScriptedModel([]), recall)
    contexts = [RunContextWrapper(context=None) for _ in range(_OFFERED_KEPT + 50)]
    for context in contexts:  # each run's context stays alive: its id is its own
        await shared.on_llm_start(context, the_agent, None, [])
    assert len(shared._offered) == _OFFERED_KEPT
