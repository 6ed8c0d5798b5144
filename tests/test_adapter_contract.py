"""One adapter contract, run on every framework: pydantic-ai, LangChain ``create_agent`` and
the OpenAI Agents SDK, each driven by its scripted model from :mod:`runtime_hooks.testing`.

Every scenario is written once against a small driver per framework (how to build the agent
and run one invocation); what the model saw comes back in the same shape
(:class:`runtime_hooks.testing.ModelRequest`). Asyncio only: none of these frameworks runs
under trio. The real ``open_hooks()`` on a temporary ledger and store, with a ManualClock.
Framework-specific behaviour (streaming modes, approvals, checkpoints, hand-built graphs) is
tested in each adapter's own module.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

import attrs
import pytest

from plugin import ManualClock, QueryStrategy, WorkingState
from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError, RunIdentityError
from runtime_hooks import RecallHooks
from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE
from runtime_hooks.testing import ModelRequest, Step, search, searches

from ._hooks_env import seeded_hooks

pytestmark = [pytest.mark.anyio]

RUN = "contract-run"
QUERIES = ("invoice backfill dry-run", "currency rounding rule", "cutover date",
           "deploy window", "rollback runbook", "billing migration kickoff")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # none of the three frameworks runs under trio


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No API key, and any connection attempt fails the test."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a test tried the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall=1_800_000_000.0, monotonic=10.0)


async def _admit(experiment: str) -> bool:
    return experiment == "task_context"


@pytest.fixture
async def hooks(tmp_path: Path, clock: ManualClock) -> AsyncIterator[RecallHooks]:
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db",
                          query_planning=QueryStrategy.TASK_CONTEXT, admission=_admit)
    async with seeded_hooks(config, clock) as hooks:
        yield hooks


def _work_in_progress(request: str) -> WorkingState:
    """The host's working state: the demo's work in progress, with the user's message."""
    return attrs.evolve(STATE, current_request=request or STATE.current_request)


class Driver(Protocol):
    """How one framework builds a recall-enabled agent and runs one invocation."""

    def adapter(self, hooks: RecallHooks, *, automatic: Any = True) -> Any: ...

    async def invoke(
        self, adapter: Any, *steps: Step, run_id: str = RUN, principal: str = PRINCIPAL,
        on_request: Callable[[int], None] | None = None, scope: str = SCOPE,
    ) -> list[ModelRequest]: ...


class PydanticAI:
    def adapter(self, hooks: RecallHooks, *, automatic: Any = True) -> Any:
        from runtime_hooks.adapters.pydantic_ai import RecallCapability, latest_user_request

        def working_state(ctx: Any) -> WorkingState | None:
            request = latest_user_request(ctx)
            return None if request is None else _work_in_progress(request.current_request)

        return RecallCapability(hooks, working_state=working_state, automatic=automatic)

    async def invoke(
        self, adapter: Any, *steps: Step, run_id: str = RUN, principal: str = PRINCIPAL,
        on_request: Callable[[int], None] | None = None, scope: str = SCOPE,
    ) -> list[ModelRequest]:
        from pydantic_ai import Agent

        from runtime_hooks.adapters.pydantic_ai import RunIdentity
        from runtime_hooks.testing.pydantic_ai import ScriptedModel

        model = ScriptedModel(*steps, on_request=on_request)
        agent = Agent(model, deps_type=RunIdentity, capabilities=[adapter])
        await agent.run("Continue", deps=RunIdentity(run_id=run_id, scope=scope,
                                                     principal=principal))
        return model.requests


class LangChain:
    def adapter(self, hooks: RecallHooks, *, automatic: Any = True) -> Any:
        from runtime_hooks.adapters.langchain import RecallMiddleware, latest_request

        def working_state(messages: Any) -> WorkingState | None:
            request = latest_request(messages)
            return None if request is None else _work_in_progress(request.current_request)

        return RecallMiddleware(hooks, working_state=working_state, automatic=automatic)

    async def invoke(
        self, adapter: Any, *steps: Step, run_id: str = RUN, principal: str = PRINCIPAL,
        on_request: Callable[[int], None] | None = None, scope: str = SCOPE,
    ) -> list[ModelRequest]:
        from langchain.agents import create_agent
        from langchain_core.messages import HumanMessage

        from runtime_hooks.adapters.langchain import RecallContext
        from runtime_hooks.testing.langchain import ScriptedChatModel

        model = ScriptedChatModel(*steps, on_request=on_request)
        agent = create_agent(model, middleware=[adapter], context_schema=RecallContext)
        await agent.ainvoke({"messages": [HumanMessage("Continue")]},
                            context=RecallContext(run_id=run_id, scope=scope,
                                                  principal=principal))
        return model.requests


class OpenAIAgents:
    def adapter(self, hooks: RecallHooks, *, automatic: Any = True) -> Any:
        from runtime_hooks.adapters.openai_agents import agents_recall, latest_user_request

        def working_state(data: Any) -> WorkingState:
            return _work_in_progress(latest_user_request(data).current_request)

        return agents_recall(hooks, working_state=working_state, automatic=automatic)

    async def invoke(
        self, adapter: Any, *steps: Step, run_id: str = RUN, principal: str = PRINCIPAL,
        on_request: Callable[[int], None] | None = None, scope: str = SCOPE,
    ) -> list[ModelRequest]:
        from agents import Agent, RunConfig

        from runtime_hooks.testing.openai_agents import ScriptedAgentsModel

        model = ScriptedAgentsModel(*steps, on_request=on_request)
        agent = Agent(name="assistant", instructions="You help Ana.", model=model,
                      tools=[adapter.tool])
        await adapter.run(agent, "Continue", run_id=run_id, scope=scope, principal=principal,
                          run_config=RunConfig(tracing_disabled=True))
        return model.requests


DRIVERS: dict[str, Callable[[], Driver]] = {
    # The test extra installs pydantic-ai and LangChain on Python 3.11+ only.
    **({"pydantic-ai": PydanticAI, "langchain": LangChain} if sys.version_info >= (3, 11)
       else {}),
    "openai-agents": OpenAIAgents,
}


@pytest.fixture(params=list(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Driver:
    return DRIVERS[request.param]()


async def _usage(hooks: RecallHooks, run_id: str = RUN) -> tuple[int, int, int, int]:
    usage = await hooks.allowance.ledger.usage(run_id)
    return usage.rounds, usage.reserved, usage.executed, usage.refused


async def _slots(hooks: RecallHooks, run_id: str = RUN) -> list[tuple[int, str]]:
    return [(t.slot, t.kind) for t in await hooks.allowance.ledger.attempts(run_id)
            if t.slot is not None]


def _status(request: ModelRequest) -> dict[str, str]:
    return {call_id: answer["status"] for call_id, answer in request.answers().items()}


# -- the contract -----------------------------------------------------------------------------


async def test_automatic_round_then_two_of_six_calls_run_on_slots_3_and_4(
    hooks: RecallHooks, driver: Driver
) -> None:
    first, second, *_ = await driver.invoke(driver.adapter(hooks), searches(*QUERIES), "Done.")

    assert "m-backfill" in first.instructions  # "Continue" recalled the work in progress
    answers = second.answers()
    assert sorted(answers) == [f"call-{i}" for i in range(6)]  # every call answered
    ok = [a for a in answers.values() if a["status"] == "ok"]
    refused = [a for a in answers.values() if a["status"] == "refused"]
    assert len(ok) == 2 and len(refused) == 4
    assert all(a["evidence_ids"] for a in ok)
    for answer in refused:  # the typed refusal, visible in the NEXT model request
        assert answer["refusal"]["reason"] == "slots"
        assert "bounded" in answer["content"] and "not evidence" in answer["content"]
    # The next request of the invocation sees the same prepared context and takes no round.
    assert second.instructions == first.instructions
    assert await _slots(hooks) == [(1, "base"), (2, "delta"), (3, "deliberate"),
                                   (4, "deliberate")]
    assert await _usage(hooks) == (2, 4, 4, 4)


async def test_per_request_runs_the_automatic_round_before_every_request(
    hooks: RecallHooks, driver: Driver
) -> None:
    adapter = driver.adapter(hooks, automatic="per_request")
    first, second = await driver.invoke(adapter, searches(*QUERIES), "Done.")
    assert "m-backfill" in first.instructions
    # The second request's own round is refused (rounds): the model is told, in words.
    assert "bounded" in second.instructions and "not evidence" in second.instructions
    assert "m-backfill" not in second.instructions
    refusals = await hooks.allowance.ledger.refusals(RUN)
    assert sorted(r.reason.value for r in refusals) == ["rounds"] + ["slots"] * 4


@pytest.mark.parametrize("automatic", ["each", 0.5, None])
async def test_an_unknown_automatic_mode_is_refused(
    hooks: RecallHooks, driver: Driver, automatic: Any
) -> None:
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError),
                       match="automatic"):
        driver.adapter(hooks, automatic=automatic)


async def test_without_automatic_recall_four_of_six_calls_run_on_distinct_slots(
    hooks: RecallHooks, driver: Driver
) -> None:
    first, second = await driver.invoke(driver.adapter(hooks, automatic=False),
                                        searches(*QUERIES), "Done.")
    assert "m-backfill" not in first.instructions and "Recalled memory" not in first.instructions
    answers = second.answers()
    assert [a["status"] for a in answers.values()].count("ok") == 4
    assert [a["refusal"]["reason"] for a in answers.values() if a["status"] == "refused"] == [
        "slots", "slots"]
    assert sorted(await _slots(hooks)) == [(i, "deliberate") for i in (1, 2, 3, 4)]
    assert await _usage(hooks) == (1, 4, 4, 2)


async def test_automatic_round_and_tool_calls_share_one_deadline(
    hooks: RecallHooks, driver: Driver, clock: ManualClock
) -> None:
    # The first model request opens the run (deadline 10 s); the model then "thinks" for 11 s.
    def think(number: int) -> None:
        if number == 1:
            clock.advance(11.0)

    _, second = await driver.invoke(driver.adapter(hooks), searches(*QUERIES), "Done.",
                                    on_request=think)
    answers = second.answers()
    assert len(answers) == 6
    assert {a["status"] for a in answers.values()} == {"refused"}
    assert {a["refusal"]["reason"] for a in answers.values()} == {"deadline"}
    rounds, reserved, _, _ = await _usage(hooks)
    assert (rounds, reserved) == (1, 2)  # only the automatic round was ever reserved


async def test_an_out_of_scope_call_gets_its_typed_answer_and_no_slot(
    hooks: RecallHooks, driver: Driver
) -> None:
    calls = (search("deploy window", call_id="bad", scope="personal"),
             search("invoice backfill", call_id="good"))
    _, second = await driver.invoke(driver.adapter(hooks, automatic=False), calls, "Done.")
    assert _status(second) == {"bad": "invalid", "good": "ok"}
    assert await _usage(hooks) == (1, 1, 1, 0)


async def test_two_searches_in_each_of_two_model_messages(
    hooks: RecallHooks, driver: Driver
) -> None:
    requests = await driver.invoke(driver.adapter(hooks),
                                   searches(*QUERIES[:2], prefix="a"),
                                   searches(*QUERIES[2:4], prefix="b"), "Done.")
    answers = requests[-1].answers()
    assert {c: a["status"] for c, a in answers.items()} == {
        "a-0": "ok", "a-1": "ok", "b-0": "refused", "b-1": "refused"}
    assert {answers[c]["refusal"]["reason"] for c in ("b-0", "b-1")} == {"rounds"}
    assert sorted(s for s, k in await _slots(hooks) if k == "deliberate") == [3, 4]
    assert len({request.instructions for request in requests}) == 1  # one prepared context


async def test_each_invocation_prepares_again_then_gets_the_bounded_notice(
    hooks: RecallHooks, driver: Driver
) -> None:
    adapter = driver.adapter(hooks)
    seen = [(await driver.invoke(adapter, "Done."))[0].instructions for _ in range(3)]
    assert "m-backfill" in seen[0] and "Recalled memory" in seen[1]
    assert "bounded" in seen[2] and "not evidence" in seen[2]
    assert "Recalled memory" not in seen[2]  # no context of an earlier invocation leaks
    rounds, reserved, _, refused = await _usage(hooks)
    assert (rounds, reserved, refused) == (2, 4, 1)


async def test_a_reused_call_id_with_other_arguments_is_a_new_call(
    hooks: RecallHooks, driver: Driver
) -> None:
    """A later invocation of the run reuses a call id with other arguments: it is its own
    search, never the first call's stored answer."""
    adapter = driver.adapter(hooks, automatic=False)
    before = await driver.invoke(adapter, (search("invoice backfill", call_id="c0"),), "Done.")
    after = await driver.invoke(adapter, (search("cutover date", call_id="c0"),), "Done.")
    first, second = before[1].answers()["c0"], after[1].answers()["c0"]
    assert first["status"] == second["status"] == "ok"
    assert "m-backfill" in first["evidence_ids"]
    assert "m-cutover" in second["evidence_ids"]
    assert "m-backfill" not in second["evidence_ids"]
    assert sorted(s for s, _ in await _slots(hooks)) == [1, 2]
    assert await _usage(hooks) == (2, 2, 2, 0)


async def test_each_host_run_has_its_own_allowance(hooks: RecallHooks, driver: Driver) -> None:
    adapter = driver.adapter(hooks, automatic=False)
    for run_id in ("host-a", "host-b"):
        _, second = await driver.invoke(adapter, searches(*QUERIES), "Done.", run_id=run_id)
        assert list(_status(second).values()).count("ok") == 4
        assert await _usage(hooks, run_id) == (1, 4, 4, 2)


async def test_a_run_id_used_by_another_principal_is_refused(
    hooks: RecallHooks, driver: Driver
) -> None:
    adapter = driver.adapter(hooks, automatic=False)
    await driver.invoke(adapter, searches(*QUERIES[:1]), "Done.")
    with pytest.raises(RunIdentityError):
        await driver.invoke(adapter, searches(*QUERIES[:1]), "Done.", principal="mallory")
    assert await _usage(hooks) == (1, 1, 1, 0)  # the other principal reserved nothing


@pytest.mark.parametrize("automatic", [True, False])
async def test_a_refused_first_use_never_locks_the_owner_out(
    hooks: RecallHooks, driver: Driver, automatic: bool
) -> None:
    """The ledger decides whose run it is: another principal's refused request, first in this
    process, leaves the run to the principal the ledger bound it to."""
    await hooks.allowance.ledger.bind_identity(RUN, principal=PRINCIPAL, scope=SCOPE)
    adapter = driver.adapter(hooks, automatic=automatic)
    with pytest.raises(RunIdentityError):
        await driver.invoke(adapter, searches(*QUERIES[:1]), "Done.", principal="mallory")
    _, second = await driver.invoke(adapter, searches(*QUERIES[:1]), "Done.")
    assert _status(second) == {"call-0": "ok"}
    with pytest.raises(RunIdentityError):  # and the registry now keeps the bound owner
        await driver.invoke(adapter, searches(*QUERIES[:1]), "Done.", principal="mallory")


async def test_a_blank_scope_on_first_use_binds_nothing(
    hooks: RecallHooks, driver: Driver
) -> None:
    adapter = driver.adapter(hooks, automatic=False)
    with pytest.raises(InvalidArgumentError, match="scope"):
        await driver.invoke(adapter, searches(*QUERIES[:1]), "Done.", scope="   ")
    _, second = await driver.invoke(adapter, searches(*QUERIES[:1]), "Done.")
    assert _status(second) == {"call-0": "ok"}
    assert await _usage(hooks) == (1, 1, 1, 0)
