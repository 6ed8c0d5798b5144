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

Split by the question each part answers: :mod:`.identity` (whose run this is),
:mod:`.messages` (how messages map to search calls and results), :mod:`.loop` (which event
loop a sync invoke runs the hooks on), :mod:`.kept` (how a batch is kept in the checkpoint),
:mod:`.recall` (what the middleware and the node share), :mod:`.middleware` and :mod:`.node`.
"""

from .identity import Identify as Identify
from .identity import MissingRecallContextError as MissingRecallContextError
from .identity import RecallContext as RecallContext
from .identity import RecallContextMismatchError as RecallContextMismatchError
from .identity import context_of as context_of
from .kept import dispatch_kept as dispatch_kept
from .kept import dispatch_kept_sync as dispatch_kept_sync
from .loop import NotDispatchedError as NotDispatchedError
from .messages import StateOf as StateOf
from .messages import latest_request as latest_request
from .messages import pending_search_calls as pending_search_calls
from .messages import system_with_context as system_with_context
from .messages import tool_message as tool_message
from .middleware import RecallMiddleware as RecallMiddleware
from .middleware import RecallState as RecallState
from .node import RecallToolNode as RecallToolNode
from .recall import LangChainRecall as LangChainRecall

__all__ = [
    "LangChainRecall",
    "MissingRecallContextError",
    "NotDispatchedError",
    "RecallContext",
    "RecallContextMismatchError",
    "RecallMiddleware",
    "RecallState",
    "RecallToolNode",
    "context_of",
    "dispatch_kept",
    "dispatch_kept_sync",
    "latest_request",
    "pending_search_calls",
    "system_with_context",
    "tool_message",
]
