"""A model's search call whose arguments JSON cannot hold, in a real framework turn.

``create_agent`` hands the middleware each tool call's arguments as the chat model built them
(a dict). Arguments nested deeper than Python can walk, or holding an int too long to print,
are one bad call: that call answers ``invalid``, its neighbour is searched, and the turn goes
on. Asyncio only (LangChain does not run under trio); the real ``open_hooks()`` on a temporary
ledger and store, a ManualClock, and a chat model of the test's own (``BaseChatModel``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from plugin import ManualClock
from plugin.memory import MemoryStore
from runtime_hooks import RecallHooks
from runtime_hooks.adapters.langchain import RecallContext, RecallMiddleware
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.calls import canonical_arguments

pytestmark = [pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # LangChain does not run under trio


@pytest.fixture
async def hooks(tmp_path: Path) -> AsyncIterator[RecallHooks]:
    async with MemoryStore(tmp_path / "memory.db") as store:
        await store.remember(
            "The cutover date is Friday 14 March.", principal="ana", scope="atlas", id="cutover"
        )
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db")
    async with open_hooks(config, clock=ManualClock(wall=1_800_000_000.0, monotonic=10.0)) as hooks:
        yield hooks


class ToolCallingModel(BaseChatModel):
    """A chat model that sends the tool calls it is given, then a final answer."""

    calls: list[dict[str, Any]]
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "tool-calling-test-model"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ToolCallingModel:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        if len(self.seen) == 1:
            message = AIMessage(
                content="",
                tool_calls=[
                    {"name": "search_memory", "args": args, "id": f"call-{i}", "type": "tool_call"}
                    for i, args in enumerate(self.calls)
                ],
            )
        else:
            message = AIMessage(content="done")
        return ChatResult(generations=[ChatGeneration(message=message)])


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


UNREADABLE = [
    pytest.param({"query": "cutover", "filter": _nested(5000)}, id="nested-too-deep"),
    pytest.param({"query": _nested(5000)}, id="query-nested-too-deep"),
    pytest.param({"query": 10**5000}, id="query-int-too-long-to-print"),
    pytest.param({"query": "cutover", "limit": {"n": 10**5000}}, id="int-too-long-inside"),
]


@pytest.mark.parametrize("arguments", UNREADABLE)
def test_canonical_arguments_answer_for_arguments_json_cannot_hold(arguments: Any) -> None:
    text = canonical_arguments(arguments)
    assert isinstance(text, str) and text == canonical_arguments(arguments)


@pytest.mark.parametrize("arguments", UNREADABLE)
async def test_a_call_with_unreadable_arguments_is_invalid_and_the_turn_goes_on(
    hooks: RecallHooks, arguments: Any
) -> None:
    model = ToolCallingModel(calls=[arguments, {"query": "cutover date"}])
    agent = create_agent(
        model,
        tools=[],
        middleware=[RecallMiddleware(hooks, automatic=False)],
        context_schema=RecallContext,
    )
    context = RecallContext(run_id="run-unreadable", scope="atlas", principal="ana")
    out = await agent.ainvoke({"messages": [HumanMessage("When is the cutover?")]}, context=context)
    assert out["messages"][-1].content == "done"
    answers = {
        m.tool_call_id: json.loads(str(m.content))
        for m in model.seen[1]
        if isinstance(m, ToolMessage)
    }
    assert answers["call-0"]["status"] == "invalid"
    assert answers["call-1"]["status"] == "ok"
    assert answers["call-1"]["evidence_ids"] == ["cutover"]
    usage = await hooks.allowance.usage("run-unreadable")
    assert (usage.rounds, usage.reserved, usage.executed) == (1, 1, 1)
