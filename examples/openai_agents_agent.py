"""Bounded recall in an OpenAI Agents SDK agent, offline (asyncio only).

``runtime_hooks.testing``'s ScriptedAgentsModel stands in for the LLM: the user says
"Continue", the model emits six parallel ``search_memory`` calls, then answers. No API key, no
network, tracing off. The script prints what the model saw: the automatic context in its first
request (the automatic round runs once per ``Runner.run``), each call's answer (two searches on
slots 3 and 4, four typed refusals) and the same prepared context again in its second request
(no second automatic round), then the ledger's counts.

    python examples/openai_agents_agent.py
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import textwrap
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from agents import Agent, RunConfig
from agents.run_config import CallModelData

from plugin import QueryStrategy, WorkingState
from runtime_hooks.adapters.openai_agents import agents_recall, latest_user_request
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed_store
from runtime_hooks.testing import searches
from runtime_hooks.testing.openai_agents import ScriptedAgentsModel

QUERIES = ("invoice backfill", "rounding rule", "cutover date", "deploy window",
           "rollback runbook", "kickoff notes")


async def admit(experiment: str) -> bool:
    return experiment == "task_context"


def working_state(data: CallModelData[Any]) -> WorkingState:
    """The host's working state: its task in progress, and what the user just said."""
    return attrs.evolve(STATE, current_request=latest_user_request(data).current_request)


def show(title: str, text: str) -> None:
    print(f"--- {title}")
    print(textwrap.indent(text, "    "))


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        config = RecallConfig(ledger_path=Path(folder) / "ledger.db",
                              store_path=Path(folder) / "memory.db",
                              query_planning=QueryStrategy.TASK_CONTEXT, admission=admit)
        await seed_store(config)
        async with open_hooks(config) as hooks:

            # The few lines a user adds: build the adapter, give the agent its tool, run.
            recall = agents_recall(hooks, working_state=working_state)
            model = ScriptedAgentsModel(
                searches(*QUERIES),
                "Next: the invoice backfill dry-run on Monday's snapshot.",
            )
            run_id = f"example-{uuid.uuid4()}"
            agent = Agent(name="assistant", instructions="You are Ana's assistant.",
                          model=model, tools=[recall.tool])
            result = await recall.run(agent, "Continue", run_id=run_id, scope=SCOPE,
                                      principal=PRINCIPAL,
                                      run_config=RunConfig(tracing_disabled=True))

            first, second = model.calls
            show("request 1: instructions (automatic recall added)",
                 first.system_instructions or "")
            print("--- request 2: the six search calls' answers")
            for item in second.input:
                if isinstance(item, Mapping) and item.get("type") == "function_call_output":
                    answer = json.loads(item["output"])
                    result_of = recall.runner.recall_for(
                        run_id, scope=SCOPE, principal=PRINCIPAL
                    ).result(item["call_id"])
                    slot = f"slot {result_of.slot}" if result_of and result_of.slot else "no slot"
                    reason = answer.get("refusal", {}).get("reason", "")
                    print(f"    {item['call_id']}: {answer['status']:8} {slot:8} {reason}")
            show("request 2: instructions (the same prepared context: no second round)",
                 second.system_instructions or "")
            show("final answer", str(result.final_output))
            usage = await hooks.allowance.ledger.usage(run_id)
            print(f"--- ledger: {usage.rounds} rounds, {usage.reserved} slots reserved, "
                  f"{usage.executed} searches executed, {usage.refused} refused")


if __name__ == "__main__":
    asyncio.run(main())
