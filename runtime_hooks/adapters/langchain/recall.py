"""What the middleware and the tool node share: the hooks, the runs and the tool."""

from __future__ import annotations

import collections
import contextvars
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import anyio.from_thread
import anyio.lowlevel
import attrs

from plugin.control.shield import loop_token
from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import RecallHooks, ToolCall, ToolResult

from .._options import deprecated_alias
from ..batch import CallKey, RunRecall, RunRecalls, call_key
from ..invocation import Invocation
from ..tool import SEARCH_TOOL
from .identity import (
    Identify,
    MissingRecallContextError,
    RecallContext,
    RecallContextMismatchError,
    context_of,
)
from .kept import dispatch_kept
from .loop import on_event_loop_thread
from .messages import (
    StateOf,
    batch_answers,
    latest_request,
    not_dispatched,
    pending_search_calls,
    tool_message,
)

with missing_extra("langchain", "runtime_hooks.adapters.langchain"):
    from langchain.tools import ToolRuntime
    from langchain_core.messages import AnyMessage, ToolMessage
    from langchain_core.tools import BaseTool, StructuredTool
    from langgraph.config import get_config
    from langgraph.runtime import get_runtime


@attrs.frozen
class NodeBatch:
    """What a :class:`RecallToolNode` dispatched, while its ToolNode's tools read the results:
    the run (pinned, so a registry that forgets it meanwhile cannot lose them) and each call's
    answer, the ones no run keeps (``in_flight``: claimed elsewhere, no outcome yet) too."""

    run: RunRecall
    answers: Mapping[CallKey, ToolResult]

    @classmethod
    def of(cls, run: RunRecall, calls: Sequence[ToolCall],
           results: Sequence[ToolResult]) -> NodeBatch:
        return cls(run, {call_key(call.call_id, call.arguments): result
                         for call, result in zip(calls, results, strict=True)})


node_run: contextvars.ContextVar[NodeBatch | None] = contextvars.ContextVar(
    "recallbound_langchain_node_run", default=None
)
"""The batch a :class:`RecallToolNode` dispatched, while its ToolNode's tools read results."""


INVOCATIONS_KEPT = 1024
"""How many graph invocations' automatic rounds a hooks object remembers at least."""


@attrs.define(eq=False)
class Turns:
    """Graph invocations' automatic rounds, by run control and run id: the latest ``bound``.

    An entry is kept while its invocation may still make a model request, and LangGraph says
    nothing when an invocation ends (its run control cannot even be weakly referenced), so
    the table is bounded by count: by the largest ``max_runs`` of the instances that share it,
    and never fewer than :data:`INVOCATIONS_KEPT`, so that a small run registry cannot make an
    invocation still running forget that it prepared and take a second automatic round.
    """

    bound: int = INVOCATIONS_KEPT
    entries: collections.OrderedDict[tuple[int, str], tuple[object, Invocation]] = \
        attrs.field(factory=collections.OrderedDict)


_turns: weakref.WeakKeyDictionary[RecallHooks, Turns] = weakref.WeakKeyDictionary()
"""The graph invocations of each hooks object, shared by every :class:`LangChainRecall` over
them: an agent used as a node of another graph (or invoked from its tool) is run by its own
middleware, yet it is part of the outer invocation's user turn."""


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
    _invocations: Turns = attrs.field(init=False, repr=False)
    """The latest graph invocations' automatic rounds, by run control; shared with every
    other instance over the same hooks (see :class:`Turns`)."""
    tool: BaseTool = attrs.field(init=False, repr=False)
    token: anyio.lowlevel.EventLoopToken | None = attrs.field(factory=loop_token, init=False,
                                                              repr=False)
    """The loop it was built in, where a sync invoke's tool reads the ledger."""

    def __attrs_post_init__(self) -> None:
        if self._identify is not None:
            self.identity = deprecated_alias("identify", "identity", self._identify,
                                             self.identity, context_of, stacklevel=4)
        self._runs = RunRecalls(self.hooks, RecallContextMismatchError, self.max_runs)
        self._invocations = _turns.setdefault(self.hooks, Turns())
        self._invocations.bound = max(self._invocations.bound, self.max_runs)
        self.tool = self._search_tool()

    def _trusted(self, context: object) -> RecallContext:
        """The run's identity from ``identity``; raises :class:`MissingRecallContextError` (a
        ``TypeError``) naming the type it returned when that is not a :class:`RecallContext`."""
        trusted = self.identity(context)
        if not isinstance(trusted, RecallContext):
            raise MissingRecallContextError(
                f"identity must return a RecallContext, got {type(trusted).__name__}")
        return trusted

    def run(self, context: object) -> RunRecall:
        """The run's recall, keyed by the host's run id (checked against scope and principal)."""
        trusted = self._trusted(context)
        return self._runs.get(trusted.run_id, scope=trusted.scope, principal=trusted.principal)

    async def automatic_context(self, messages: Sequence[AnyMessage], context: object) -> str:
        """The graph invocation's automatic context; the rendered block ("" if none).

        Call it from a hand-built graph's model node at every model request: the first call
        of a graph invocation (one ``ainvoke``/``astream``) runs the automatic round, every
        later call of the same invocation returns the same context and takes no round, and
        the next invocation prepares again. An invocation is known by the run control
        LangGraph creates for each run (``Runtime.control``), which every graph nested in it
        (a subgraph, an agent used as a node or invoked by a tool) shares: over the same hooks
        and run id they are one user turn and take no round of their own. A host that passes
        its own ``control=`` passes a fresh one per invocation, as LangGraph asks. Outside a
        graph run it is :meth:`prepare_now`.
        """
        return await self._context(messages, context, agent=False)

    async def agent_context(self, messages: Sequence[AnyMessage], context: object) -> str:
        """:meth:`automatic_context` for a ``create_agent`` agent's ``before_agent``: called
        once when the agent starts, so an agent that starts after the graph invocation it runs
        in has ended (a follow-up a tool scheduled in a background task) is the next turn and
        prepares again. A hand-built graph's model node calls :meth:`automatic_context` at
        every request instead, so the invocation it started in stays its own to the end."""
        return await self._context(messages, context, agent=True)

    async def _context(self, messages: Sequence[AnyMessage], context: object, *,
                       agent: bool) -> str:
        run = self.run(context)
        invocation = self._graph_invocation(run.run_id, renew_ended=agent)

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

    def end_invocation(self, context: object) -> None:
        """The agent that ends here was the graph invocation's own (not one nested in it): its
        automatic round is over, so a run that starts later with the same run control (a
        follow-up a tool scheduled in a background task) is the next turn and prepares again.
        Called by the middleware's ``after_agent``; a hand-built graph's invocation has no
        such end, and is forgotten by count (:class:`Turns`)."""
        try:
            namespace = get_config().get("configurable", {}).get("checkpoint_ns", "")
        except RuntimeError:  # not in a graph run
            return
        if "|" in str(namespace):  # nested in another graph's invocation
            return
        recorded = self._recorded(self._trusted(context).run_id)
        if recorded is not None and recorded[1] is not None:
            recorded[1].end()

    def _recorded(self, run_id: str) -> tuple[object, Invocation | None] | None:
        """The current run control and the invocation recorded for it and ``run_id`` (None
        if there is none); None outside a graph run."""
        try:
            control = get_runtime().control
        except (RuntimeError, AttributeError):  # not in a graph run
            return None
        if control is None:
            return None
        found = self._invocations.entries.get((id(control), run_id))
        return control, (found[1] if found is not None and found[0] is control else None)

    def _graph_invocation(self, run_id: str, *, renew_ended: bool) -> Invocation | None:
        """The current graph invocation's automatic round (a new one in place of an ended one
        when ``renew_ended``); None outside a graph run."""
        recorded = self._recorded(run_id)
        if recorded is None:
            return None
        control, found = recorded
        key = (id(control), run_id)
        entries = self._invocations.entries
        if found is not None and not (renew_ended and found.ended):
            entries.move_to_end(key)
            return found
        invocation = Invocation()
        # The entry holds the control itself, so its id cannot name another run meanwhile.
        entries[key] = (control, invocation)
        while len(entries) > self._invocations.bound:
            entries.popitem(last=False)
        return invocation

    async def answer_batch(
        self, messages: Sequence[AnyMessage], context: object,
        edits: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[ToolMessage]:
        """One deliberate round for the last model response's unanswered search calls.

        A call a reviewer edited (``edits``, see :func:`reviewer_edits`) is searched with the
        reviewer's arguments and left to the tool node, which runs the edited call in its
        place: the tool answers it with the stored result, and the review tells the model
        what ran."""
        calls = pending_search_calls(messages, edits)
        if not calls:
            return []
        return batch_answers(await dispatch_kept(self.run(context), calls), edits or {})

    def _stored(self, runtime: ToolRuntime[Any, Any], arguments: dict[str, Any]
                ) -> tuple[RunRecall, ToolResult | None]:
        """The run, and the result its batch stored for this call (None if this process
        keeps none)."""
        call_id = runtime.tool_call_id or ""
        trusted = self._trusted(runtime.context)
        batch = node_run.get()
        if batch is not None and (batch.run.run_id, batch.run.scope, batch.run.principal) != (
                trusted.run_id, trusted.scope, trusted.principal):
            batch = None
        run = batch.run if batch is not None else self.run(runtime.context)
        result = run.result(call_id, arguments)
        if result is None and batch is not None:
            result = batch.answers.get(call_key(call_id, arguments))
        return run, result

    async def stored(
        self, runtime: ToolRuntime[Any, Any], arguments: dict[str, Any] | None = None
    ) -> ToolMessage:
        """The tool's answer: the result its batch stored for this id and these arguments, or
        the outcome the ledger recorded for the call (a registry that forgot the run between
        the batch and the tool, a restart) re-read as any replay is; never a search of its
        own."""
        call_id, arguments = runtime.tool_call_id or "", arguments or {}
        run, result = self._stored(runtime, arguments)
        if result is None:
            result = await run.recorded(call_id, arguments)
        return tool_message(result if result is not None else not_dispatched(call_id))

    def stored_sync(
        self, runtime: ToolRuntime[Any, Any], arguments: dict[str, Any] | None = None
    ) -> ToolMessage:
        """:meth:`stored` for a sync invoke's tool, in a worker thread of the hooks' loop (the
        ledger is read on that loop)."""
        call_id, arguments = runtime.tool_call_id or "", arguments or {}
        run, result = self._stored(runtime, arguments)
        if result is None and self.token is not None and not on_event_loop_thread():
            result = anyio.from_thread.run(run.recorded, call_id, arguments, token=self.token)
        return tool_message(result if result is not None else not_dispatched(call_id))

    def _search_tool(self) -> BaseTool:
        """``search_memory`` rendered from :data:`SEARCH_TOOL` (its schema, unchanged)."""

        # The arguments are not validated here: the hooks validate them when the batch is
        # dispatched, and an invalid call gets its typed answer there.
        def search(*, runtime: ToolRuntime[Any, Any], **arguments: Any) -> ToolMessage:
            return self.stored_sync(runtime, arguments)

        async def asearch(*, runtime: ToolRuntime[Any, Any], **arguments: Any) -> ToolMessage:
            return await self.stored(runtime, arguments)

        return StructuredTool(
            name=SEARCH_TOOL.name, description=SEARCH_TOOL.description,
            args_schema=SEARCH_TOOL.json_schema(), func=search, coroutine=asearch,
        )
