"""LangChain ``create_agent`` middleware and a LangGraph tool node for bounded recall.

``create_agent`` sends each tool call to the tools node as its own ``Send("tools", [call])``,
so a tool (or ``wrap_tool_call``) only ever sees one call. The hook that sees the whole batch
is ``after_model``: :class:`RecallMiddleware` reads the last ``AIMessage``'s search calls
there, reserves ONE deliberate round for all of them (:meth:`RunRecall.dispatch_batch`) and
returns one ``ToolMessage`` per call; the framework then skips every call that already has an
answer, so the tool never runs for them. A refusal is a ``ToolMessage(status="error")`` whose
content is the typed refusal as JSON.

The automatic round belongs to the invocation (one ``ainvoke``/``astream`` of the agent):
``abefore_agent`` runs it once, before the first model request, and keeps the rendered context
in a private state field (``recall_context``); ``awrap_model_call`` adds that context to the
system message of every model request of the invocation, which take no round of their own;
``aafter_agent`` clears it, so it never reaches the next invocation (which prepares again).
``automatic="per_request"`` runs a round before every model request instead.

A call's identity is its id AND its arguments: a stored result answers only the same id with
the same arguments; a reused id with other arguments is a new call.

The run id, scope and principal come from the host's runtime context
(``create_agent(context_schema=RecallContext)``, ``ainvoke(..., context=RecallContext(...))``),
never from the state the model writes. A call that already has a ``ToolMessage`` in the state
(another middleware's answer, or one checkpointed before a restart) is never dispatched. Inside
a graph the batch runs as a LangGraph task (:func:`dispatch_kept`), so its results are kept in
the checkpoint: a hook or node re-run after an ``interrupt()``, in this process or a new one,
never dispatches it again (a batch reserves at most once).

For a hand-built LangGraph graph, :class:`RecallToolNode` dispatches the batch and then runs a
``ToolNode``; its sync form drives the async hooks on the host's event loop. The model node
calls :meth:`LangChainRecall.automatic_context` at every model request: the round runs once per
graph invocation, and later requests of the invocation get the same context.

A sync ``agent.invoke`` works from a worker thread of the hooks' event loop
(``anyio.to_thread.run_sync``) or through a blocking portal: each hook runs on that loop.
Asyncio only.
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import json
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Annotated, Any, TypeVar

import anyio.from_thread
import anyio.lowlevel
import attrs
import sniffio

from plugin.errors import RecallboundError, RunIdentityError
from plugin.memory.state import WorkingState
from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import RecallHooks, ToolCall, ToolResult

from ._options import deprecated_alias
from .batch import AutomaticMode, Invocation, RunRecall, RunRecalls, automatic_mode
from .tool import SEARCH_TOOL

with missing_extra("langchain", "runtime_hooks.adapters.langchain"):
    from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest
    from langchain.agents.middleware.types import ModelResponse, PrivateStateAttr
    from langchain.tools import ToolRuntime
    from langchain_core.messages import (
        AIMessage,
        AnyMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_core.tools import BaseTool, StructuredTool
    from langgraph.config import get_config
    from langgraph.func import task
    from langgraph.prebuilt import ToolNode
    from langgraph.runtime import Runtime, get_runtime
    from typing_extensions import NotRequired


_R = TypeVar("_R")


class MissingRecallContextError(RecallboundError, TypeError):
    """The run's context does not carry the host's run id, scope and principal."""


RecallContextMismatchError = RunIdentityError
"""One run id was given with a different scope or principal than before (the package's
:class:`~plugin.errors.RunIdentityError`, under this module's older name)."""


class NotDispatchedError(RecallboundError, RuntimeError):
    """A sync invoke (a hand-built graph's node, or ``agent.invoke``) cannot reach the event
    loop the hooks run on."""


# A frozen dataclass, not attrs: LangGraph types ``context_schema`` as a dataclass, a
# TypedDict or a pydantic model.
@dataclasses.dataclass(frozen=True, kw_only=True)
class RecallContext:
    """The host's trusted identity of one agent run; pass it as the runtime context."""

    run_id: str
    scope: str
    principal: str


def context_of(context: object) -> RecallContext:
    """The default ``identity``: the runtime context itself, or its ``recall`` attribute."""
    for candidate in (context, getattr(context, "recall", None)):
        if isinstance(candidate, RecallContext):
            return candidate
    raise MissingRecallContextError(
        "the run's context must be a RecallContext (or carry one as .recall); pass "
        f"context=RecallContext(run_id=..., scope=..., principal=...), got {type(context)!r}"
    )


def latest_request(messages: Sequence[AnyMessage]) -> WorkingState | None:
    """The default working state: the latest user message as ``current_request``."""
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            text = str(message.text).strip()
            return WorkingState(text) if text else None
    return None


def tool_message(result: ToolResult) -> ToolMessage:
    """A search call's result as the model reads it; anything but ``ok`` is an error."""
    return ToolMessage(
        content=json.dumps(result.as_dict(), ensure_ascii=False),
        tool_call_id=result.call_id,
        name=SEARCH_TOOL.name,
        status="success" if result.status == "ok" else "error",
    )


def _not_dispatched(call_id: str) -> ToolResult:
    return ToolResult(
        call_id=call_id, status="failed",
        content="This search call was not dispatched by the recall hook, so no search was run "
        "(install RecallMiddleware, or run the tools through RecallToolNode).",
    )


def pending_search_calls(messages: Sequence[AnyMessage]) -> list[ToolCall]:
    """The last ``AIMessage``'s search calls that have no ``ToolMessage`` after it yet."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            answered = {m.tool_call_id for m in messages[index + 1:]
                        if isinstance(m, ToolMessage)}
            return [
                ToolCall(call_id=call["id"], arguments=call["args"])
                for call in message.tool_calls
                if call["name"] == SEARCH_TOOL.name and call["id"] is not None
                and call["id"] not in answered
            ]
    return []


_node_run: contextvars.ContextVar[RunRecall | None] = contextvars.ContextVar(
    "recallbound_langchain_node_run", default=None
)
"""The run a :class:`RecallToolNode` dispatched for, while its ToolNode's tools read results:
pinned there, so a registry that forgets the run meanwhile cannot lose the batch's results."""

_CHECKPOINTER = "__pregel_checkpointer"
"""Where LangGraph puts a run's checkpointer in its config (``CONFIG_KEY_CHECKPOINTER``)."""


async def dispatch_kept(run: RunRecall, calls: Sequence[ToolCall]) -> list[ToolResult]:
    """One deliberate round for ``calls``, kept in the graph's checkpoint when there is one.

    Inside a LangGraph node the batch runs as a task: a node re-run after an ``interrupt()``
    (in this process or after a restart, with the same checkpointer) gets the batch's results
    from the checkpoint and never dispatches it again; in a new process those searches answer
    with their evidence re-read under the run's validation bound (:meth:`RunRecall.replay`).
    Outside a graph it is :meth:`RunRecall.dispatch_batch`.
    """
    try:
        configurable = get_config().get("configurable", {})
    except RuntimeError:  # not inside a graph run: nothing to keep the batch in
        return await run.dispatch_batch(calls)
    if configurable.get(_CHECKPOINTER) is None:
        # No checkpointer: nothing is kept, and nothing can be resumed (an interrupt needs
        # one), so the task would only cost time (about 0.6 ms a batch).
        return await run.dispatch_batch(calls)
    dispatched = False

    async def recallbound_search_batch() -> list[dict[str, object]]:
        nonlocal dispatched
        dispatched = True
        results = await run.dispatch_batch(calls)
        return [run.record(c, r) for c, r in zip(calls, results, strict=True)]

    records = await task(recallbound_search_batch)()
    if not dispatched:  # the checkpoint's: the batch ran before this node re-ran
        await run.replay(records)
    return await run.dispatch_batch(calls)  # every call is stored now: no round


def dispatch_kept_sync(
    run: RunRecall, calls: Sequence[ToolCall], token: anyio.lowlevel.EventLoopToken | None
) -> list[ToolResult]:
    """:func:`dispatch_kept` from a sync graph run: the batch is dispatched on the hooks' loop
    (``token``) from this worker thread, and kept in the graph's checkpoint like the async
    form's. Raises :class:`NotDispatchedError` on the loop's own thread (waiting for the loop
    there would deadlock) or without a loop to run on."""
    loop = _hooks_loop(token)

    def dispatch() -> list[ToolResult]:
        return anyio.from_thread.run(run.dispatch_batch, calls, token=loop)

    try:
        configurable = get_config().get("configurable", {})
    except RuntimeError:  # not inside a graph run
        return dispatch()
    if configurable.get(_CHECKPOINTER) is None:
        return dispatch()
    dispatched = False

    def recallbound_search_batch() -> list[dict[str, object]]:
        nonlocal dispatched
        dispatched = True
        results = dispatch()
        return [run.record(c, r) for c, r in zip(calls, results, strict=True)]

    records = task(recallbound_search_batch)().result()
    if not dispatched:  # the checkpoint's: the batch ran before this node re-ran
        anyio.from_thread.run(run.replay, records, token=loop)
    return dispatch()  # every call is stored now: no round


def _hooks_loop(token: anyio.lowlevel.EventLoopToken | None) -> anyio.lowlevel.EventLoopToken:
    """The hooks' event loop, for a sync call made from one of its worker threads."""
    if _on_event_loop_thread():
        raise NotDispatchedError(
            "a sync invoke (agent.invoke, graph.invoke) must run in a worker thread of the "
            "hooks' event loop (await anyio.to_thread.run_sync(...), or a blocking portal), "
            "not on the loop's own thread: the loop that must run the recall is blocked there"
        )
    if token is None:
        raise NotDispatchedError(
            "a sync invoke needs the hooks' event loop: build the middleware or node inside "
            "that loop (in async code, or with portal.call(...) of a blocking portal)"
        )
    return token


def _current_token() -> anyio.lowlevel.EventLoopToken | None:
    try:
        return anyio.lowlevel.current_token()
    except RuntimeError:  # built outside any event loop: no sync path
        return None


Identify = Callable[[object], RecallContext]
StateOf = Callable[[Sequence[AnyMessage]], WorkingState | None]


@attrs.define(eq=False)
class LangChainRecall:
    """What the middleware and the tool node share: the hooks, the runs and the tool.

    One :class:`RunRecall` per run id (the most recent ``max_runs`` are kept), so the
    results a batch stored are found by the tool and by a re-run of the same hook.
    """

    hooks: RecallHooks
    identity: Identify = context_of
    """The host's run id, scope and principal from the run's context (default:
    :func:`context_of`); the same option name in every adapter."""
    working_state: StateOf = latest_request
    max_runs: int = 1024
    _identify: Identify | None = attrs.field(default=None, alias="identify", kw_only=True,
                                             repr=False)
    """Deprecated alias of ``identity``."""
    _runs: RunRecalls = attrs.field(init=False, repr=False)
    _invocations: collections.OrderedDict[tuple[int, str], tuple[object, Invocation]] = (
        attrs.field(init=False, factory=collections.OrderedDict, repr=False))
    """The latest graph invocations' automatic rounds (at most ``max_runs``), by run control."""
    tool: BaseTool = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self._identify is not None:
            self.identity = deprecated_alias("identify", "identity", self._identify,
                                             self.identity, context_of, stacklevel=4)
        self._runs = RunRecalls(self.hooks, RecallContextMismatchError, self.max_runs)
        self.tool = self._search_tool()

    def run(self, context: object) -> RunRecall:
        """The run's recall, keyed by the host's run id (checked against scope and principal)."""
        trusted = self.identity(context)
        return self._runs.get(trusted.run_id, scope=trusted.scope, principal=trusted.principal)

    async def automatic_context(self, messages: Sequence[AnyMessage], context: object) -> str:
        """The graph invocation's automatic context; the rendered block ("" if none).

        Call it from a hand-built graph's model node at every model request: the first call
        of a graph invocation (one ``ainvoke``/``astream``) runs the automatic round, every
        later call of the same invocation returns the same context and takes no round, and
        the next invocation prepares again. An invocation is known by the run control
        LangGraph creates for each run (``Runtime.control``); a host that passes its own
        ``control=`` passes a fresh one per invocation, as LangGraph asks. Outside a graph run
        it is :meth:`prepare_now`.
        """
        run = self.run(context)
        invocation = self._graph_invocation(run.run_id)

        async def prepare() -> str:
            return await self._render(run, messages)

        return await (prepare() if invocation is None else invocation.context(prepare))

    async def prepare_now(self, messages: Sequence[AnyMessage], context: object) -> str:
        """An automatic round now, whatever ran before (``automatic="per_request"``)."""
        return await self._render(self.run(context), messages)

    async def _render(self, run: RunRecall, messages: Sequence[AnyMessage]) -> str:
        state = self.working_state(messages)
        if state is None:
            return ""
        return (await run.prepare(state)).render()

    def _graph_invocation(self, run_id: str) -> Invocation | None:
        """The current graph invocation's automatic round; None outside a graph run."""
        try:
            control = get_runtime().control
        except (RuntimeError, AttributeError):  # not in a graph run
            return None
        if control is None:
            return None
        key = (id(control), run_id)
        found = self._invocations.get(key)
        if found is not None and found[0] is control:
            self._invocations.move_to_end(key)
            return found[1]
        invocation = Invocation()
        # The entry holds the control itself, so its id cannot name another run meanwhile.
        self._invocations[key] = (control, invocation)
        while len(self._invocations) > self.max_runs:
            self._invocations.popitem(last=False)
        return invocation

    async def answer_batch(
        self, messages: Sequence[AnyMessage], context: object
    ) -> list[ToolMessage]:
        """One deliberate round for the last model response's unanswered search calls."""
        calls = pending_search_calls(messages)
        if not calls:
            return []
        return [tool_message(r) for r in await dispatch_kept(self.run(context), calls)]

    def stored(
        self, runtime: ToolRuntime[Any, Any], arguments: dict[str, Any] | None = None
    ) -> ToolMessage:
        """The tool's answer: the result its batch stored for this id and these arguments
        (never a search of its own)."""
        call_id = runtime.tool_call_id or ""
        trusted = self.identity(runtime.context)
        pinned = _node_run.get()
        same = pinned is not None and (pinned.run_id, pinned.scope, pinned.principal) == (
            trusted.run_id, trusted.scope, trusted.principal)
        run = pinned if same and pinned is not None else self.run(runtime.context)
        result = run.result(call_id, arguments or {})
        return tool_message(result if result is not None else _not_dispatched(call_id))

    def _search_tool(self) -> BaseTool:
        """``search_memory`` rendered from :data:`SEARCH_TOOL` (its schema, unchanged)."""

        # The arguments are not validated here: the hooks validate them when the batch is
        # dispatched, and an invalid call gets its typed answer there.
        def search(*, runtime: ToolRuntime[Any, Any], **arguments: Any) -> ToolMessage:
            return self.stored(runtime, arguments)

        async def asearch(*, runtime: ToolRuntime[Any, Any], **arguments: Any) -> ToolMessage:
            return self.stored(runtime, arguments)

        return StructuredTool(
            name=SEARCH_TOOL.name, description=SEARCH_TOOL.description,
            args_schema=SEARCH_TOOL.json_schema(), func=search, coroutine=asearch,
        )


def system_with_context(system: SystemMessage | None, block: str) -> SystemMessage:
    """The system message with the rendered recall block appended (or made of it)."""
    if system is None:
        return SystemMessage(content=block)
    if isinstance(system.content, str):
        return SystemMessage(content=f"{system.content}\n\n{block}" if system.content else block)
    return SystemMessage(content=[*system.content, {"type": "text", "text": block}])


class RecallState(AgentState[Any]):
    """The agent state with the invocation's prepared recall context (private to the
    middleware: neither input nor output of the agent; cleared when the invocation ends)."""

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
        self.token = _current_token()

    def _on_loop(self, function: Callable[..., Coroutine[Any, Any, _R]], *args: Any) -> _R:
        """Run one async hook on the hooks' loop from the sync run's worker thread."""
        return anyio.from_thread.run(function, *args, token=_hooks_loop(self.token))

    def before_agent(self, state: RecallState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """:meth:`abefore_agent` for a sync ``agent.invoke``, run on the hooks' loop."""
        return self._on_loop(self.abefore_agent, state, runtime)

    def after_agent(self, state: RecallState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """:meth:`aafter_agent` for a sync ``agent.invoke``."""
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
        calls = pending_search_calls(state["messages"])
        if not calls:
            return None
        run = self.recall.run(runtime.context)
        return {"messages": [tool_message(r) for r in dispatch_kept_sync(run, calls, self.token)]}

    async def abefore_agent(
        self, state: RecallState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """The invocation's automatic round, once, before its first model request."""
        if self.mode != "per_invocation":
            return None
        block = await self.recall.prepare_now(state["messages"], runtime.context)
        return {"recall_context": block}

    async def aafter_agent(
        self, state: RecallState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """The invocation is over: its prepared context goes with it."""
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
        answers = await self.recall.answer_batch(state["messages"], runtime.context)
        return {"messages": answers} if answers else None


@attrs.define(eq=False)
class RecallToolNode:
    """A hand-built LangGraph graph's tools node: dispatch the batch, then run the ToolNode.

    ``ainvoke`` is the async node. ``invoke`` is the node for a sync ``graph.invoke`` run from
    a worker thread of the loop the hooks were opened on (``await anyio.to_thread.run_sync(
    graph.invoke, ...)``): it dispatches on that loop (``token``, taken when the node is built
    inside the loop) and then lets the ToolNode run its tools in pool threads, where each tool
    only reads its stored result. Build it inside the running loop.
    """

    recall: LangChainRecall
    tools: ToolNode
    token: anyio.lowlevel.EventLoopToken = attrs.field(factory=anyio.lowlevel.current_token)

    @classmethod
    def with_tools(cls, recall: LangChainRecall, tools: Sequence[BaseTool] = ()) -> RecallToolNode:
        """A node whose ToolNode holds ``search_memory`` and ``tools``."""
        return cls(recall, ToolNode([recall.tool, *tools]))

    async def ainvoke(self, state: dict[str, Any], runtime: Runtime[Any]) -> Any:
        """The async node: one round for the batch (kept in the checkpoint:
        :func:`dispatch_kept`), then the ToolNode; an ``interrupt()`` in a sibling tool never
        makes the batch dispatch again, after a restart either."""
        run = self.recall.run(runtime.context)
        calls = pending_search_calls(state["messages"])
        if calls:
            await dispatch_kept(run, calls)
        token = _node_run.set(run)  # the ToolNode's tool tasks copy this context
        try:
            return await self.tools.ainvoke(state)
        finally:
            _node_run.reset(token)

    def invoke(self, state: dict[str, Any], runtime: Runtime[Any]) -> Any:
        """The sync node: the batch dispatched on the hooks' loop (as a task, like
        :meth:`ainvoke`), then the ToolNode."""
        calls = pending_search_calls(state["messages"])
        run = self.recall.run(runtime.context)
        if calls:
            dispatch_kept_sync(run, calls, self.token)
        token = _node_run.set(run)  # the ToolNode's pool threads run in copies of this context
        try:
            return self.tools.invoke(state)
        finally:
            _node_run.reset(token)


def _on_event_loop_thread() -> bool:
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return False
    return True
