"""What the OpenAI Agents SDK adapter costs a run (asyncio; the SDK does not run under trio).

One fake-model run: the user says "Continue", the SDK's ScriptedModel emits six parallel
``search_memory`` calls, then answers. Three sides, measured in the same process, alternating,
each a median over ``ROUNDS`` runs, with the SQLite ledger and the store on a temporary file:

* ``bare``: the SDK run with a plain tool that returns a constant (no recall at all);
* ``guarded``: the bare run with a tool input guardrail that allows 2 calls and rejects 4
  (the SDK's own cost for the guardrail path the adapter uses);
* ``adapter``: the same run through :func:`agents_recall` (``automatic="per_request"``: an
  automatic round before each model request, the same hooks calls as ``hooks``; one batch
  for the six calls, guardrail and stored results);
* ``adapter, once``: the same with the default, one automatic round per ``Runner.run`` (one
  ``prepare`` fewer; printed for reference);
* ``hooks``: the same recall work called directly on :class:`RecallHooks`, without the SDK
  (two ``prepare`` calls and one ``dispatch`` of six calls): what recall itself costs.

``adapter / bare`` is the run's overhead; ``adapter - bare - hooks`` is the adapter's own glue
(the part the target of under 5 % of the run's wall time is about when recall is on).

    python -m bench.bench_adapter_openai_agents
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from itertools import count
from pathlib import Path
from typing import Any

import attrs
from agents import (
    Agent,
    FunctionTool,
    RunConfig,
    Runner,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailData,
)
from agents.run_config import CallModelData
from agents.testing import ScriptedModel, assistant_message, function_call

from plugin import QueryStrategy, WorkingState
from runtime_hooks.adapters import SEARCH_TOOL
from runtime_hooks.adapters.openai_agents import agents_recall, latest_user_request
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed_store
from runtime_hooks.hooks import ToolCall

ROUNDS = 40
QUERIES = ("invoice backfill", "rounding rule", "cutover date", "deploy window",
           "rollback runbook", "kickoff notes")


def _script() -> ScriptedModel:
    return ScriptedModel([
        [function_call(SEARCH_TOOL.name, {"query": q}, call_id=f"call_{i}")
         for i, q in enumerate(QUERIES)],
        [assistant_message("Done.")],
    ])


async def _plain(context: Any, arguments: str) -> str:
    return '{"status": "ok", "content": "No matching memory was found."}'


PLAIN_TOOL = FunctionTool(name=SEARCH_TOOL.name, description=SEARCH_TOOL.description,
                          params_json_schema=SEARCH_TOOL.json_schema(), on_invoke_tool=_plain,
                          strict_json_schema=False)


async def _gate(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
    if data.context.tool_call_id in ("call_0", "call_1"):
        return ToolGuardrailFunctionOutput.allow()
    return ToolGuardrailFunctionOutput.reject_content('{"status": "refused"}')


GUARDED_TOOL = dataclasses.replace(
    PLAIN_TOOL, tool_input_guardrails=[ToolInputGuardrail(guardrail_function=_gate)]
)
"""The bare tool with the SDK's guardrail machinery: 2 calls allowed, 4 rejected."""


async def _admit(experiment: str) -> bool:
    return experiment == "task_context"


def _state(data: CallModelData[Any]) -> WorkingState:
    return attrs.evolve(STATE, current_request=latest_user_request(data).current_request)


async def _medians(
    sides: dict[str, Callable[[], Awaitable[Any]]],
) -> dict[str, tuple[float, float]]:
    """Median wall and CPU milliseconds of each side, one call at a time, alternating.

    CPU time (the process's, the SQLite worker thread included) is reported beside wall time
    because wall time on a shared, loaded machine mostly measures waiting for a core.
    """
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in sides}
    for _ in range(3):  # warm-up
        for call in sides.values():
            await call()
    for _ in range(ROUNDS):
        for name, call in sides.items():
            wall, cpu = time.perf_counter_ns(), time.process_time_ns()
            await call()
            times[name][0].append((time.perf_counter_ns() - wall) / 1e6)
            times[name][1].append((time.process_time_ns() - cpu) / 1e6)
    return {name: (statistics.median(w), statistics.median(c))
            for name, (w, c) in times.items()}


async def main() -> None:
    os.environ.pop("OPENAI_API_KEY", None)
    run_ids = count()
    config = RunConfig(tracing_disabled=True)
    with tempfile.TemporaryDirectory() as folder:
        recall_config = RecallConfig(
            ledger_path=Path(folder) / "ledger.db", store_path=Path(folder) / "memory.db",
            query_planning=QueryStrategy.TASK_CONTEXT, admission=_admit,
        )
        await seed_store(recall_config)
        async with open_hooks(recall_config) as hooks:
            recall = agents_recall(hooks, working_state=_state, automatic="per_request")
            once = agents_recall(hooks, working_state=_state)
            calls = [ToolCall(call_id=f"call_{i}", arguments={"query": q})
                     for i, q in enumerate(QUERIES)]
            state = attrs.evolve(STATE, current_request="Continue")

            async def bare() -> None:
                agent = Agent(name="a", instructions="Help.", model=_script(),
                              tools=[PLAIN_TOOL])
                await Runner.run(agent, "Continue", run_config=config)

            async def guarded() -> None:
                agent = Agent(name="a", instructions="Help.", model=_script(),
                              tools=[GUARDED_TOOL])
                await Runner.run(agent, "Continue", run_config=config)

            async def adapter() -> None:
                agent = Agent(name="a", instructions="Help.", model=_script(),
                              tools=[recall.tool])
                await recall.run(agent, "Continue", run_id=f"bench-{next(run_ids)}",
                                 scope=SCOPE, principal=PRINCIPAL, run_config=config)

            async def adapter_once() -> None:
                agent = Agent(name="a", instructions="Help.", model=_script(),
                              tools=[once.tool])
                await once.run(agent, "Continue", run_id=f"once-{next(run_ids)}",
                               scope=SCOPE, principal=PRINCIPAL, run_config=config)

            async def direct() -> None:
                run_id = f"direct-{next(run_ids)}"
                ids = {"run_id": run_id, "scope": SCOPE, "principal": PRINCIPAL}
                with hooks.bind_run():
                    await hooks.prepare(state, **ids)
                    await hooks.dispatch(calls, **ids)
                    await hooks.prepare(state, **ids)

            medians = await _medians(
                {"bare": bare, "guarded": guarded, "adapter": adapter, "once": adapter_once,
                 "hooks": direct}
            )
    print(f"fake-model run, 6 parallel search calls, medians of {ROUNDS} (ms):")
    print(f"  {'':32} {'wall':>8} {'cpu':>8}")
    labels = {"bare": "bare SDK run (no recall)", "guarded": "bare run, tool guardrail",
              "adapter": "with the adapter", "once": "adapter, once per run (default)",
              "hooks": "the same recall, hooks direct"}
    for name, label in labels.items():
        wall, cpu = medians[name]
        print(f"  {label:32} {wall:8.2f} {cpu:8.2f}")
    for column, index in (("wall", 0), ("cpu", 1)):
        adapter, bare, hooks_ = (medians[n][index] for n in ("adapter", "bare", "hooks"))
        glue = adapter - bare - hooks_
        print(f"  {column}: adapter/bare {adapter / bare:.2f}x; adapter glue (adapter - bare - "
              f"hooks) {glue:.2f} ms = {100 * glue / adapter:.1f} % of the adapter run")


if __name__ == "__main__":
    import asyncio

    asyncio.run(main())
