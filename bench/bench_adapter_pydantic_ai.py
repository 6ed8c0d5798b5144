"""What the pydantic-ai adapter costs a run: the same FunctionModel run with and without it.

One run: "Continue" -> six parallel ``search_memory`` calls -> text (two model requests), on
asyncio, the SQLite ledger and store in a temporary directory. Measured in the same process,
one run at a time, alternating, medians. Every side that recalls makes the same recall calls
(``prepare`` for request 1, one ``dispatch`` of the six calls, ``prepare`` for request 2, each
context rendered, each result turned into its tool-result dict), and the model sees the same
instructions and tool results on every side (checked before timing):

* ``with``: the agent with :class:`RecallCapability` (``automatic="per_request"``, so that it
  makes the same two ``prepare`` calls as the baselines; the default, once per invocation,
  makes one and is cheaper), which makes those calls from pydantic-ai's hooks;
* ``in the run`` (the baseline): the agent without the capability, making the same calls where
  a hand-written integration would: an instructions function runs ``prepare`` before each
  request, and the first search call dispatches the whole batch (the bench knows it);
* ``recall first``: the same calls made back to back on the hooks, then the agent handed their
  contexts and results. Recall interleaved with the framework's work is slower than recall
  back to back, on any side, so this baseline flatters the bare agent; it is printed to show
  that effect.

The ratio is the adapter's overhead over its own run; besides the ratio of the medians, the
median of the per-round ratios (each ``with`` over the baseline run next to it) is printed,
which holds up better on a loaded machine. Each pair runs on the enforced hooks (the default
policy; durable rounds on SQLite) and on the legacy hooks (no reservation). To show where the
time goes, each side prints the time spent in its recall calls (for ``with``: inside the
capability's hooks) and the rest of the run, and two runs without recall are printed:
``bare`` (a constant tool on the agent) and ``machinery`` (the same constant tool contributed
by a capability that overrides the adapter's four hooks with no-ops): pydantic-ai's own cost
of a capability of the adapter's shape.

    python -m bench.bench_adapter_pydantic_ai
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import anyio
from attrs import evolve
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import AgentNode, ValidatedToolArgs, WrapRunHandler
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import Tool, ToolDefinition
from pydantic_ai.toolsets import FunctionToolset

from runtime_hooks.adapters.pydantic_ai import RecallCapability, RunIdentity
from runtime_hooks.adapters.tool import SEARCH_TOOL
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed_store
from runtime_hooks.hooks import RecallHooks, ToolCall

ROUNDS = 60
QUERIES = ("invoice backfill dry-run", "currency rounding rule", "cutover date",
           "deploy window", "rollback runbook", "billing migration kickoff")
CONSTANT = "No matching memory was found."


@dataclass
class _Seen:
    """What the model was given on each request: instructions and tool returns."""

    requests: list[tuple[str | None, list[object]]] = field(default_factory=list)

    async def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append((info.instructions, [
            (part.tool_call_id, part.content)
            for part in messages[-1].parts if isinstance(part, ToolReturnPart)
        ] if isinstance(messages[-1], ModelRequest) else []))
        return await _model(messages, info)


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


@dataclass
class _Machinery(AbstractCapability[Any]):
    """The adapter's shape without its recall: a contributed tool and four no-op hooks."""

    def get_toolset(self) -> FunctionToolset[Any]:
        async def search_memory(ctx: RunContext[Any], **arguments: Any) -> dict[str, object]:
            return {"status": "ok", "content": CONSTANT}

        return FunctionToolset[Any]([Tool[Any].from_schema(
            search_memory, name=SEARCH_TOOL.name, description=SEARCH_TOOL.description,
            json_schema=SEARCH_TOOL.json_schema(), takes_ctx=True,
        )])

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        return await handler()

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        return request_context

    async def before_node_run(self, ctx: RunContext[Any], *, node: AgentNode[Any]) -> Any:
        return node

    async def before_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition,
        args: ValidatedToolArgs,
    ) -> ValidatedToolArgs:
        return args


def _bare(capabilities: list[AbstractCapability[Any]] | None = None,
          ) -> Callable[[], Awaitable[Any]]:
    """A run without recall: a constant ``search_memory`` tool (on the agent, or from
    ``capabilities``)."""
    agent = Agent(FunctionModel(_model), capabilities=capabilities)
    if not capabilities:
        @agent.tool_plain
        async def search_memory(query: str) -> str:
            return CONSTANT

    return lambda: agent.run("Continue")


@dataclass
class _Recalled:
    """What the direct recall of one run gives the model: two contexts, six results."""

    instructions: list[str]
    results: dict[str, dict[str, object]]


class _Baseline:
    """``recall first``: the recall calls of one run made back to back on the hooks, then the
    agent without the capability handing the model the same contexts and results."""

    def __init__(self, hooks: RecallHooks, runs: count[int], seen: _Seen | None = None):
        self.hooks, self.runs, self.spent = hooks, runs, 0.0
        self.calls = [ToolCall(call_id=f"c{i}", arguments={"query": q})
                      for i, q in enumerate(QUERIES)]
        self.agent = Agent(FunctionModel(seen.model if seen else _model), deps_type=_Recalled)

        @self.agent.instructions
        def recalled(ctx: RunContext[_Recalled]) -> str:
            return ctx.deps.instructions[ctx.run_step - 1]

        @self.agent.tool
        async def search_memory(ctx: RunContext[_Recalled], query: str) -> dict[str, object]:
            return ctx.deps.results[ctx.tool_call_id or ""]

    async def recall(self) -> _Recalled:
        run_id, hooks = f"direct-{next(self.runs)}", self.hooks
        first = await hooks.prepare(STATE, run_id=run_id, scope=SCOPE, principal=PRINCIPAL)
        found = await hooks.dispatch(self.calls, run_id=run_id, scope=SCOPE,
                                     principal=PRINCIPAL)
        second = await hooks.prepare(STATE, run_id=run_id, scope=SCOPE, principal=PRINCIPAL)
        return _Recalled([first.render(), second.render()],
                         {result.call_id: result.as_dict() for result in found})

    async def __call__(self) -> None:
        start = time.perf_counter()
        recalled = await self.recall()
        self.spent = time.perf_counter() - start
        await self.agent.run("Continue", deps=recalled)


@dataclass
class _Run:
    """One run of :class:`_InRun`: its id, the batch's results, what the recall took."""

    run_id: str
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    results: dict[str, dict[str, object]] | None = None
    prepares: int = 0
    spent: float = 0.0


class _InRun:
    """``in the run``: the same recall calls, made where a hand-written integration without
    the capability makes them: an instructions function runs ``prepare`` before each model
    request, and the first search call dispatches the whole batch (the bench knows it)."""

    def __init__(self, hooks: RecallHooks, runs: count[int], seen: _Seen | None = None):
        self.runs, self.last = runs, _Run("")
        calls = [ToolCall(call_id=f"c{i}", arguments={"query": q}) for i, q in enumerate(QUERIES)]
        self.agent = Agent(FunctionModel(seen.model if seen else _model), deps_type=_Run)

        @self.agent.instructions
        async def recalled(ctx: RunContext[_Run]) -> str:
            start, run = time.perf_counter(), ctx.deps
            context = await hooks.prepare(STATE, run_id=run.run_id, scope=SCOPE,
                                          principal=PRINCIPAL)
            run.prepares += 1
            text = context.render()
            run.spent += time.perf_counter() - start
            return text

        @self.agent.tool
        async def search_memory(ctx: RunContext[_Run], query: str) -> dict[str, object]:
            run = ctx.deps
            async with run.lock:
                if run.results is None:
                    start = time.perf_counter()
                    found = await hooks.dispatch(calls, run_id=run.run_id, scope=SCOPE,
                                                 principal=PRINCIPAL)
                    run.results = {result.call_id: result.as_dict() for result in found}
                    run.spent += time.perf_counter() - start
            return run.results[ctx.tool_call_id or ""]

    @property
    def spent(self) -> float:
        return self.last.spent

    async def __call__(self) -> None:
        self.last = _Run(f"in-run-{next(self.runs)}")
        await self.agent.run("Continue", deps=self.last)


def _adapter(hooks: RecallHooks, runs: count[int], seen: _Seen | None = None,
             ) -> tuple[_Timed, Callable[[], Awaitable[Any]]]:
    capability = _Timed(hooks, working_state=lambda ctx: STATE, automatic="per_request")
    agent = Agent(FunctionModel(seen.model if seen else _model), deps_type=RunIdentity,
                  capabilities=[capability])

    def run() -> Awaitable[Any]:
        identity = RunIdentity(run_id=f"bench-{next(runs)}", scope=SCOPE, principal=PRINCIPAL)
        return agent.run("Continue", deps=identity)

    return capability, run


async def _check_same_work(hooks: RecallHooks) -> None:
    """Every side hands the model the same instructions and tool results, request by request,
    and leaves the same rounds, reservations and attempts in the ledger."""
    first, inside, with_ = _Seen(), _Seen(), _Seen()
    ids = count(10**9)  # one id per run, in this order: direct-, in-run-, bench-
    await _Baseline(hooks, ids, first)()
    in_run = _InRun(hooks, ids, inside)
    await in_run()
    await _adapter(hooks, ids, with_)[1]()
    if not first.requests == inside.requests == with_.requests:
        raise AssertionError(f"the sides differ:\n{first.requests}\n{inside.requests}\n"
                             f"{with_.requests}")
    if in_run.last.prepares != 2:
        raise AssertionError(f"{in_run.last.prepares} automatic rounds in one run, not 2")
    usage = [await hooks.allowance.ledger.usage(f"{prefix}-{10**9 + n}")
             for n, prefix in enumerate(("direct", "in-run", "bench"))]
    if len({(u.rounds, u.reserved, u.executed, u.refused) for u in usage}) != 1:
        raise AssertionError(f"the sides' ledgers differ: {usage}")


async def main() -> None:
    runs = count()
    with tempfile.TemporaryDirectory() as folder:
        base = RecallConfig(ledger_path=Path(folder) / "l.db", store_path=Path(folder) / "m.db")
        await seed_store(base)
        async with open_hooks(base) as enforced, open_hooks(
            evolve(base, legacy=True)
        ) as legacy:
            sides: dict[str, Callable[[], Awaitable[Any]]] = {
                "bare run": _bare(),
                "machinery": _bare([_Machinery()]),
            }
            spent: dict[str, _Timed | _Baseline | _InRun] = {}
            for kind, hooks in (("enforced", enforced), ("legacy", legacy)):
                await _check_same_work(hooks)
                first, in_run = _Baseline(hooks, runs), _InRun(hooks, runs)
                timed, with_ = _adapter(hooks, runs)
                if kind == "enforced":
                    sides["recall alone (enforced)"] = first.recall
                sides |= {f"recall first ({kind})": first, f"in the run ({kind})": in_run,
                          f"with ({kind})": with_}
                spent |= {f"recall first ({kind})": first, f"in the run ({kind})": in_run,
                          f"with ({kind})": timed}
            for _ in range(5):  # warm-up
                for call in sides.values():
                    await call()
            times: dict[str, list[float]] = {name: [] for name in sides}
            inside: dict[str, list[float]] = {name: [] for name in spent}
            order = list(sides.items())
            for _ in range(ROUNDS):
                order.reverse()  # neither side of a pair always runs first
                for name, call in order:
                    if isinstance(timer := spent.get(name), _Timed):
                        timer.spent = 0.0
                    start = time.perf_counter()
                    await call()
                    times[name].append((time.perf_counter() - start) * 1000)
                    if timer is not None:
                        inside[name].append(timer.spent * 1000)
    median = {name: statistics.median(values) for name, values in times.items()}
    recall = {name: statistics.median(values) for name, values in inside.items()}
    print(f"pydantic-ai run (6 parallel searches), asyncio, medians of {ROUNDS} alternating runs")
    for name in ("bare run", "machinery", "recall alone (enforced)"):
        print(f"  {name:26} {median[name]:>7.2f}ms")
    print(f"  machinery over bare: {median['machinery'] - median['bare run']:+.2f}ms")
    for kind in ("enforced", "legacy"):
        with_ = f"with ({kind})"
        print(f"  {kind} hooks: with {median[with_]:.2f}ms (recall "
              f"{recall[with_]:.2f}ms, the rest {median[with_] - recall[with_]:.2f}ms)")
        for baseline in (f"in the run ({kind})", f"recall first ({kind})"):
            paired = statistics.median(
                w / wo for w, wo in zip(times[with_], times[baseline], strict=True)
            )
            print(f"    vs {baseline.split(' (')[0]:12} {median[baseline]:6.2f}ms (recall "
                  f"{recall[baseline]:.2f}ms, the rest {median[baseline] - recall[baseline]:.2f}"
                  f"ms): ratio of medians {median[with_] / median[baseline]:.3f}x, median of "
                  f"paired ratios {paired:.3f}x")


if __name__ == "__main__":
    anyio.run(main)
