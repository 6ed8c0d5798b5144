"""Bounded recall in a LangChain ``create_agent`` run, offline, with a scripted chat model.

The user says "Continue"; the model answers with 6 parallel ``search_memory`` calls, then with
a final text. ``RecallMiddleware`` runs the automatic round once for the invocation (before
its first model request; the second request sees the same context and takes no round) and
dispatches the 6 calls as one deliberate round in ``after_model``. The script prints what the
model saw on each request and the ledger's counts.

    python examples/langchain_agent.py
"""

from __future__ import annotations

import tempfile
import textwrap
import uuid
from collections.abc import Sequence
from pathlib import Path

import anyio
import attrs
from langchain.agents import create_agent
from langchain_core.messages import AnyMessage, HumanMessage

from plugin import WorkingState
from runtime_hooks.adapters.langchain import RecallContext, RecallMiddleware, latest_request
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed_store
from runtime_hooks.testing import ModelRequest, searches
from runtime_hooks.testing.langchain import ScriptedChatModel

QUERIES = ("invoice backfill", "rounding rule", "cutover date", "deploy window",
           "rollback runbook", "kickoff notes")


def work_in_progress(messages: Sequence[AnyMessage]) -> WorkingState | None:
    """The host's working state: its task list, with the user's latest message as request."""
    request = latest_request(messages)
    return None if request is None else attrs.evolve(STATE,
                                                      current_request=request.current_request)


def show(requests: Sequence[ModelRequest]) -> None:
    for number, request in enumerate(requests, 1):
        print(f"=== model request {number}: what the model saw")
        print("- system message:")
        print(textwrap.indent(request.instructions or "(none)", "    "))
        for call_id, answer in request.answers().items():
            refusal = answer.get("refusal")
            detail = (f"refused ({refusal['reason']}): {answer['content']}" if refusal
                      else f"{answer['status']}: {answer['content']}")
            print(f"- ToolMessage {call_id} " + textwrap.shorten(detail, 110))


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:

        async def admit(experiment: str) -> bool:
            return experiment == "task_context"

        config = RecallConfig(ledger_path=Path(folder) / "ledger.db",
                              store_path=Path(folder) / "memory.db",
                              query_planning="task_context", admission=admit)
        await seed_store(config)
        async with open_hooks(config) as hooks:
            model = ScriptedChatModel(searches(*QUERIES), "Here is where the migration stands.")
            # The few lines a user adds: the middleware (it brings the search tool), the
            # context schema, and the run's trusted identity on each invocation.
            agent = create_agent(
                model,
                middleware=[RecallMiddleware(hooks, working_state=work_in_progress)],
                context_schema=RecallContext,
            )
            context = RecallContext(run_id=f"example-{uuid.uuid4()}", scope=SCOPE,
                                    principal=PRINCIPAL)
            await agent.ainvoke({"messages": [HumanMessage("Continue")]}, context=context)
            show(model.requests)
            usage = await hooks.allowance.ledger.usage(context.run_id)
            attempts = await hooks.allowance.ledger.attempts(context.run_id)
            print("=== ledger")
            print(f"rounds={usage.rounds} reserved={usage.reserved} executed={usage.executed} "
                  f"refused={usage.refused}")
            print("attempts: " + ", ".join(f"slot {a.slot} {a.kind}" for a in attempts))


if __name__ == "__main__":
    anyio.run(main, backend="asyncio")
