"""A pydantic-ai agent with bounded memory recall, offline (asyncio only).

    python examples/pydantic_ai_agent.py

The model is pydantic-ai's FunctionModel: on the user's "Continue" it asks for six memory
searches in parallel, then answers. The allowance (4 searches in 2 rounds) lets the automatic
round take slots 1-2 and two of the six searches run on slots 3 and 4; the other four get the
typed refusal, which the model reads. The script prints what the model was sent each time.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import textwrap
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime_hooks.adapters.pydantic_ai import RecallCapability, RunIdentity
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed_store

QUERIES = ("invoice backfill dry-run", "currency rounding rule", "cutover date",
           "deploy window", "rollback runbook", "billing migration kickoff")


def show(step: int, messages: list[ModelMessage], info: AgentInfo) -> None:
    print(f"--- model request {step} ---")
    print("instructions:")
    print(textwrap.indent(info.instructions or "(none)", "  | "))
    last = messages[-1]
    if isinstance(last, ModelRequest):
        for part in last.parts:
            if isinstance(part, ToolReturnPart):
                print(f"  {part.tool_call_id}: {json.dumps(part.content)[:150]}")


async def main() -> None:
    requests: list[int] = []

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests.append(len(requests) + 1)
        show(len(requests), messages, info)
        if len(requests) == 1:
            return ModelResponse(parts=[
                ToolCallPart("search_memory", {"query": q}, tool_call_id=f"call-{i}")
                for i, q in enumerate(QUERIES)
            ])
        return ModelResponse(parts=[TextPart("Running the backfill dry-run next.")])

    with tempfile.TemporaryDirectory() as folder:
        config = RecallConfig(ledger_path=Path(folder) / "ledger.db",
                              store_path=Path(folder) / "memory.db")
        await seed_store(config)
        async with open_hooks(config) as hooks:
            # The lines a user adds: the capability, and the host's identity of the run.
            recall = RecallCapability(hooks, working_state=lambda ctx: STATE)
            agent = Agent(FunctionModel(model), deps_type=RunIdentity, capabilities=[recall])
            run = RunIdentity(run_id="ticket-42", scope=SCOPE, principal=PRINCIPAL)
            result = await agent.run("Continue", deps=run)

            print("--- answer ---")
            print(" ", result.output)
            usage = await hooks.allowance.ledger.usage(run.run_id)
            print(f"--- ledger: rounds={usage.rounds} reserved={usage.reserved} "
                  f"executed={usage.executed} refused={usage.refused}")
            for trace in await hooks.allowance.ledger.attempts(run.run_id):
                print(f"  slot {trace.slot}: {trace.kind} ({trace.outcome.value})")


if __name__ == "__main__":
    asyncio.run(main())
