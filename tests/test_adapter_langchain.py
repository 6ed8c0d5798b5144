"""The LangChain/LangGraph adapter in the real agent loop, offline, with a fake chat model.

Asyncio only: LangChain and LangGraph do not run under trio. Every test uses the real
``open_hooks()`` on a temporary ledger and store and a ManualClock.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    ToolCallLimitMiddleware,
    dynamic_prompt,
)
from langchain.tools import ToolRuntime
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt
from pydantic import Field

from plugin import ManualClock, WorkingState, current_permit
from plugin.errors import RunIdentityError
from plugin.memory.pipeline import MemoryRetriever
from runtime_hooks import RecallHooks
from runtime_hooks.adapters import SEARCH_TOOL
from runtime_hooks.adapters.langchain import (
    LangChainRecall,
    MissingRecallContextError,
    NotDispatchedError,
    RecallContext,
    RecallContextMismatchError,
    RecallMiddleware,
    RecallToolNode,
    latest_request,
    system_with_context,
)
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.calls import arguments_digest
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed
from runtime_hooks.hooks import ToolCall
from runtime_hooks.testing import search, searches
from runtime_hooks.testing.langchain import ScriptedChatModel

from ._hooks_env import seeded_hooks

pytestmark = [pytest.mark.anyio]

RUN = "run-lc"
CONTEXT = RecallContext(run_id=RUN, scope=SCOPE, principal=PRINCIPAL)
QUERIES = ("invoice backfill", "rounding rule", "cutover date", "deploy window",
           "rollback runbook", "kickoff notes")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"



async def _admit(experiment: str) -> bool:
    return experiment == "task_context"


def _config(tmp_path: Path) -> RecallConfig:
    return RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db",
                        admission=_admit, query_planning="task_context")


@pytest.fixture
async def hooks(tmp_path: Path, clock: ManualClock) -> AsyncIterator[RecallHooks]:
    async with seeded_hooks(_config(tmp_path), clock) as hooks:
        yield hooks


def work_in_progress(messages: Sequence[AnyMessage]) -> WorkingState | None:
    """The host's working state: the demo's work in progress, with the latest user message."""
    request = latest_request(messages)
    return None if request is None else attrs.evolve(STATE,
                                                      current_request=request.current_request)


class FakeModel(GenericFakeChatModel):
    """The fake chat model, accepting ``bind_tools`` and recording what it was sent."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)
    on_call: Callable[[int], None] | None = None

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        if self.on_call is not None:
            self.on_call(len(self.seen))
        return self._generate(messages, stop=stop, **kwargs)


def search_calls(queries: Sequence[str] = QUERIES, prefix: str = "c") -> list[dict[str, Any]]:
    return [{"name": SEARCH_TOOL.name, "args": {"query": q}, "id": f"{prefix}{i}",
             "type": "tool_call"} for i, q in enumerate(queries)]


def fake_model(*calls: dict[str, Any], on_call: Callable[[int], None] | None = None
               ) -> FakeModel:
    script: Iterator[AIMessage] = iter([AIMessage(content="", tool_calls=list(calls)),
                                        AIMessage(content="Done.")])
    return FakeModel(messages=script, seen=[], on_call=on_call)


def _answers(messages: Sequence[BaseMessage]) -> dict[str, dict[str, Any]]:
    return {m.tool_call_id: json.loads(str(m.content)) for m in messages
            if isinstance(m, ToolMessage) and m.name == SEARCH_TOOL.name}


def _system(messages: Sequence[BaseMessage]) -> str:
    system = [m for m in messages if isinstance(m, SystemMessage)]
    return str(system[0].content) if system else ""


async def _usage(hooks: RecallHooks, run_id: str = RUN) -> tuple[int, int, int]:
    usage = await hooks.allowance.ledger.usage(run_id)
    return usage.rounds, usage.reserved, usage.executed


async def _slots(hooks: RecallHooks, run_id: str = RUN) -> list[tuple[int, str]]:
    return [(t.slot, t.kind) for t in await hooks.allowance.ledger.attempts(run_id)]


def _agent(model: FakeModel, *middleware: AgentMiddleware[Any, Any, Any],
           tools: Sequence[Any] = (), **kw: Any) -> Any:
    return create_agent(model, tools=list(tools), middleware=list(middleware),
                        context_schema=RecallContext, **kw)


async def test_search_tool_is_rendered_from_the_one_definition(hooks: RecallHooks) -> None:
    middleware = RecallMiddleware(hooks)
    (registered,) = middleware.tools
    assert convert_to_openai_tool(registered) == SEARCH_TOOL.openai_function()


async def test_automatic_round_then_two_of_six_calls_run_on_slots_3_and_4(
    hooks: RecallHooks,
) -> None:
    model = fake_model(*search_calls())
    agent = _agent(model, RecallMiddleware(hooks, working_state=work_in_progress))
    out = await agent.ainvoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)

    first, second = model.seen
    assert "m-backfill" in _system(first)  # "Continue" recalled the work in progress
    answers = _answers(second)
    assert list(answers) == [f"c{i}" for i in range(6)]  # every call answered, in order
    ok = [cid for cid, a in answers.items() if a["status"] == "ok"]
    refused = [a for a in answers.values() if a["status"] == "refused"]
    assert len(ok) == 2 and len(refused) == 4
    for answer in refused:  # the typed refusal, visible in the NEXT model request
        assert answer["refusal"]["status"] == "recall_bounded"
        assert answer["refusal"]["reason"] == "slots"
        assert "bounded" in answer["content"] and "not evidence" in answer["content"]
    tool_status = {m.tool_call_id: m.status for m in second if isinstance(m, ToolMessage)}
    assert sorted(tool_status.values()) == ["error"] * 4 + ["success"] * 2
    # The next request of the invocation sees the same prepared context, and takes no round.
    assert _system(second) == _system(first)
    assert out["messages"][-1].content == "Done."
    assert "recall_context" not in out  # private to the middleware, and cleared at the end

    assert await _slots(hooks) == [(1, "base"), (2, "delta"), (3, "deliberate"),
                                   (4, "deliberate")]
    assert await _usage(hooks) == (2, 4, 4)
    refusals = await hooks.allowance.ledger.refusals(RUN)
    assert sorted(r.reason.value for r in refusals) == ["slots"] * 4  # the calls, no round
    assert (await hooks.allowance.ledger.usage(RUN)).refused == 4



async def test_a_call_answered_by_another_middleware_is_not_dispatched(
    hooks: RecallHooks,
) -> None:
    class AnswerFirst(AgentMiddleware[Any, Any, Any]):
        async def aafter_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any]:
            return {"messages": [ToolMessage(content="answered elsewhere", tool_call_id="c0")]}

    model = fake_model(*search_calls(QUERIES[:2]))
    # after_model hooks run in reverse list order: AnswerFirst runs before the recall hook.
    agent = _agent(model, RecallMiddleware(hooks, automatic=False), AnswerFirst())
    await agent.ainvoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)
    contents = {m.tool_call_id: m.content for m in model.seen[1] if isinstance(m, ToolMessage)}
    assert contents["c0"] == "answered elsewhere"
    assert json.loads(str(contents["c1"]))["status"] == "ok"
    assert await _usage(hooks) == (1, 1, 1)  # one slot, for the one unanswered call


async def test_listed_before_the_tool_call_limit_only_the_allowed_calls_reserve(
    hooks: RecallHooks,
) -> None:
    model = fake_model(*search_calls())
    limit = ToolCallLimitMiddleware(run_limit=3, exit_behavior="continue")
    agent = _agent(model, RecallMiddleware(hooks, automatic=False), limit)
    await agent.ainvoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)

    per_call: dict[str, list[str]] = {}
    for m in model.seen[1]:
        if isinstance(m, ToolMessage):
            per_call.setdefault(m.tool_call_id, []).append(str(m.content))
    assert all(len(v) == 1 for v in per_call.values())  # one answer per call
    ran = [cid for cid, (c,) in per_call.items() if c.startswith("{")
           and json.loads(c)["status"] == "ok"]
    assert ran == ["c0", "c1", "c2"]  # the limit blocked c3..c5 before any slot was reserved
    assert await _usage(hooks) == (1, 3, 3)


async def test_listed_after_the_tool_call_limit_every_call_reserves_and_gets_two_answers(
    hooks: RecallHooks,
) -> None:
    """The documented wrong order: the recall hook runs first and reserves for all calls."""
    model = fake_model(*search_calls())
    limit = ToolCallLimitMiddleware(run_limit=3, exit_behavior="continue")
    agent = _agent(model, limit, RecallMiddleware(hooks, automatic=False))
    await agent.ainvoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)

    counts: dict[str, int] = {}
    for m in model.seen[1]:
        if isinstance(m, ToolMessage):
            counts[m.tool_call_id] = counts.get(m.tool_call_id, 0) + 1
    assert counts == {"c0": 1, "c1": 1, "c2": 1, "c3": 2, "c4": 2, "c5": 2}
    assert await _usage(hooks) == (1, 4, 4)  # still bounded, but slots went to blocked calls


async def test_per_call_dispatch_loses_calls(hooks: RecallHooks) -> None:
    """Regression: one dispatch per tool call (wrap_tool_call) opens one round per call."""

    class PerCall(AgentMiddleware[Any, Any, Any]):
        async def awrap_tool_call(self, request: Any, handler: Any) -> ToolMessage:
            call = request.tool_call
            (result,) = await hooks.dispatch(
                [ToolCall(call_id=call["id"], arguments=call["args"])],
                run_id=RUN, scope=SCOPE, principal=PRINCIPAL)
            return ToolMessage(content=json.dumps(result.as_dict()), tool_call_id=call["id"],
                               name=SEARCH_TOOL.name)

    recall = LangChainRecall(hooks, working_state=work_in_progress)
    model = fake_model(*search_calls(QUERIES[:2]))

    class AutomaticOnly(AgentMiddleware[Any, Any, Any]):
        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            await recall.automatic_context(request.messages, request.runtime.context)
            return await handler(request)

    agent = _agent(model, AutomaticOnly(), PerCall(), tools=[recall.tool])
    await agent.ainvoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)
    answers = _answers(model.seen[1])
    statuses = sorted(a["status"] for a in answers.values())
    assert statuses == ["ok", "refused"]
    (lost,) = [a for a in answers.values() if a["status"] == "refused"]
    assert lost["refusal"]["reason"] == "rounds"
    rounds, reserved, _ = await _usage(hooks)
    assert (rounds, reserved) == (2, 3)  # a fourth slot was never reserved, yet a call was lost


async def test_an_interrupt_in_a_sibling_tool_resumes_without_reserving_again(
    hooks: RecallHooks,
) -> None:
    approvals: list[object] = []

    @tool
    def approve() -> str:
        """Ask the user for approval."""
        approvals.append(interrupt("approve?"))
        return "approved"

    calls = [*search_calls(QUERIES[:3]), {"name": "approve", "args": {}, "id": "a1",
                                          "type": "tool_call"}]
    model = fake_model(*calls)
    agent = _agent(model, RecallMiddleware(hooks, automatic=False), tools=[approve],
                   checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t1"}}
    first = await agent.ainvoke({"messages": [HumanMessage("Continue")]}, config,
                                context=CONTEXT)
    assert first["__interrupt__"]
    assert await _usage(hooks) == (1, 3, 3)
    await agent.ainvoke(Command(resume="yes"), config, context=CONTEXT)
    assert approvals == ["yes"]
    answers = _answers(model.seen[1])
    assert [answers[f"c{i}"]["status"] for i in range(3)] == ["ok"] * 3
    assert await _usage(hooks) == (1, 3, 3)  # the resume reserved nothing


class ApproveAfterRecall(RecallMiddleware):
    """An ``interrupt()`` inside the same ``aafter_model``: the whole hook re-runs on resume."""

    entered = 0

    async def aafter_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        ApproveAfterRecall.entered += 1
        update = await super().aafter_model(state, runtime)
        if update is not None:
            interrupt("approve the recall?")
        return update


async def test_a_hook_re_run_reuses_the_stored_answers(hooks: RecallHooks) -> None:
    ApproveAfterRecall.entered = 0
    model = fake_model(*search_calls())
    agent = _agent(model, ApproveAfterRecall(hooks, automatic=False),
                   checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t2"}}
    await agent.ainvoke({"messages": [HumanMessage("Continue")]}, config, context=CONTEXT)
    before = await hooks.allowance.ledger.attempts(RUN)
    await agent.ainvoke(Command(resume="ok"), config, context=CONTEXT)
    assert ApproveAfterRecall.entered == 3  # dispatch, re-run on resume, after the final answer
    answers = _answers(model.seen[1])
    assert [a["status"] for a in answers.values()].count("ok") == 4
    assert await _usage(hooks) == (1, 4, 4)  # one round: the re-run reserved nothing
    assert await hooks.allowance.ledger.attempts(RUN) == before


async def test_a_hook_re_run_in_a_fresh_process_replays_the_checkpointed_batch(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A new process (new hooks, new middleware) re-runs the hook: the batch's results come
    from the checkpoint (never dispatched again): the two searches that ran answer with their
    evidence re-read under the validation bound, the four refused then stay refused."""
    saver = InMemorySaver()  # stands in for a durable checkpointer
    config: Any = {"configurable": {"thread_id": "t3"}}
    async with open_hooks(_config(tmp_path), clock=clock) as hooks:
        retriever = hooks.retriever
        assert isinstance(retriever, MemoryRetriever)
        await seed(retriever.store)
        model = fake_model(*search_calls())
        agent = _agent(model, ApproveAfterRecall(hooks, working_state=work_in_progress),
                       checkpointer=saver)
        await agent.ainvoke({"messages": [HumanMessage("Continue")]}, config, context=CONTEXT)
        assert await _usage(hooks) == (2, 4, 4)  # automatic 1-2, then slots 3-4, interrupted
    async with open_hooks(_config(tmp_path), clock=clock) as hooks:
        model = fake_model()  # only the final answer is left to say
        model.messages = iter([AIMessage(content="Done.")])
        agent = _agent(model, ApproveAfterRecall(hooks, working_state=work_in_progress),
                       checkpointer=saver)
        await agent.ainvoke(Command(resume="ok"), config, context=CONTEXT)
        answers = _answers(model.seen[0])
        assert len(answers) == 6
        ok = [a for a in answers.values() if a["status"] == "ok"]
        refused = [a for a in answers.values() if a["status"] == "refused"]
        assert len(ok) == 2 and len(refused) == 4
        assert all(a["evidence_ids"] for a in ok)
        assert {a["refusal"]["reason"] for a in refused} == {"slots"}  # as they were
        assert await _usage(hooks) == (2, 4, 4)  # nothing reserved or run again
        assert (await hooks.allowance.ledger.usage(RUN)).refused == 4


async def test_the_run_identity_comes_from_the_context_only(hooks: RecallHooks) -> None:
    model = fake_model(*search_calls(QUERIES[:1]))
    agent = _agent(model, RecallMiddleware(hooks))
    with pytest.raises(MissingRecallContextError):
        await agent.ainvoke({"messages": [HumanMessage("Continue")]})
    recall = LangChainRecall(hooks)
    owner = recall.run(CONTEXT)
    # Nothing bound yet: the registry leaves another identity for the ledger to judge.
    stranger = recall.run(dataclasses.replace(CONTEXT, principal="bo"))
    await owner.dispatch_batch([ToolCall(call_id="c0", arguments={"query": QUERIES[0]})])
    assert recall.run(CONTEXT) is owner  # the ledger bound it: the registry keeps it
    with pytest.raises(RecallContextMismatchError):
        recall.run(dataclasses.replace(CONTEXT, principal="bo"))
    with pytest.raises(RecallContextMismatchError):
        await stranger.dispatch_batch([ToolCall(call_id="c1", arguments={"query": QUERIES[1]})])
    assert await _usage(hooks) == (1, 1, 1)



@pytest.mark.parametrize(("identity", "returned"), [
    (lambda context: {"run_id": RUN, "scope": SCOPE, "principal": PRINCIPAL}, "dict"),
    (lambda context: None, "NoneType"),
], ids=["dict", "None"])
@pytest.mark.parametrize("automatic", [True, False])
async def test_an_identity_callable_of_the_wrong_type_is_a_typed_error(
    hooks: RecallHooks, identity: Any, returned: str, automatic: bool
) -> None:
    model = fake_model(*search_calls(QUERIES[:1]))
    agent = _agent(model, RecallMiddleware(hooks, identity=identity, automatic=automatic))
    with pytest.raises(MissingRecallContextError, match=f"got {returned}"):
        await agent.ainvoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)
    assert issubclass(MissingRecallContextError, TypeError)
    assert await _usage(hooks) == (0, 0, 0)


async def test_the_tool_without_its_hook_searches_nothing(hooks: RecallHooks) -> None:
    recall = LangChainRecall(hooks)
    model = fake_model(*search_calls(QUERIES[:1]))
    agent = _agent(model, tools=[recall.tool])
    await agent.ainvoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)
    (answer,) = _answers(model.seen[1]).values()
    assert answer["status"] == "failed" and "not dispatched" in answer["content"]
    assert await _usage(hooks) == (0, 0, 0)


# -- a hand-built LangGraph graph ----------------------------------------------------------


def _graph(node: Callable[..., Any]) -> Any:
    graph = StateGraph(MessagesState, context_schema=RecallContext)
    graph.add_node("tools", node)
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile()


def _batch() -> dict[str, Any]:
    return {"messages": [HumanMessage("Continue"), AIMessage(content="",
                                                             tool_calls=search_calls())]}


def _ok_slots(messages: Sequence[BaseMessage]) -> list[str]:
    return [cid for cid, a in _answers(messages).items() if a["status"] == "ok"]


async def test_hand_built_graph_async_node_runs_four_calls_on_distinct_slots(
    hooks: RecallHooks,
) -> None:
    node = RecallToolNode.with_tools(LangChainRecall(hooks))
    out = await _graph(node.ainvoke).ainvoke(_batch(), context=CONTEXT)
    assert len(_ok_slots(out["messages"])) == 4
    assert sorted(s for s, _ in await _slots(hooks)) == [1, 2, 3, 4]
    assert await _usage(hooks) == (1, 4, 4)


async def test_hand_built_graph_sync_invoke_dispatches_on_the_loop_and_reads_in_threads(
    hooks: RecallHooks,
) -> None:
    threads: list[tuple[str, object]] = []

    @tool
    def where(runtime: ToolRuntime[Any, Any]) -> str:
        """Report the thread and the permit a tool sees."""
        threads.append((threading.current_thread().name, current_permit()))
        return "here"

    node = RecallToolNode.with_tools(LangChainRecall(hooks), [where])
    batch = _batch()
    batch["messages"][-1].tool_calls.append({"name": "where", "args": {}, "id": "w",
                                             "type": "tool_call"})
    graph = _graph(node.invoke)
    out = await anyio.to_thread.run_sync(functools.partial(graph.invoke, batch,
                                                           context=CONTEXT))
    assert len(_ok_slots(out["messages"])) == 4
    assert sorted(s for s, _ in await _slots(hooks)) == [1, 2, 3, 4]
    assert await _usage(hooks) == (1, 4, 4)
    # The tools ran in the ToolNode's pool threads; the round was already closed, and no
    # permit reached them: they only read the stored results.
    ((name, permit),) = threads
    assert name != threading.current_thread().name and permit is None


async def test_hand_built_graph_sync_invoke_on_the_loop_thread_is_a_typed_error(
    hooks: RecallHooks,
) -> None:
    node = RecallToolNode.with_tools(LangChainRecall(hooks))
    with pytest.raises(NotDispatchedError):
        _graph(node.invoke).invoke(_batch(), context=CONTEXT)
    assert await _usage(hooks) == (0, 0, 0)


async def test_hand_built_graph_with_the_automatic_round_in_its_model_node(
    hooks: RecallHooks,
) -> None:
    recall = LangChainRecall(hooks, working_state=work_in_progress)
    seen: list[str] = []

    async def model(state: dict[str, Any], runtime: Runtime[Any]) -> dict[str, Any]:
        seen.append(await recall.automatic_context(state["messages"], runtime.context))
        return {"messages": [AIMessage(content="", tool_calls=search_calls())]}

    graph = StateGraph(MessagesState, context_schema=RecallContext)
    graph.add_node("model", model)
    graph.add_node("tools", RecallToolNode.with_tools(recall).ainvoke)
    graph.add_edge(START, "model")
    graph.add_edge("model", "tools")
    graph.add_edge("tools", END)
    out = await graph.compile().ainvoke({"messages": [HumanMessage("Continue")]},
                                        context=CONTEXT)
    (block,) = seen
    assert "m-backfill" in block
    assert len(_ok_slots(out["messages"])) == 2
    assert await _slots(hooks) == [(1, "base"), (2, "delta"), (3, "deliberate"),
                                   (4, "deliberate")]
    assert await _usage(hooks) == (2, 4, 4)


@dataclasses.dataclass(frozen=True)
class HostContext:
    """A host's own runtime context, carrying the recall identity among its fields."""

    user_name: str
    recall: RecallContext


async def test_a_host_context_may_carry_the_recall_identity(hooks: RecallHooks) -> None:
    model = fake_model(*search_calls(QUERIES[:1]))
    agent = create_agent(model, middleware=[RecallMiddleware(hooks, automatic=False)],
                         context_schema=HostContext)
    await agent.ainvoke({"messages": [HumanMessage("Continue")]},
                        context=HostContext(user_name="Ana", recall=CONTEXT))
    assert [a["status"] for a in _answers(model.seen[1]).values()] == ["ok"]
    assert await _usage(hooks) == (1, 1, 1)


def test_the_recall_block_is_appended_to_any_system_message() -> None:
    assert system_with_context(None, "B").content == "B"
    assert system_with_context(SystemMessage(content="S"), "B").content == "S\n\nB"
    blocks = SystemMessage(content=[{"type": "text", "text": "S"}])
    assert system_with_context(blocks, "B").content == [{"type": "text", "text": "S"},
                                                        {"type": "text", "text": "B"}]


# -- agent turns as create_agent runs them: one automatic round per invocation ----------------


def scripted(*replies: AIMessage) -> FakeModel:
    """A fake model answering with ``replies`` in order, then "Done."."""
    return FakeModel(messages=iter([*replies, AIMessage(content="Done.")]), seen=[])


def calls_message(*calls: dict[str, Any]) -> AIMessage:
    return AIMessage(content="", tool_calls=list(calls))


@tool
def lookup_ticket() -> str:
    """The ticket the user works on."""
    return "BILL-7: invoice backfill"


async def _drive_agent(agent: Any, mode: str, **kwargs: Any) -> None:
    given = {"messages": [HumanMessage("Continue")]}
    if mode == "ainvoke":
        await agent.ainvoke(given, context=CONTEXT, **kwargs)
    else:
        async for _ in agent.astream(given, context=CONTEXT, **kwargs):
            pass


@pytest.mark.parametrize("mode", ["ainvoke", "astream"])
async def test_another_tool_first_then_six_searches_two_run_on_slots_3_and_4(
    hooks: RecallHooks, mode: str
) -> None:
    model = scripted(calls_message({"name": "lookup_ticket", "args": {}, "id": "t1",
                                    "type": "tool_call"}),
                     calls_message(*search_calls()))
    agent = _agent(model, RecallMiddleware(hooks, working_state=work_in_progress),
                   tools=[lookup_ticket])
    await _drive_agent(agent, mode)

    first, second, third = model.seen
    assert "m-backfill" in _system(first)
    assert _system(first) == _system(second) == _system(third)  # one round, one context
    answers = _answers(third)
    assert list(answers) == [f"c{i}" for i in range(6)]
    refused = [a for a in answers.values() if a["status"] == "refused"]
    assert len(refused) == 4 and [a["status"] for a in answers.values()].count("ok") == 2
    assert {a["refusal"]["reason"] for a in refused} == {"slots"}
    assert all("Memory recall was bounded" in a["content"] for a in refused)
    assert sorted(s for s, k in await _slots(hooks) if k == "deliberate") == [3, 4]
    kinds = [r.kind.value for r in await hooks.allowance.ledger.reservations(RUN)]
    assert kinds == ["automatic", "deliberate"]
    assert (await hooks.allowance.ledger.usage(RUN)).refused == 4



@pytest.mark.parametrize("recall_first", [False, True])
async def test_a_prompt_middleware_listed_before_recall_keeps_the_recalled_context(
    hooks: RecallHooks, recall_first: bool,
) -> None:
    """A middleware that sets the system prompt replaces the whole system message of the
    request it is given. Listed before ``RecallMiddleware`` it runs outside it, so the recalled
    context is added to its prompt; listed after, it replaces the context (the documented
    order is the first)."""

    @dynamic_prompt
    def prompt(request: Any) -> str:
        return "You help with the billing migration."

    model = fake_model()
    recall = RecallMiddleware(hooks, working_state=work_in_progress)
    middleware = (recall, prompt) if recall_first else (prompt, recall)
    await _agent(model, *middleware).ainvoke({"messages": [HumanMessage("Continue")]},
                                             context=CONTEXT)
    system = _system(model.seen[0])
    assert "You help with the billing migration." in system
    assert ("Recalled memory:" in system) is not recall_first
    assert await _usage(hooks) == (1, 2, 2)  # the round is spent in either order


async def test_each_invocation_prepares_its_own_context_and_none_leaks(
    hooks: RecallHooks,
) -> None:
    """Three invocations of one run on one checkpointed thread: each prepares again (round 1,
    round 2, then the bounded notice); none sees the context prepared for another."""
    model = FakeModel(messages=iter([AIMessage(content="Done.")] * 3), seen=[])
    agent = _agent(model, RecallMiddleware(hooks, working_state=work_in_progress),
                   checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "turns"}}
    for _ in range(3):
        await agent.ainvoke({"messages": [HumanMessage("Continue")]}, config,
                            context=CONTEXT)
    systems = [_system(seen) for seen in model.seen]
    assert "m-backfill" in systems[0] and "Recalled memory:" in systems[1]
    assert "Memory recall was bounded" in systems[2] and "Recalled memory:" not in systems[2]
    state = await agent.aget_state(config)
    assert state.values.get("recall_context") is None  # cleared when each invocation ended
    usage = await hooks.allowance.ledger.usage(RUN)
    assert (usage.rounds, usage.reserved, usage.refused) == (2, 4, 1)


async def test_a_reused_call_id_with_other_arguments_is_a_new_call(hooks: RecallHooks) -> None:
    model = scripted(
        calls_message({"name": SEARCH_TOOL.name, "args": {"query": "invoice backfill"},
                       "id": "c0", "type": "tool_call"}),
        calls_message({"name": SEARCH_TOOL.name, "args": {"query": "cutover date"},
                       "id": "c0", "type": "tool_call"}),
    )
    agent = _agent(model, RecallMiddleware(hooks, automatic=False))
    await _drive_agent(agent, "ainvoke")
    first = [json.loads(str(m.content)) for m in model.seen[1] if isinstance(m, ToolMessage)]
    second = [json.loads(str(m.content)) for m in model.seen[2] if isinstance(m, ToolMessage)]
    assert [a["status"] for a in second] == ["ok", "ok"]
    assert "m-backfill" in first[0]["evidence_ids"]
    assert "m-cutover" in second[1]["evidence_ids"]
    assert "m-backfill" not in second[1]["evidence_ids"]
    assert sorted(s for s, _ in await _slots(hooks)) == [1, 2]
    assert await _usage(hooks) == (2, 2, 2)


async def test_a_reused_call_id_in_a_hand_built_graph_is_a_new_call(hooks: RecallHooks) -> None:
    node = RecallToolNode.with_tools(LangChainRecall(hooks))
    graph = _graph(node.ainvoke)
    first = await graph.ainvoke({"messages": [HumanMessage("Continue"), calls_message(
        {"name": SEARCH_TOOL.name, "args": {"query": "invoice backfill"}, "id": "c0",
         "type": "tool_call"})]}, context=CONTEXT)
    second = await graph.ainvoke({"messages": [*first["messages"], calls_message(
        {"name": SEARCH_TOOL.name, "args": {"query": "cutover date"}, "id": "c0",
         "type": "tool_call"})]}, context=CONTEXT)
    last = json.loads(str(second["messages"][-1].content))
    assert last["status"] == "ok" and "m-cutover" in last["evidence_ids"]
    assert "m-backfill" not in last["evidence_ids"]
    assert await _usage(hooks) == (2, 2, 2)


async def test_after_eviction_another_principal_is_still_refused(hooks: RecallHooks) -> None:
    recall = LangChainRecall(hooks, max_runs=1)
    batch = _batch()["messages"]
    await recall.answer_batch(batch, CONTEXT)
    recall.run(dataclasses.replace(CONTEXT, run_id="another"))  # evicts RUN from the registry
    with pytest.raises(RecallContextMismatchError, match=RUN):
        await recall.answer_batch(batch, dataclasses.replace(CONTEXT, principal="mallory"))
    assert RecallContextMismatchError is RunIdentityError
    assert await _usage(hooks) == (1, 4, 4)


async def test_a_run_forgotten_between_the_batch_and_the_tools_keeps_its_answers(
    hooks: RecallHooks,
) -> None:
    """A sibling tool makes other runs push this run out of the registry (``max_runs=1``)
    after the node dispatched the batch: the search tools still read its results."""
    recall = LangChainRecall(hooks, max_runs=1)

    @tool
    async def crowd() -> str:
        """Other runs arrive."""
        for i in range(3):
            recall.run(dataclasses.replace(CONTEXT, run_id=f"other-{i}"))
        return "crowded"

    node = RecallToolNode(recall, ToolNode([crowd, recall.tool]))
    batch = _batch()
    batch["messages"][-1].tool_calls.insert(0, {"name": "crowd", "args": {}, "id": "x",
                                                "type": "tool_call"})
    out = await _graph(node.ainvoke).ainvoke(batch, context=CONTEXT)
    answers = _answers(out["messages"])
    assert sorted(a["status"] for a in answers.values()) == ["ok"] * 4 + ["refused"] * 2
    assert await _usage(hooks) == (1, 4, 4)


async def test_a_call_another_process_is_running_answers_in_flight_in_a_hand_built_graph(
    hooks: RecallHooks,
) -> None:
    """Claimed elsewhere and not finished: the node's batch answers it ``in_flight`` (never a
    second search), and the tool says so rather than that the hook never saw it."""
    call = search_calls()[0]
    await hooks.allowance.ledger.claim_calls(
        RUN, [(call["id"], arguments_digest(call["args"]))])
    node = RecallToolNode.with_tools(LangChainRecall(hooks))
    out = await _graph(node.ainvoke).ainvoke(
        {"messages": [HumanMessage("Continue"), AIMessage(content="", tool_calls=[call])]},
        context=CONTEXT)
    answer = _answers(out["messages"])[call["id"]]
    assert (answer["status"], answer["failure"]) == ("failed", "in_flight")
    assert "not evidence" in answer["content"]
    assert await _usage(hooks) == (0, 0, 0)


# -- resume after a restart: RecallToolNode with a checkpointer ---------------------------------


def _approval_graph(recall: LangChainRecall, saver: InMemorySaver, approvals: list[object],
                    sync: bool = False) -> Any:
    @tool
    def approve() -> str:
        """Ask the user for approval."""
        approvals.append(interrupt("approve?"))
        return "approved"

    def model(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [calls_message(*search_calls(QUERIES[:3]), {
            "name": "approve", "args": {}, "id": "a1", "type": "tool_call"})]}

    node = RecallToolNode.with_tools(recall, [approve])
    graph = StateGraph(MessagesState, context_schema=RecallContext)
    graph.add_node("model", model)
    graph.add_node("tools", node.invoke if sync else node.ainvoke)
    graph.add_edge(START, "model")
    graph.add_edge("model", "tools")
    graph.add_edge("tools", END)
    return graph.compile(checkpointer=saver)


async def _invoke(graph: Any, given: Any, config: Any, sync: bool) -> Any:
    if sync:  # a sync graph.invoke, from a worker thread of the hooks' loop
        return await anyio.to_thread.run_sync(functools.partial(
            graph.invoke, given, config, context=CONTEXT))
    return await graph.ainvoke(given, config, context=CONTEXT)


@pytest.mark.parametrize(("validation_limit", "sync"), [(8, False), (1, False), (8, True)])
async def test_a_tools_node_resumed_in_a_new_process_never_dispatches_again(
    tmp_path: Path, clock: ManualClock, validation_limit: int, sync: bool
) -> None:
    """An ``interrupt()`` in a sibling tool, then a resume in a fresh process (new hooks, new
    node, the same checkpointer): the three searches that ran are neither run again nor
    reported as refused; they answer with their evidence re-read under the validation bound
    (what the bound no longer covers is said in the bounded wording)."""
    saver = InMemorySaver()  # stands in for a durable checkpointer
    config: Any = {"configurable": {"thread_id": "restart"}}
    approvals: list[object] = []
    async with open_hooks(_config(tmp_path), clock=clock) as hooks:
        retriever = hooks.retriever
        assert isinstance(retriever, MemoryRetriever)
        await seed(retriever.store)
        first = await _invoke(_approval_graph(LangChainRecall(hooks), saver, approvals, sync),
                              {"messages": [HumanMessage("Continue")]}, config, sync)
        assert first["__interrupt__"]
        assert await _usage(hooks) == (1, 3, 3)
        before = await hooks.allowance.ledger.attempts(RUN)
    async with open_hooks(_config(tmp_path), clock=clock) as hooks:
        hooks.validation_limit = validation_limit
        out = await _invoke(_approval_graph(LangChainRecall(hooks), saver, approvals, sync),
                            Command(resume="yes"), config, sync)
        assert approvals == ["yes"]
        answers = _answers(out["messages"])
        assert sorted(answers) == ["c0", "c1", "c2"]
        assert {a["status"] for a in answers.values()} == {"ok"}
        assert await _usage(hooks) == (1, 3, 3)  # nothing reserved, nothing run again
        assert await hooks.allowance.ledger.attempts(RUN) == before
        assert (await hooks.allowance.ledger.usage(RUN)).refused == 0
        assert "m-backfill" in answers["c0"]["evidence_ids"]
        rechecked = [a for a in answers.values() if "could not be re-checked" in a["content"]]
        if validation_limit == 8:
            assert not rechecked
        else:  # one re-check left for the run: the rest is said to be bounded
            assert rechecked and all("not evidence" in a["content"] for a in rechecked)


# -- a sync agent.invoke --------------------------------------------------------------------


def _sync_agent(hooks: RecallHooks) -> tuple[Any, ScriptedChatModel]:
    model = ScriptedChatModel(searches(*QUERIES), "Done.")
    middleware = RecallMiddleware(hooks, working_state=work_in_progress)
    agent = create_agent(model, middleware=[middleware], context_schema=RecallContext)
    return agent, model


async def test_sync_invoke_from_a_worker_thread_runs_like_ainvoke(hooks: RecallHooks) -> None:
    agent, model = _sync_agent(hooks)  # built on the hooks' loop
    out = await anyio.to_thread.run_sync(functools.partial(
        agent.invoke, {"messages": [HumanMessage("Continue")]}, context=CONTEXT))
    first, second = model.requests
    assert "m-backfill" in first.instructions
    assert second.instructions == first.instructions  # one automatic round per invocation
    statuses = [answer["status"] for answer in second.answers().values()]
    assert sorted(statuses) == ["ok"] * 2 + ["refused"] * 4
    assert out["messages"][-1].content == "Done."
    assert "recall_context" not in out
    assert await _slots(hooks) == [(1, "base"), (2, "delta"), (3, "deliberate"),
                                   (4, "deliberate")]
    assert await _usage(hooks) == (2, 4, 4)


def test_sync_invoke_from_sync_code_through_a_blocking_portal(tmp_path: Path) -> None:
    with anyio.from_thread.start_blocking_portal("asyncio") as portal:
        config = RecallConfig(ledger_path=tmp_path / "ledger.db",
                              store_path=tmp_path / "memory.db")
        with portal.wrap_async_context_manager(open_hooks(config)) as hooks:
            portal.call(_seed, hooks)
            agent, model = portal.call(_sync_agent, hooks)  # built on the portal's loop
            agent.invoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)
            usage = portal.call(hooks.allowance.ledger.usage, RUN)
    assert "Recalled memory" in model.requests[0].instructions
    assert (usage.rounds, usage.reserved) == (2, 4)


async def _seed(hooks: RecallHooks) -> None:
    retriever = hooks.retriever
    assert isinstance(retriever, MemoryRetriever)
    await seed(retriever.store)


async def test_sync_invoke_on_the_loop_thread_is_a_typed_error(hooks: RecallHooks) -> None:
    agent, _ = _sync_agent(hooks)
    with pytest.raises(NotDispatchedError, match="worker thread"):
        agent.invoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)
    assert await _usage(hooks) == (0, 0, 0)


def test_sync_invoke_of_a_middleware_built_outside_a_loop_is_a_typed_error(
    tmp_path: Path,
) -> None:
    with anyio.from_thread.start_blocking_portal("asyncio") as portal:
        config = RecallConfig(ledger_path=tmp_path / "ledger.db",
                              store_path=tmp_path / "memory.db")
        with portal.wrap_async_context_manager(open_hooks(config)) as hooks:
            agent, _ = _sync_agent(hooks)  # built in this thread: no loop to run on
            with pytest.raises(NotDispatchedError, match="inside that loop"):
                agent.invoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)


# -- a hand-built graph whose model node asks for the automatic context at every request ------


def _agent_graph(recall: LangChainRecall, model: ScriptedChatModel) -> Any:
    """model -> tools -> model -> ... -> END, the automatic context asked for at every
    model request (where a user puts it)."""

    async def call_model(state: MessagesState, runtime: Runtime[RecallContext]) -> Any:
        block = await recall.automatic_context(state["messages"], runtime.context)
        reply = await model.ainvoke([SystemMessage(block), *state["messages"]])
        return {"messages": [reply]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState, context_schema=RecallContext)
    graph.add_node("model", call_model)
    graph.add_node("tools", RecallToolNode.with_tools(recall).ainvoke)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile()


async def test_hand_built_graph_runs_the_automatic_round_once_per_invocation(
    hooks: RecallHooks,
) -> None:
    recall = LangChainRecall(hooks, working_state=work_in_progress)
    model = ScriptedChatModel((search("invoice backfill", call_id="a"),),
                              (search("cutover date", call_id="b"),), "Done.", "Done again.")
    graph = _agent_graph(recall, model)
    await graph.ainvoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)
    first, second, third = (request.instructions for request in model.requests)
    assert "m-backfill" in first
    assert second == third == first  # three model requests, one automatic round
    answers = model.requests[2].answers()
    assert answers["a"]["status"] == "ok"
    assert answers["b"]["refusal"]["reason"] == "rounds"  # round 2 went to "a"
    assert [r.kind.value for r in await hooks.allowance.ledger.reservations(RUN)] == [
        "automatic", "deliberate"]

    # The next invocation prepares again: its own round is refused (no round left), and
    # nothing prepared for the first invocation reaches it.
    await graph.ainvoke({"messages": [HumanMessage("Continue")]}, context=CONTEXT)
    fourth = model.requests[3].instructions
    assert "bounded" in fourth and "not evidence" in fourth
    assert "m-backfill" not in fourth
    usage = await hooks.allowance.ledger.usage(RUN)
    assert (usage.rounds, usage.reserved, usage.executed) == (2, 3, 3)
    assert sorted(r.reason.value for r in await hooks.allowance.ledger.refusals(RUN)) == [
        "rounds", "rounds"]


async def test_automatic_context_outside_a_graph_runs_a_round_each_call(
    hooks: RecallHooks,
) -> None:
    recall = LangChainRecall(hooks, working_state=work_in_progress)
    messages = [HumanMessage("Continue")]
    assert "m-backfill" in await recall.automatic_context(messages, CONTEXT)
    assert "Recalled memory" in await recall.automatic_context(messages, CONTEXT)
    assert (await _usage(hooks))[:2] == (2, 4)
