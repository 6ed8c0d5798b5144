"""Which event loop a sync invoke runs the hooks on (a worker thread of the hooks' loop)."""

from __future__ import annotations

import anyio.lowlevel
import sniffio

from plugin.errors import RecallboundError


class NotDispatchedError(RecallboundError, RuntimeError):
    """A sync invoke (a hand-built graph's node, or ``agent.invoke``) cannot reach the event
    loop the hooks run on."""


def hooks_loop(token: anyio.lowlevel.EventLoopToken | None) -> anyio.lowlevel.EventLoopToken:
    """The hooks' event loop, for a sync call made from one of its worker threads."""
    if on_event_loop_thread():
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


def on_event_loop_thread() -> bool:
    """Whether this thread runs an event loop (a sync wait here would block it)."""
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return False
    return True
