"""Bounded recall for the OpenAI Agents SDK (extra ``openai-agents``; asyncio only).

Four thin pieces translate the SDK's hooks into :class:`~runtime_hooks.adapters.RunRecall`
calls, and :func:`agents_recall` builds them all::

    recall = agents_recall(hooks)                        # hooks: from open_hooks(...)
    agent = Agent(name="assistant", instructions="...", tools=[recall.tool])
    result = await recall.run(agent, "Continue", run_id=..., scope=..., principal=...)

* **Automatic round** (:class:`RecallInputFilter`, a ``RunConfig.call_model_input_filter``):
  once per invocation (one ``Runner.run`` or ``Runner.run_streamed``, its handoffs included),
  before its first model request, ``RunRecall.prepare(state)``; the rendered context is
  appended to the instructions of that request and of every later request of the invocation
  (a handoff's specialist included), which take no round of their own. With
  ``automatic="per_request"`` a round runs before every model request instead.
* **Deliberate round** (:class:`RecallRunHooks.on_llm_end`): the one hook that sees every
  function call of a model response before any guardrail or tool runs (under ``Runner.run``
  and ``Runner.run_streamed``). All ``search_memory`` calls of the response go to
  ``RunRecall.dispatch_batch`` together, so parallel calls take distinct slots of ONE round.
  The SDK invokes each tool separately; a dispatch per tool would open a round per call and
  lose calls to the ``rounds`` limit.
* **Tool and guardrail** (:func:`search_tool`): the tool rendered from
  :data:`~runtime_hooks.adapters.SEARCH_TOOL`; its input guardrail answers a refused, invalid
  or failed call with ``reject_content`` carrying the typed result as JSON (the model reads it
  as the call's output), and the tool returns a successful call's stored result, looked up by
  ``ToolContext.tool_call_id`` and the call's arguments (a call is its id AND its
  arguments). Neither ever reserves.
* **Run boundary** (:class:`RecallRunner`): the SDK runs hooks in copied contexts, so the run
  is bound around ``Runner.run`` / ``Runner.run_streamed``: ``RecallHooks.bind_run()`` and
  the run's :class:`RunRecall`, whose run id, scope and principal the host passes in, never
  the model. The ``RunRecall`` of a run id is kept, so a continued or resumed run (a
  ``RunState`` after an approval, ``result.to_input_list()`` fed to a new run) reuses the
  stored answers and never reserves a call twice. Each bound run is one invocation: the
  context its automatic round prepared ends with it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import attrs

from plugin.control import BudgetRefusal, RefusalReason
from plugin.errors import RecallboundError, RunIdentityError
from plugin.memory.state import WorkingState
from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import RecallHooks, ToolCall, ToolResult

from ._options import deprecated_alias
from .batch import AutomaticMode, Invocation, RunRecall, RunRecalls, automatic_mode
from .tool import SEARCH_TOOL

with missing_extra("openai-agents", "runtime_hooks.adapters.openai_agents"):
    from agents import (
        Agent,
        FunctionTool,
        RunConfig,
        RunContextWrapper,
        RunHooks,
        Runner,
        RunResult,
        RunResultStreaming,
        Tool,
        ToolGuardrailFunctionOutput,
        ToolInputGuardrail,
        ToolInputGuardrailData,
    )
    from agents.items import ModelResponse, TResponseInputItem
    from agents.run_config import CallModelData, ModelInputData
    from agents.run_context import AgentHookContext
    from agents.tool_context import ToolContext
    from openai.types.responses import ResponseFunctionToolCall

__all__ = [
    "AgentsRecall",
    "RecallInputFilter",
    "RecallRunHooks",
    "RecallRunner",
    "RunNotBoundError",
    "RunIdentityError",
    "StateSource",
    "agents_recall",
    "latest_user_request",
    "search_calls",
    "search_tool",
]

StateSource = Callable[[CallModelData[Any]], "WorkingState | Awaitable[WorkingState]"]
"""The host's working state for a model request (default: :func:`latest_user_request`)."""


class RunNotBoundError(RecallboundError, RuntimeError):
    """A recall hook ran outside a run bound by :class:`RecallRunner` (no trusted identity)."""


_run: contextvars.ContextVar[RunRecall | None] = contextvars.ContextVar(
    "recallbound_agents_run", default=None
)
_invocation: contextvars.ContextVar[Invocation | None] = contextvars.ContextVar(
    "recallbound_agents_invocation", default=None
)


def _bound_run(where: str) -> RunRecall:
    run = _run.get()
    if run is None:
        raise RunNotBoundError(
            f"{where} ran outside a bound run: start the agent with RecallRunner.run() or "
            ".run_streamed() (AgentsRecall.run), which bind the run's trusted identity"
        )
    return run


# -- the automatic round ------------------------------------------------------------------


def _text(content: object) -> str:
    """The text of a message's content: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = [part.get("text") for part in content if isinstance(part, Mapping)]
        return "\n".join(text for text in texts if isinstance(text, str))
    return ""


def latest_user_request(data: CallModelData[Any]) -> WorkingState:
    """The default working state: the latest user message as ``current_request``."""
    for item in reversed(data.model_data.input):
        if isinstance(item, Mapping) and item.get("role") == "user":
            return WorkingState(_text(item.get("content")))
    return WorkingState("")


@attrs.frozen
class RecallInputFilter:
    """A ``call_model_input_filter``: the automatic round, its context added to the instructions.

    ``then`` is the host's own filter, applied first, so the rendered context is never trimmed
    away by it. The state comes from ``state`` (the host's), never from what the model wrote.
    ``per_request=False`` (default): the round runs once per invocation (the bound run) and
    every later request of it gets the same context; ``True``: a round before every request.
    """

    state: StateSource = latest_user_request
    then: Callable[[CallModelData[Any]], Any] | None = None
    per_request: bool = False

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        if self.then is not None:
            updated = self.then(data)
            if inspect.isawaitable(updated):
                updated = await updated
            data = dataclasses.replace(data, model_data=updated)
        run = _bound_run("the recall input filter")

        async def prepare() -> str:
            state = self.state(data)
            if inspect.isawaitable(state):
                state = await state
            return (await run.prepare(state)).render()

        invocation = None if self.per_request else _invocation.get()
        rendered = await (prepare() if invocation is None else invocation.context(prepare))
        model_data = data.model_data
        if not rendered:
            return model_data
        base = model_data.instructions
        instructions = f"{base}\n\n{rendered}" if base else rendered
        return ModelInputData(input=model_data.input, instructions=instructions)


# -- the deliberate round -----------------------------------------------------------------


def search_calls(response: ModelResponse, name: str = SEARCH_TOOL.name) -> list[ToolCall]:
    """The search calls of one model response, in order."""
    return [
        ToolCall(call_id=item.call_id, arguments=item.arguments)
        for item in response.output
        if isinstance(item, ResponseFunctionToolCall) and item.name == name
    ]


@attrs.define(eq=False)
class RecallRunHooks(RunHooks[Any]):
    """Run hooks whose ``on_llm_end`` dispatches a response's search calls as one batch.

    Every other hook, and ``on_llm_end`` itself afterwards, is passed on to ``inner`` (the
    host's own run hooks), since the SDK takes a single ``hooks`` object per run.
    """

    inner: RunHooks[Any] | None = None

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        calls = search_calls(response)
        if calls:
            await _bound_run("RecallRunHooks.on_llm_end").dispatch_batch(calls)
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_agent_start(self, context: AgentHookContext[Any], agent: Any) -> None:
        if self.inner is not None:
            await self.inner.on_agent_start(context, agent)

    async def on_agent_end(
        self, context: AgentHookContext[Any], agent: Any, output: Any
    ) -> None:
        if self.inner is not None:
            await self.inner.on_agent_end(context, agent, output)

    async def on_handoff(
        self, context: RunContextWrapper[Any], from_agent: Any, to_agent: Any
    ) -> None:
        if self.inner is not None:
            await self.inner.on_handoff(context, from_agent, to_agent)

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Any, tool: Tool
    ) -> None:
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Any, tool: Tool, result: Any
    ) -> None:
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)


# -- the tool and its guardrail -----------------------------------------------------------


async def _stored(run: RunRecall, call_id: str, arguments: str) -> ToolResult:
    """The stored result of a call; a call this run never dispatched is refused, not searched.

    With :class:`RecallRunHooks` installed, a call reaches its tool without a stored result
    only in a run resumed in a new process (a ``RunState`` restored from JSON): the ledger
    recorded its outcome where the batch ran, and it is replayed from there. A call the ledger
    never recorded is refused (``closed``): dispatching it here would reserve it a second
    time. (Without the hooks, e.g. ``RecallRunner.run`` instead of ``AgentsRecall.run``, every
    call lands here: nothing is searched, and the model is told so.)
    """
    result = run.result(call_id, arguments)
    if result is None:
        result = await run.recorded(call_id, arguments)
    if result is not None:
        return result
    usage = await run.hooks.allowance.ledger.usage(run.run_id)
    refusal = BudgetRefusal(reason=RefusalReason.CLOSED, run_id=run.run_id,
                            reserved=usage.reserved, executed=usage.executed)
    return ToolResult(call_id=call_id, status="refused", content=refusal.message,
                      refusal=refusal)


def _json(result: ToolResult) -> str:
    return json.dumps(result.as_dict(), ensure_ascii=False)


async def _guard(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
    result = await _stored(_bound_run("the search_memory guardrail"),
                           data.context.tool_call_id, data.context.tool_arguments)
    if result.status == "ok":
        return ToolGuardrailFunctionOutput.allow()
    # The model reads this message as the call's output: the typed refusal, visibly.
    return ToolGuardrailFunctionOutput.reject_content(_json(result), output_info=result.status)


async def _invoke(context: ToolContext[Any], arguments: str) -> str:
    # The search ran in the batch (on_llm_end); the arguments were validated there.
    return _json(await _stored(_bound_run("the search_memory tool"), context.tool_call_id,
                               arguments))


def search_tool() -> FunctionTool:
    """The ``search_memory`` function tool, rendered from :data:`SEARCH_TOOL`, with its guardrail.

    Not strict: the schema has an optional ``scope`` and length bounds, which the SDK's strict
    mode would rewrite; the hooks validate every call anyway.
    """
    return FunctionTool(
        name=SEARCH_TOOL.name,
        description=SEARCH_TOOL.description,
        params_json_schema=SEARCH_TOOL.json_schema(),
        on_invoke_tool=_invoke,
        strict_json_schema=False,
        tool_input_guardrails=[
            ToolInputGuardrail(guardrail_function=_guard, name="recallbound_search")
        ],
    )


# -- the run boundary ---------------------------------------------------------------------


@attrs.define(eq=False)
class RecallRunner:
    """Runs an agent with the run bound: the permit holder and the run's :class:`RunRecall`.

    One ``RunRecall`` per run id is kept (the last ``max_runs``), so continuing or resuming a
    run reuses the answers its batches stored.
    """

    hooks: RecallHooks
    max_runs: int = 1024
    _runs: RunRecalls = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._runs = RunRecalls(self.hooks, RunIdentityError, self.max_runs)

    def recall_for(self, run_id: str, *, scope: str, principal: str) -> RunRecall:
        """The run's ``RunRecall``; raises :class:`RunIdentityError` if the identity changed."""
        return self._runs.get(run_id, scope=scope, principal=principal)

    @contextmanager
    def bind(self, run_id: str, *, scope: str, principal: str) -> Iterator[RunRecall]:
        """Bind the run for everything started inside (the SDK copies this context)."""
        run = self.recall_for(run_id, scope=scope, principal=principal)
        with self.hooks.bind_run():
            token = _run.set(run)
            invocation = _invocation.set(Invocation())  # this run's alone
            try:
                yield run
            finally:
                _invocation.reset(invocation)
                _run.reset(token)

    async def run(
        self, agent: Agent[Any], input: Any, *, run_id: str, scope: str, principal: str,
        **kwargs: Any,
    ) -> RunResult:
        """``Runner.run`` with the run bound; ``kwargs`` go to the SDK unchanged."""
        with self.bind(run_id, scope=scope, principal=principal):
            return await Runner.run(agent, input, **kwargs)

    def run_streamed(
        self, agent: Agent[Any], input: Any, *, run_id: str, scope: str, principal: str,
        **kwargs: Any,
    ) -> RunResultStreaming:
        """``Runner.run_streamed`` with the run bound.

        The SDK starts the run as a task, which copies the bound context as it is created; the
        binding therefore outlives this call for as long as the stream runs.
        """
        with self.bind(run_id, scope=scope, principal=principal):
            return Runner.run_streamed(agent, input, **kwargs)


# -- all of it, in a few lines ------------------------------------------------------------


@attrs.frozen
class AgentsRecall:
    """The adapter's pieces for one set of hooks; see :func:`agents_recall`."""

    runner: RecallRunner
    tool: FunctionTool
    input_filter: RecallInputFilter | None
    """None when automatic recall is off."""

    def run_hooks(self, inner: RunHooks[Any] | None = None) -> RecallRunHooks:
        """Run hooks for one run, passing every event on to the host's ``inner`` hooks."""
        if isinstance(inner, RecallRunHooks):
            return inner  # already installed: one batch per response is enough
        return RecallRunHooks(inner)

    def run_config(self, base: RunConfig | None = None) -> RunConfig:
        """``base`` (or a default config) with the recall input filter installed.

        The host's own ``call_model_input_filter`` runs first, then the automatic round.
        """
        base = base if base is not None else RunConfig()
        if self.input_filter is None or isinstance(
            base.call_model_input_filter, RecallInputFilter
        ):
            return base  # off, or already installed: never two automatic rounds a request
        return dataclasses.replace(
            base,
            call_model_input_filter=attrs.evolve(
                self.input_filter, then=base.call_model_input_filter
            ),
        )

    def _kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs["hooks"] = self.run_hooks(kwargs.get("hooks"))
        kwargs["run_config"] = self.run_config(kwargs.get("run_config"))
        return kwargs

    async def run(
        self, agent: Agent[Any], input: Any, *, run_id: str, scope: str, principal: str,
        **kwargs: Any,
    ) -> RunResult:
        """``Runner.run`` with recall: bound run, batching hooks, automatic round."""
        return await self.runner.run(agent, input, run_id=run_id, scope=scope,
                                     principal=principal, **self._kwargs(kwargs))

    def run_streamed(
        self, agent: Agent[Any], input: Any, *, run_id: str, scope: str, principal: str,
        **kwargs: Any,
    ) -> RunResultStreaming:
        """``Runner.run_streamed`` with recall (see :meth:`run`)."""
        return self.runner.run_streamed(agent, input, run_id=run_id, scope=scope,
                                        principal=principal, **self._kwargs(kwargs))


def agents_recall(
    hooks: RecallHooks, *, automatic: bool | str = True,
    working_state: StateSource = latest_user_request,
    state: StateSource | None = None,
) -> AgentsRecall:
    """Build the tool, the run hooks, the input filter and the runner for ``hooks``.

    ``automatic=True`` (default): one automatic round per invocation (one ``Runner.run``, its
    handoffs included), before its first model request; ``"per_request"``: a round before
    every model request; ``False``: no automatic round (only the model's search calls recall).
    ``working_state`` gives the working state for each model request (default: the latest
    user message; ``state=`` is its deprecated alias); run id, scope and principal are passed
    to :meth:`AgentsRecall.run` by the host.
    """
    if state is not None:
        working_state = deprecated_alias("state", "working_state", state, working_state,
                                         latest_user_request)
    mode: AutomaticMode = automatic_mode(automatic)
    return AgentsRecall(
        runner=RecallRunner(hooks),
        tool=search_tool(),
        input_filter=(None if mode == "off"
                      else RecallInputFilter(working_state, per_request=mode == "per_request")),
    )
