"""The ``create_agent`` middleware: the automatic round and the batch of search calls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any, TypeVar

import anyio.from_thread

from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import RecallHooks

from .._options import deprecated_alias
from ..batch import AutomaticMode, automatic_mode
from .identity import Identify, context_of
from .kept import dispatch_kept_sync
from .loop import hooks_loop
from .messages import (
    StateOf,
    batch_answers,
    latest_request,
    pending_search_calls,
    reviewer_edits,
    system_with_context,
)
from .recall import LangChainRecall

with missing_extra("langchain", "runtime_hooks.adapters.langchain"):
    from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest
    from langchain.agents.middleware.types import ModelResponse, PrivateStateAttr
    from langgraph.runtime import Runtime
    from typing_extensions import NotRequired


_R = TypeVar("_R")

class RecallState(AgentState[Any]):
    """The agent state with the invocation's prepared recall context (private to the
    middleware: in neither the agent's input nor its output schema, though ``astream``'s
    ``values`` and ``updates`` modes show it, as every state field; cleared when the
    invocation ends)."""

    recall_context: NotRequired[Annotated[str | None, PrivateStateAttr]]


class RecallMiddleware(AgentMiddleware[RecallState, Any, Any]):
    """Bounded recall for ``create_agent``; registers the ``search_memory`` tool itself.

    ``create_agent(model, tools=[...], middleware=[RecallMiddleware(hooks), ...],
    context_schema=RecallContext)``, then ``await agent.ainvoke(..., context=RecallContext(...))``.
    List it BEFORE ``ToolCallLimitMiddleware``: ``after_model`` hooks run in reverse list
    order, so the limit answers its blocked calls first and this middleware reserves slots only
    for the calls that remain.

    ``ainvoke``/``astream`` run the hooks directly. A sync ``invoke``/``stream`` runs each
    hook on the hooks' event loop from the invoking thread, which must be a worker thread of
    that loop: ``await anyio.to_thread.run_sync(functools.partial(agent.invoke, ...))`` in
    async code, or a blocking portal (``anyio.from_thread.start_blocking_portal``) in sync
    code. Build the middleware inside that loop (it keeps the loop's token); on the loop's own
    thread a sync invoke raises :class:`NotDispatchedError` instead of deadlocking.

    ``automatic``: ``True`` (default) one automatic round per invocation, before its first
    model request; ``"per_request"`` one before every model request; ``False`` none.
    ``identity`` gives the run's trusted identity from the runtime context (default:
    :func:`context_of`; ``identify=`` is its deprecated alias); ``working_state`` the state
    the automatic round plans from (default: :func:`latest_request`).
    """

    state_schema = RecallState

    def __init__(
        self,
        hooks: RecallHooks,
        *,
        automatic: bool | str = True,
        identity: Identify = context_of,
        working_state: StateOf = latest_request,
        identify: Identify | None = None,
    ) -> None:
        super().__init__()
        self.mode: AutomaticMode = automatic_mode(automatic)
        if identify is not None:
            identity = deprecated_alias("identify", "identity", identify, identity, context_of)
        self.recall = LangChainRecall(hooks, identity=identity, working_state=working_state)
        self.automatic = automatic
        self.tools = [self.recall.tool]
        self.token = self.recall.token  # the loop it was built in (None outside one)

    def _on_loop(self, function: Callable[..., Coroutine[Any, Any, _R]], *args: Any) -> _R:
        """Run one async hook on the hooks' loop from the sync run's worker thread."""
        return anyio.from_thread.run(function, *args, token=hooks_loop(self.token))

    def before_agent(self, state: RecallState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """:meth:`abefore_agent` for a sync ``agent.invoke``, run on the hooks' loop."""
        return self._on_loop(self.abefore_agent, state, runtime)

    def after_agent(self, state: RecallState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """:meth:`aafter_agent` for a sync ``agent.invoke``."""
        if self.mode == "per_invocation":
            self.recall.end_invocation(runtime.context)
        if state.get("recall_context") is None:
            return None
        return {"recall_context": None}

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        """:meth:`awrap_model_call` for a sync ``agent.invoke`` (the model runs in this
        thread; only a ``"per_request"`` round goes to the hooks' loop)."""
        block = ""
        if self.mode == "per_invocation":
            prepared = request.state.get("recall_context")
            block = prepared if isinstance(prepared, str) else ""
        elif self.mode == "per_request":
            block = self._on_loop(self.recall.prepare_now, request.messages,
                                  request.runtime.context)
        if block:
            request = request.override(
                system_message=system_with_context(request.system_message, block))
        return handler(request)

    def after_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        """:meth:`aafter_model` for a sync ``agent.invoke``: one round for the batch, run on
        the hooks' loop (kept in the checkpoint like the async form's)."""
        edits = reviewer_edits(state)
        calls = pending_search_calls(state["messages"], edits)
        if not calls:
            return None
        run = self.recall.run(runtime.context)
        answers = batch_answers(dispatch_kept_sync(run, calls, self.token), edits)
        return {"messages": answers} if answers else None

    async def abefore_agent(
        self, state: RecallState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """The invocation's automatic round, once, before its first model request; an agent
        nested in another graph's invocation (a node, or invoked by a tool) for the same run
        gets the context that invocation prepared and takes no round."""
        if self.mode != "per_invocation":
            return None
        block = await self.recall.agent_context(state["messages"], runtime.context)
        return {"recall_context": block}

    async def aafter_agent(
        self, state: RecallState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """The invocation is over: its prepared context goes with it."""
        if self.mode == "per_invocation":
            self.recall.end_invocation(runtime.context)
        if state.get("recall_context") is None:
            return None
        return {"recall_context": None}

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        """The automatic context added to this request's system message: the invocation's
        (prepared once), or a round of this request's own under ``"per_request"``."""
        block = ""
        if self.mode == "per_invocation":
            prepared = request.state.get("recall_context")
            block = prepared if isinstance(prepared, str) else ""
        elif self.mode == "per_request":
            block = await self.recall.prepare_now(request.messages, request.runtime.context)
        if block:
            system = system_with_context(request.system_message, block)
            request = request.override(system_message=system)
        return await handler(request)

    async def aafter_model(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """The whole batch of search calls: one round, one ``ToolMessage`` per call."""
        answers = await self.recall.answer_batch(state["messages"], runtime.context,
                                                 reviewer_edits(state))
        return {"messages": answers} if answers else None
