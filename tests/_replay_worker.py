"""One agent run in a process of its own, for the fresh-process replay tests.

``python -m tests._replay_worker FRAMEWORK KIND LOCATION [SCHEMA]``: FRAMEWORK is
``pydantic_ai`` or ``openai_agents``; KIND ``sqlite`` (LOCATION a file) or ``postgres``
(LOCATION a DSN, SCHEMA the ledger's schema). The scripted model emits the same two search
calls (same ids, same arguments) in every process. Prints one JSON line: the retriever's
searches, the run's (rounds, reserved, executed) and each call's status and evidence ids.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from plugin import ManualClock
from plugin.control import PostgresLedger, SqliteLedger
from runtime_hooks import RecallHooks
from runtime_hooks.adapters import SEARCH_TOOL

from ._calls_env import WALL, Counting, P, S, recall_hooks

RUN = "replayed-run"
CALLS = (("c0", "cutover date"), ("c1", "deploy window"))


async def pydantic_ai_run(hooks: RecallHooks) -> dict[str, Any]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from runtime_hooks.adapters.pydantic_ai import RecallCapability, RunIdentity

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart(SEARCH_TOOL.name, {"query": q},
                                                     tool_call_id=c) for c, q in CALLS])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(respond), deps_type=RunIdentity,
                  capabilities=[RecallCapability(hooks, automatic=False)])
    result = await agent.run("Continue", deps=RunIdentity(run_id=RUN, scope=S, principal=P))
    return {part.tool_call_id: part.content for message in result.all_messages()
            for part in getattr(message, "parts", ()) if isinstance(part, ToolReturnPart)}


async def openai_agents_run(hooks: RecallHooks) -> dict[str, Any]:
    from agents import Agent, RunConfig
    from agents.testing import ScriptedModel, assistant_message, function_call

    from runtime_hooks.adapters.openai_agents import agents_recall

    recall = agents_recall(hooks, automatic=False)
    model = ScriptedModel([[function_call(SEARCH_TOOL.name, {"query": q}, call_id=c)
                            for c, q in CALLS], [assistant_message("Done.")]])
    agent = Agent(name="assistant", instructions="Help.", model=model, tools=[recall.tool])
    await recall.run(agent, "Continue", run_id=RUN, scope=S, principal=P,
                     run_config=RunConfig(tracing_disabled=True))
    return {item["call_id"]: json.loads(item["output"]) for item in model.calls[1].input
            if isinstance(item, dict) and item.get("type") == "function_call_output"}


async def main(framework: str, kind: str, location: str, schema: str = "") -> None:
    ledger: Any = (SqliteLedger(location) if kind == "sqlite" else
                   PostgresLedger(location, schema=schema, time_source="caller"))
    retriever = Counting()
    async with ledger:
        hooks = recall_hooks(ledger, ManualClock(wall=WALL, monotonic=10.0), retriever)
        run = pydantic_ai_run if framework == "pydantic_ai" else openai_agents_run
        returns = await run(hooks)
        usage = await ledger.usage(RUN)
    print(json.dumps({
        "searches": retriever.searches, "usage": [usage.rounds, usage.reserved, usage.executed],
        "calls": {call_id: [r["status"], r.get("evidence_ids", [])]
                  for call_id, r in sorted(returns.items())},
    }))


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:])
