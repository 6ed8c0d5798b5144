"""Bounded recall in a LangChain ``create_agent`` run, offline, with a fake chat model.

The user says "Continue"; the model answers with 6 parallel ``search_memory`` calls, then with
a final text. ``RecallMiddleware`` runs the automatic round once for the invocation (before
its first model request; the second request sees the same context and takes no round) and
dispatches the 6 calls as one deliberate round in ``after_model``. The script prints what the
model saw on each request and the ledger's counts.

    python examples/langchain_agent.py
"""

from __future__ import annotations

import json
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from plugin import WorkingState
from runtime_hooks.adapters import SEARCH_TOOL
from runtime_hooks.adapters.langchain import RecallContext, RecallMiddleware, latest_request
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed_store

QUERIES = ("invoice backfill", "rounding rule", "cutover date", "deploy window",
           "rollback runbook", "kickoff notes")


class ScriptedModel(GenericFakeChatModel):
    """Six search calls after the user's message, a final answer after the tool results."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        if isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content="Here is where the migration stands.")
        else:
            reply = AIMessage(content="", tool_calls=[
                {"name": SEARCH_TOOL.name, "args": {"query": q}, "id": f"call-{i}",
                 "type": "tool_call"} for i, q in enumerate(QUERIES)])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def work_in_progress(messages: Sequence[AnyMessage]) -> WorkingState | None:
    """The host's working state: its task list, with the user's latest message as request."""
    request = latest_request(messages)
    return None if request is None else attrs.evolve(STATE,
                                                      current_request=request.current_request)


def show(seen: list[list[BaseMessage]]) -> None:
    for number, messages in enumerate(seen, 1):
        print(f"=== model request {number}: what the model saw")
        for message in messages:
            kind = type(message).__name__
            if isinstance(message, ToolMessage):
                answer = json.loads(str(message.content))
                refusal = answer.get("refusal")
                detail = (f"refused ({refusal['reason']}): {answer['content']}" if refusal
                          else f"{answer['status']}: {answer['content']}")
                print(f"- {kind} {message.tool_call_id} [{message.status}] "
                      + textwrap.shorten(detail, 110))
            elif isinstance(message, AIMessage) and message.tool_calls:
                print(f"- {kind}: {len(message.tool_calls)} search calls")
            else:
                print(f"- {kind}:")
                print(textwrap.indent(str(message.content), "    "))


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:

        async def admit(experiment: str) -> bool:
            return experiment == "task_context"

        config = RecallConfig(ledger_path=Path(folder) / "ledger.db",
                              store_path=Path(folder) / "memory.db",
                              query_planning="task_context", admission=admit)
        await seed_store(config)
        async with open_hooks(config) as hooks:
            model = ScriptedModel(messages=iter(()))
            # The few lines a user adds: the middleware (it brings the search tool), the
            # context schema, and the run's trusted identity on each invocation.
            agent = create_agent(
                model,
                middleware=[RecallMiddleware(hooks, working_state=work_in_progress)],
                context_schema=RecallContext,
            )
            context = RecallContext(run_id="example-run", scope=SCOPE, principal=PRINCIPAL)
            await agent.ainvoke({"messages": [HumanMessage("Continue")]}, context=context)
            show(model.seen)
            usage = await hooks.allowance.ledger.usage(context.run_id)
            attempts = await hooks.allowance.ledger.attempts(context.run_id)
            print("=== ledger")
            print(f"rounds={usage.rounds} reserved={usage.reserved} executed={usage.executed} "
                  f"refused={usage.refused}")
            print("attempts: " + ", ".join(f"slot {a.slot} {a.kind}" for a in attempts))


if __name__ == "__main__":
    anyio.run(main, backend="asyncio")
