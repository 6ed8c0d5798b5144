"""What the pydantic-ai adapter costs a run: the same FunctionModel run with and without it.

One run: "Continue" -> six parallel ``search_memory`` calls -> text (two model requests), on
asyncio, the SQLite ledger and store in a temporary directory. Measured in the same process,
one run at a time, alternating, medians. Each pair does the same recall work:

* ``without``: the bare agent (a ``search_memory`` tool returning a constant), then the same
  recall called on the hooks directly: ``prepare`` (request 1), one ``dispatch`` of the six
  calls, ``prepare`` (request 2);
* ``with``: the agent with :class:`RecallCapability`, which makes exactly those calls from
  pydantic-ai's hooks and hands the results to the model.

The ratio is the adapter's overhead over its own run; besides the ratio of the medians, the
median of the per-round ratios (each ``with`` over the ``without`` run next to it) is printed,
which holds up better on a loaded machine. Pairs: the enforced hooks (the default
policy; durable rounds on SQLite) and the legacy hooks (no reservation: the edge alone, with
less fsync noise). ``bare`` alone and the recall alone are printed to show where time goes.

    python -m bench.bench_adapter_pydantic_ai
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from itertools import count
from pathlib import Path
from typing import Any

import anyio
from attrs import evolve
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities.abstract import AgentNode, ValidatedToolArgs
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition

from runtime_hooks.adapters.pydantic_ai import RecallCapability, RunIdentity
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed
from runtime_hooks.hooks import RecallHooks, ToolCall

ROUNDS = 60
QUERIES = ("invoice backfill dry-run", "currency rounding rule", "cutover date",
           "deploy window", "rollback runbook", "billing migration kickoff")


async def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(parts=[
            ToolCallPart("search_memory", {"query": q}, tool_call_id=f"c{i}")
            for i, q in enumerate(QUERIES)
        ])
    return ModelResponse(parts=[TextPart("done")])


class _Timed(RecallCapability):
    """The capability, with the time spent inside its hooks added up."""

    spent: float = 0.0

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        start = time.perf_counter()
        try:
            return await super().before_model_request(ctx, request_context)
        finally:
            self.spent += time.perf_counter() - start

    async def before_node_run(self, ctx: RunContext[Any], *, node: AgentNode[Any]) -> Any:
        start = time.perf_counter()
        try:
            return await super().before_node_run(ctx, node=node)
        finally:
            self.spent += time.perf_counter() - start

    async def before_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition,
        args: ValidatedToolArgs,
    ) -> ValidatedToolArgs:
        start = time.perf_counter()
        try:
            return await super().before_tool_execute(ctx, call=call, tool_def=tool_def,
                                                     args=args)
        finally:
            self.spent += time.perf_counter() - start


def _bare() -> Callable[[], Awaitable[Any]]:
    agent = Agent(FunctionModel(_model))

    @agent.tool_plain
    async def search_memory(query: str) -> str:
        return "No matching memory was found."

    return lambda: agent.run("Continue")


def _direct(hooks: RecallHooks, runs: count[int]) -> Callable[[], Awaitable[Any]]:
    """The adapter's recall calls for one run, made on the hooks directly."""
    calls = [ToolCall(call_id=f"c{i}", arguments={"query": q}) for i, q in enumerate(QUERIES)]

    async def recall() -> None:
        run_id = f"direct-{next(runs)}"
        await hooks.prepare(STATE, run_id=run_id, scope=SCOPE, principal=PRINCIPAL)
        await hooks.dispatch(calls, run_id=run_id, scope=SCOPE, principal=PRINCIPAL)
        await hooks.prepare(STATE, run_id=run_id, scope=SCOPE, principal=PRINCIPAL)

    return recall


def _then(*steps: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        for step in steps:
            await step()

    return run


def _adapter(hooks: RecallHooks, runs: count[int]) -> tuple[_Timed, Callable[[], Awaitable[Any]]]:
    capability = _Timed(hooks, working_state=lambda ctx: STATE)
    agent = Agent(FunctionModel(_model), deps_type=RunIdentity, capabilities=[capability])

    def run() -> Awaitable[Any]:
        identity = RunIdentity(run_id=f"bench-{next(runs)}", scope=SCOPE, principal=PRINCIPAL)
        return agent.run("Continue", deps=identity)

    return capability, run


async def main() -> None:
    runs = count()
    with tempfile.TemporaryDirectory() as folder:
        base = RecallConfig(ledger_path=Path(folder) / "l.db", store_path=Path(folder) / "m.db")
        async with open_hooks(base) as enforced, open_hooks(
            evolve(base, legacy=True)
        ) as legacy:
            await seed(enforced.retriever.store)  # type: ignore[attr-defined]
            bare = _bare()
            timed_on, with_on = _adapter(enforced, runs)
            timed_off, with_off = _adapter(legacy, runs)
            sides: dict[str, Callable[[], Awaitable[Any]]] = {
                "bare run": bare,
                "recall alone (enforced)": _direct(enforced, runs),
                "without (enforced)": _then(bare, _direct(enforced, runs)),
                "with (enforced)": with_on,
                "without (legacy)": _then(bare, _direct(legacy, runs)),
                "with (legacy)": with_off,
            }
            for _ in range(5):  # warm-up
                for call in sides.values():
                    await call()
            times: dict[str, list[float]] = {name: [] for name in sides}
            inside: dict[str, list[float]] = {"with (enforced)": [], "with (legacy)": []}
            order = list(sides.items())
            for _ in range(ROUNDS):
                order.reverse()  # neither side of a pair always runs first
                for name, call in order:
                    timed_on.spent = timed_off.spent = 0.0
                    start = time.perf_counter()
                    await call()
                    times[name].append((time.perf_counter() - start) * 1000)
                    if name in inside:
                        spent = timed_on.spent if "enforced" in name else timed_off.spent
                        inside[name].append(spent * 1000)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"pydantic-ai run (6 parallel searches), asyncio, medians of {ROUNDS} alternating runs")
    for name in ("bare run", "recall alone (enforced)"):
        print(f"  {name:26} {median[name]:>7.2f}ms")
    for hooks_kind in ("enforced", "legacy"):
        without, with_ = median[f"without ({hooks_kind})"], median[f"with ({hooks_kind})"]
        in_hooks = statistics.median(inside[f"with ({hooks_kind})"])
        paired = statistics.median(
            w / wo for w, wo in zip(times[f"with ({hooks_kind})"],
                                    times[f"without ({hooks_kind})"], strict=True)
        )
        print(f"  {hooks_kind} hooks: without {without:.2f}ms, with {with_:.2f}ms "
              f"(in the capability's hooks {in_hooks:.2f}ms); ratio of medians "
              f"{with_ / without:.3f}x, median of paired ratios {paired:.3f}x")


if __name__ == "__main__":
    anyio.run(main)
