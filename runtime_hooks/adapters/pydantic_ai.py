"""The pydantic-ai adapter: bounded memory recall as one capability (asyncio only).

``Agent(model, deps_type=..., capabilities=[RecallCapability(hooks)])`` gives the agent the
``search_memory`` tool (rendered from :data:`~runtime_hooks.adapters.SEARCH_TOOL`) and five
hooks, each a thin translation to :class:`~runtime_hooks.adapters.RunRecall`:

* ``wrap_run`` binds the run-scoped permit holder (the other hooks and the tools run in copied
  contexts, so a permit bound inside one of them would not reach the tools) and opens the
  invocation: one pydantic-ai run (``run``, ``run_sync``, ``run_stream``, ``iter``);
* ``before_model_request`` appends the invocation's automatic context to the request's
  instructions (``InstructionPart(..., dynamic=True)``). The automatic round runs once per
  invocation, before its first model request; every later request of the run gets the same
  context in its instructions and takes no round. ``automatic="per_request"`` runs a round
  before every request instead, ``automatic=False`` never;
* ``before_node_run`` on a ``CallToolsNode`` sees every tool call of the model response before
  any runs, under ``run``, ``iter``, ``run_stream`` and event-stream handlers alike, and
  reserves ONE deliberate round for all its search calls. (``wrap_node_run`` would not do:
  under ``run_stream`` the tools run before it is entered.) Calls already answered
  (``node.tool_call_results``, as on an approval resume) are left out, so a resume never
  reserves them again. Under ``end_strategy="early"`` pydantic-ai runs a response's function
  tools only if none of its output calls (nor another final output) succeeds, which it learns
  only as it runs them; there the batch waits, and is dispatched whole when pydantic-ai runs
  the first of its search calls, so a search it skips ("Tool not executed") reserves nothing;
* ``wrap_tool_execute`` marks the run's tools as running inside its invocation: a run one of
  them starts (agent delegation: ``delegate.run(..., deps=ctx.deps, usage=ctx.usage)``) for
  the same host run is part of the same user turn, and its requests get the context prepared
  for it, with no round of their own; a delegate for another run is its own invocation;
* ``before_tool_execute`` raises ``SkipToolExecution`` with the typed refusal for a call that
  got no slot; a call that did returns its stored result from the tool. A stored result
  answers only the call with the same id and the same arguments.

The key of a run is the HOST's run id (from deps, through ``identity``): pydantic-ai's
``ctx.run_id`` is new on each resume. When the run has a deadline (``run(timeout=)``), recall
ends at the earlier of the two deadlines: the allowance's permit keeps its own, and the adapter
runs each round inside a cancel scope ending at the framework's; neither is ever extended.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import attrs

from plugin.control import BoundedRecallNotice, BudgetRefusal, RefusalReason
from plugin.errors import RunIdentityError, RunIdentityTypeError
from plugin.memory.state import WorkingState
from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import PreparedContext, RecallHooks, ToolCall, ToolResult

from ._pydantic_ai_run import (
    arguments_of,
    framework_deadline_passed,
    may_skip_function_tools,
    search_calls,
    until_framework_deadline,
)
from .batch import AutomaticMode, RunRecall, RunRecalls, automatic_mode, call_key
from .invocation import Invocation, enclosing_invocation
from .tool import SEARCH_TOOL

with missing_extra("pydantic-ai", "runtime_hooks.adapters.pydantic_ai"):
    from pydantic_ai import CallToolsNode, RunContext
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.capabilities.abstract import (
        AgentNode,
        ValidatedToolArgs,
        WrapRunHandler,
        WrapToolExecuteHandler,
    )
    from pydantic_ai.exceptions import SkipToolExecution
    from pydantic_ai.messages import (
        InstructionPart,
        ModelRequest,
        ModelResponse,
        ToolCallPart,
        UserPromptPart,
    )
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.tools import Tool, ToolDefinition
    from pydantic_ai.toolsets import FunctionToolset

__all__ = ["RecallCapability", "RunIdentity", "RunIdentityError", "latest_user_request"]
# RunIdentityError (plugin.errors): a run id used with another scope or principal; its
# subclass RunIdentityTypeError (also a TypeError): the host gave no usable RunIdentity.


@attrs.frozen(kw_only=True)
class RunIdentity:
    """Who a run recalls for, as the host knows it: never taken from the model or its text.

    ``run_id`` is the host's id of the logical run; it stays the same across pydantic-ai
    resumes (whose ``ctx.run_id`` changes), so a resumed run keeps its allowance.
    """

    run_id: str
    scope: str
    principal: str


def identity_from_deps(ctx: RunContext[Any]) -> RunIdentity:
    """The default ``identity``: ``deps`` is a :class:`RunIdentity` or has one as ``.recall``."""
    deps = ctx.deps
    found = deps if isinstance(deps, RunIdentity) else getattr(deps, "recall", None)
    if not isinstance(found, RunIdentity):
        raise RunIdentityTypeError(
            "RecallCapability needs the run's identity: pass deps=RunIdentity(...) (or deps "
            "with a .recall RunIdentity), or give RecallCapability an identity= callable; "
            f"got deps of type {type(deps).__name__}"
        )
    return found


def latest_user_request(ctx: RunContext[Any]) -> WorkingState | None:
    """The default working state: the latest user message as ``current_request``.

    None (no automatic round) when the conversation has no user text yet.
    """
    for message in reversed(ctx.messages):
        if not isinstance(message, ModelRequest):
            continue
        for part in reversed(message.parts):
            if isinstance(part, UserPromptPart):
                content = part.content
                text = content if isinstance(content, str) else "\n".join(
                    item for item in content if isinstance(item, str)
                )
                if text.strip():
                    return WorkingState(text)
    return None


@attrs.define(eq=False)
class _Invocation(Invocation):
    """One pydantic-ai run, with the search calls of its latest response that wait for
    pydantic-ai to run one of them (``end_strategy="early"``), and those of its latest model
    response whatever ran it (``run_stream`` runs the tools of a response whose output is
    final itself, with no CallToolsNode)."""

    waiting: list[ToolCall] = attrs.field(factory=list, init=False)
    latest: list[ToolCall] = attrs.field(factory=list, init=False)


_NO_INVOCATIONS: Mapping[str | None, _Invocation] = MappingProxyType({})  # outside any run


@dataclass
class RecallCapability(AbstractCapability[Any]):
    """Bounded memory recall for a pydantic-ai agent: the search tool and its hooks.

    ``identity`` gives the host's run id, scope and principal from the run context (default:
    :func:`identity_from_deps`); ``working_state`` gives the state the automatic round plans
    from (default: :func:`latest_user_request`; return None for no automatic round on a
    request). ``automatic`` is when the automatic round runs: ``True`` (default) once per
    invocation (one pydantic-ai run), ``"per_request"`` before every model request, ``False``
    never.
    """

    hooks: RecallHooks
    identity: Callable[[RunContext[Any]], RunIdentity] = identity_from_deps
    working_state: Callable[[RunContext[Any]], WorkingState | None] = latest_user_request
    automatic: bool | str = True
    max_runs: int = 4096
    """Runs whose batches are remembered (oldest forgotten first), like the hooks' own bound."""
    _runs: RunRecalls = field(init=False, repr=False)
    _mode: AutomaticMode = field(init=False, repr=False)
    _invocations: contextvars.ContextVar[Mapping[str | None, _Invocation]] = field(
        init=False, repr=False
    )

    def __post_init__(self) -> None:
        self._mode = automatic_mode(self.automatic)
        self._runs = RunRecalls(self.hooks, RunIdentityError, self.max_runs)
        self._invocations = contextvars.ContextVar(
            "recallbound_pydantic_ai_invocations", default=_NO_INVOCATIONS
        )

    # -- the tool ---------------------------------------------------------------------------

    def get_toolset(self) -> FunctionToolset[Any]:
        tool = Tool[Any].from_schema(
            self._search_memory,
            name=SEARCH_TOOL.name,
            description=SEARCH_TOOL.description,
            json_schema=SEARCH_TOOL.json_schema(),
            takes_ctx=True,
        )
        return FunctionToolset[Any]([tool])

    async def _search_memory(self, ctx: RunContext[Any], **arguments: Any) -> dict[str, object]:
        """The tool body: the call's stored result (dispatched with its batch)."""
        result = await self._result(ctx, ctx.tool_call_id or "", arguments)
        return result.as_dict()

    # -- the run ----------------------------------------------------------------------------

    def recall(self, identity: RunIdentity) -> RunRecall:
        """The batches of the host's run ``identity.run_id`` (one object across resumes)."""
        return self._runs.get(identity.run_id, scope=identity.scope,
                              principal=identity.principal)

    def _run_recall(self, ctx: RunContext[Any]) -> RunRecall:
        """The run's recall, pinned for the invocation once resolved (the registry may forget
        the run meanwhile; its batch's results must still reach its tools)."""
        invocation = self._invocation(ctx)
        if invocation is not None and invocation.run is not None:
            return invocation.run
        identity = self.identity(ctx)
        if not isinstance(identity, RunIdentity):
            raise RunIdentityTypeError(
                f"identity must return a RunIdentity, got {type(identity).__name__}"
            )
        run = self.recall(identity)
        if invocation is not None:
            invocation.run = run
        return run

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        # One invocation per run: its automatic context dies with it (never reused by the
        # next run, a resume included). Kept under pydantic-ai's own id of the run: pydantic-ai
        # hands what wrap_run binds to the caller's task, so two runs driven there by hand
        # (two ``iter`` or ``run_stream`` blocks) each find their own.
        invocation = _Invocation()
        token = self._invocations.set({**self._invocations.get(), ctx.run_id: invocation})
        try:
            with self.hooks.bind_run():
                return await handler()
        finally:
            invocation.end()
            self._invocations.reset(token)

    def _invocation(self, ctx: RunContext[Any]) -> _Invocation | None:
        """The invocation ``ctx`` belongs to (None outside ``wrap_run``)."""
        return self._invocations.get().get(ctx.run_id)

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition,
        args: ValidatedToolArgs, handler: WrapToolExecuteHandler,
    ) -> Any:
        # A run the tool starts (agent delegation, ``usage=ctx.usage``) is part of this turn.
        token = enclosing_invocation.set(self._invocation(ctx))
        try:
            return await handler(args)
        finally:
            enclosing_invocation.reset(token)

    # -- preparation: the automatic round ---------------------------------------------------

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if self._mode == "off":
            return request_context
        invocation: Invocation | None = None
        if self._mode == "per_invocation":
            invocation = self._invocation(ctx)
        if invocation is not None and invocation.enclosing is not None:
            invocation = invocation.turn(self._run_recall(ctx))  # a delegate of the same run
        if invocation is not None and invocation.prepared:
            text = await invocation.context(self._no_round)
        else:
            state = self.working_state(ctx)
            if state is None:
                return request_context

            async def prepare() -> str:
                return await self._automatic_text(ctx, state)

            text = await (invocation.context(prepare) if invocation is not None else prepare())
        if not text:
            return request_context
        parameters = request_context.model_request_parameters
        parts = [*(parameters.instruction_parts or ()), InstructionPart(text, dynamic=True)]
        request_context.model_request_parameters = dataclasses.replace(
            parameters, instruction_parts=InstructionPart.sorted(parts)
        )
        return request_context

    @staticmethod
    async def _no_round() -> str:
        raise AssertionError("the invocation's context was prepared already")

    async def _automatic_text(self, ctx: RunContext[Any], state: WorkingState) -> str:
        """The automatic round now, rendered (or the bounded notice if the run's own
        deadline came first)."""
        recall = self._run_recall(ctx)
        context: PreparedContext | None = None
        if not framework_deadline_passed(ctx):
            with until_framework_deadline(ctx):
                context = await recall.prepare(state)
        if context is not None:
            return context.render()
        refusal = await self._deadline_refusal(recall)  # the framework's deadline came first
        return f"Note: {BoundedRecallNotice.from_refusal(refusal).message}"

    # -- tool dispatch: the deliberate round ------------------------------------------------

    async def before_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any]
    ) -> AgentNode[Any]:
        if isinstance(node, CallToolsNode):
            calls = search_calls(node.model_response, node.tool_call_results)
            invocation = self._invocation(ctx)
            if invocation is not None and may_skip_function_tools(ctx):
                invocation.waiting = calls  # dispatched when pydantic-ai runs one of them
            elif calls:
                await self._dispatch(ctx, self._run_recall(ctx), calls)
        return node

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext,
        response: ModelResponse,
    ) -> ModelResponse:
        invocation = self._invocation(ctx)
        if invocation is not None:
            invocation.latest = search_calls(response)
        return response

    async def before_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
    ) -> ValidatedToolArgs:
        if call.tool_name == SEARCH_TOOL.name:
            result = await self._result(ctx, call.tool_call_id, call.args)
            if result.status != "ok":
                raise SkipToolExecution(result.as_dict())
        return args

    async def _result(
        self, ctx: RunContext[Any], call_id: str, arguments: str | dict[str, Any] | None
    ) -> ToolResult:
        """The call's result: the stored one (the usual case: looked up before anything is
        built for the call), else a round of its own."""
        recall = self._run_recall(ctx)
        stored = recall.result(call_id, arguments_of(arguments))
        if stored is not None:
            return stored
        # Its response's batch waits for pydantic-ai to run one of its searches, or it reached
        # the tool on a path without a CallToolsNode (run_stream, its output final): its
        # response's searches now, one round. Else (the framework's deadline cut the batch
        # short) a round of its own.
        invocation = self._invocation(ctx)
        call = ToolCall(call_id=call_id, arguments=arguments_of(arguments))
        key = call_key(call_id, call.arguments)
        batches = [invocation.waiting, invocation.latest] if invocation is not None else []
        for batch in (*batches, [call]):
            keys = [call_key(c.call_id, c.arguments) for c in batch]
            if key in keys:
                return (await self._dispatch(ctx, recall, batch))[keys.index(key)]
        raise AssertionError("unreachable: a call is in a batch of its own")

    async def _dispatch(
        self, ctx: RunContext[Any], recall: RunRecall, calls: Sequence[ToolCall]
    ) -> list[ToolResult]:
        if not framework_deadline_passed(ctx):
            with until_framework_deadline(ctx):
                return await recall.dispatch_batch(calls)
        refusal = await self._deadline_refusal(recall)
        return [
            recall.result(call.call_id, call.arguments)
            or ToolResult(call_id=call.call_id, status="refused", content=refusal.message,
                          refusal=refusal)
            for call in calls
        ]

    async def _deadline_refusal(self, recall: RunRecall) -> BudgetRefusal:
        """Recall bounded by the framework's deadline, with the run's totals from the ledger."""
        usage = await recall.usage()
        return BudgetRefusal(reason=RefusalReason.DEADLINE, run_id=recall.run_id,
                             reserved=usage.reserved, executed=usage.executed)
