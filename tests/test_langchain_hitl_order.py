"""``RecallMiddleware`` with LangChain's ``HumanInTheLoopMiddleware`` reviewing search calls.

``after_model`` hooks run in reverse list order. Listed BEFORE the review, recall answers
after it: an approved call is searched, an edited call is searched with the reviewer's
arguments, and a rejected call is never searched and takes no slot. Listed after it, recall
searches every call before anyone reviews it. Asyncio only: LangChain and LangGraph do not
run under trio.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from plugin.memory.pipeline import MemoryRetriever
from runtime_hooks import RecallHooks
from runtime_hooks.adapters import SEARCH_TOOL
from runtime_hooks.adapters.langchain import RecallContext, RecallMiddleware

from . import test_adapter_langchain as adapter
from .test_adapter_langchain import CONTEXT, _agent, _usage, fake_model, search_calls

pytestmark = [pytest.mark.anyio]

ASKED = "invoice backfill"
EDITED = "rounding rule"
DECISIONS: dict[str, dict[str, Any]] = {
    "approve": {"type": "approve"},
    "edit": {"type": "edit",
             "edited_action": {"name": SEARCH_TOOL.name, "args": {"query": EDITED}}},
    "reject": {"type": "reject", "message": "Not now."},
}


hooks = adapter.hooks
"""The adapter tests' hooks: a temporary ledger and store, seeded with the demo memories."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def searched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The query text of every search the retriever runs."""
    texts: list[str] = []
    search = MemoryRetriever.search

    async def spy(self: MemoryRetriever, prepared: Any, *args: Any, **kwargs: Any) -> Any:
        texts.append(prepared.query.text)
        return await search(self, prepared, *args, **kwargs)

    monkeypatch.setattr(MemoryRetriever, "search", spy)
    return texts


async def _review(hooks: RecallHooks, recall_first: bool, decision: str
                  ) -> tuple[list[ToolMessage], tuple[int, int, int]]:
    """One search call, reviewed with ``decision``: the answers the model reads next, and
    the run's usage when the review was asked for."""
    model = fake_model(*search_calls((ASKED,)))
    recall = RecallMiddleware(hooks, automatic=False)
    review = HumanInTheLoopMiddleware(interrupt_on={SEARCH_TOOL.name: True})
    middleware = (recall, review) if recall_first else (review, recall)
    agent = _agent(model, *middleware, checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "review"}}
    paused = await agent.ainvoke({"messages": [HumanMessage("Continue")]}, config,
                                 context=CONTEXT)
    assert paused["__interrupt__"]
    at_review = await _usage(hooks)
    await agent.ainvoke(Command(resume={"decisions": [DECISIONS[decision]]}), config,
                        context=CONTEXT)
    answers = [m for m in model.seen[-1] if isinstance(m, ToolMessage)]
    return answers, at_review


@pytest.mark.parametrize("decision", ["approve", "edit", "reject"])
async def test_listed_before_the_review_recall_searches_only_what_the_reviewer_let_run(
    hooks: RecallHooks, searched: list[str], decision: str,
) -> None:
    answers, at_review = await _review(hooks, True, decision)
    assert at_review == (0, 0, 0)  # nothing searched, nothing reserved before the review
    (answer,) = answers  # one answer for the one call
    if decision == "reject":
        assert searched == [] and answer.status == "error"
        assert "rejected" in str(answer.content)
        assert await _usage(hooks) == (0, 0, 0)  # a rejected call takes no slot
        return
    assert searched == [EDITED if decision == "edit" else ASKED]
    assert answer.status == "success" and '"status": "ok"' in str(answer.content)
    if decision == "edit":  # the model is told the reviewer replaced its call
        assert "reviewer" in str(answer.content) and EDITED in str(answer.content)
    assert await _usage(hooks) == (1, 1, 1)


@pytest.mark.parametrize("decision", ["approve", "edit", "reject"])
async def test_listed_after_the_review_recall_searches_before_anyone_reviews(
    hooks: RecallHooks, searched: list[str], decision: str,
) -> None:
    """The documented wrong order: the search runs, and its slot is spent, before the
    review; an edit's answer is the model's own query, a reject adds a second answer."""
    answers, at_review = await _review(hooks, False, decision)
    assert at_review == (1, 1, 1)  # searched and reserved before the review
    assert searched == [ASKED]  # the edited query is never searched
    assert answers[0].status == "success" and '"status": "ok"' in str(answers[0].content)
    if decision == "reject":
        assert len(answers) == 2 and "rejected" in str(answers[1].content)
    else:
        assert len(answers) == 1
    assert await _usage(hooks) == (1, 1, 1)


class _Crowd(AgentMiddleware[Any, Any, Any]):
    """Listed before the recall middleware, its ``after_model`` runs after recall's and before
    the tools: as many other runs as the registry keeps come through meanwhile (a busy
    server), so the run that dispatched the edited call is forgotten before its tool reads."""

    def __init__(self, recall: RecallMiddleware) -> None:
        super().__init__()
        self.recall = recall

    def after_model(self, state: Any, runtime: Any) -> None:
        for n in range(self.recall.recall.max_runs):
            self.recall.recall.run(RecallContext(run_id=f"other-{n}", scope="s", principal="p"))

    async def aafter_model(self, state: Any, runtime: Any) -> None:
        self.after_model(state, runtime)


@pytest.mark.parametrize("sync", [False, True])
async def test_an_edited_call_whose_run_was_forgotten_is_answered_from_the_ledger(
    hooks: RecallHooks, searched: list[str], sync: bool
) -> None:
    # The edited call's answer comes through the tool node: if the registry forgot the run in
    # between, the tool must answer from the ledger's record, never "not dispatched".
    import functools

    import anyio

    model = fake_model(*search_calls((ASKED,)))
    recall = RecallMiddleware(hooks, automatic=False)
    review = HumanInTheLoopMiddleware(interrupt_on={SEARCH_TOOL.name: True})
    agent = _agent(model, _Crowd(recall), recall, review, checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "review"}}
    await agent.ainvoke({"messages": [HumanMessage("Continue")]}, config, context=CONTEXT)
    resume = Command(resume={"decisions": [DECISIONS["edit"]]})
    if sync:
        done = await anyio.to_thread.run_sync(functools.partial(
            agent.invoke, resume, config, context=CONTEXT))
    else:
        done = await agent.ainvoke(resume, config, context=CONTEXT)
    (answer,) = [m for m in done["messages"] if isinstance(m, ToolMessage)]
    assert searched == [EDITED]
    assert '"status": "ok"' in str(answer.content), answer.content
    assert "not dispatched" not in str(answer.content)
    assert await _usage(hooks) == (1, 1, 1)
