"""A pydantic-ai agent with bounded memory recall, offline (asyncio only).

    python examples/pydantic_ai_agent.py

The model is ``runtime_hooks.testing.pydantic_ai.ScriptedModel`` (a FunctionModel): on the
user's "Continue" it asks for six memory searches in parallel, then answers. The allowance (4
searches in 2 rounds) lets the automatic round take slots 1-2 and two of the six searches run
on slots 3 and 4; the other four get the typed refusal, which the model reads. The script
prints what the model was sent each time.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import textwrap
import uuid
from pathlib import Path

from pydantic_ai import Agent

from runtime_hooks.adapters.pydantic_ai import RecallCapability, RunIdentity
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed_store
from runtime_hooks.testing import ModelRequest, searches
from runtime_hooks.testing.pydantic_ai import ScriptedModel

QUERIES = ("invoice backfill dry-run", "currency rounding rule", "cutover date",
           "deploy window", "rollback runbook", "billing migration kickoff")


def show(step: int, request: ModelRequest) -> None:
    print(f"--- model request {step} ---")
    print("instructions:")
    print(textwrap.indent(request.instructions or "(none)", "  | "))
    for call_id, answer in request.answers().items():
        print(f"  {call_id}: {json.dumps(answer)[:150]}")


async def main() -> None:
    # The model: six parallel searches on the user's "Continue", then an answer.
    model = ScriptedModel(searches(*QUERIES), "Running the backfill dry-run next.")
    with tempfile.TemporaryDirectory() as folder:
        config = RecallConfig(ledger_path=Path(folder) / "ledger.db",
                              store_path=Path(folder) / "memory.db")
        await seed_store(config)
        async with open_hooks(config) as hooks:
            # The lines a user adds: the capability, and the host's identity of the run.
            recall = RecallCapability(hooks, working_state=lambda ctx: STATE)
            agent = Agent(model, deps_type=RunIdentity, capabilities=[recall])
            run = RunIdentity(run_id=f"ticket-{uuid.uuid4()}", scope=SCOPE, principal=PRINCIPAL)
            result = await agent.run("Continue", deps=run)

            for step, request in enumerate(model.requests, 1):
                show(step, request)
            print("--- answer ---")
            print(" ", result.output)
            usage = await hooks.allowance.ledger.usage(run.run_id)
            print(f"--- ledger: rounds={usage.rounds} reserved={usage.reserved} "
                  f"executed={usage.executed} refused={usage.refused}")
            for trace in await hooks.allowance.ledger.attempts(run.run_id):
                print(f"  slot {trace.slot}: {trace.kind} ({trace.outcome.value})")


if __name__ == "__main__":
    asyncio.run(main())
