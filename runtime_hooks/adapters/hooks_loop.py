"""The hooks' event loop: where an adapter's recall runs when the framework's run is on another.

The ledger's and the store's locks, connections and pools belong to the event loop they were
opened on (the hooks' loop, :attr:`RecallHooks.loop <runtime_hooks.hooks.RecallHooks.loop>`).
A framework may run an agent on a loop of its own (``Runner.run_sync``, pydantic-ai's
``run_sync``, ``asyncio.run`` in a request thread): its recall then runs on the hooks' loop,
from a worker thread, while its own loop waits. That loop must keep running meanwhile (the
hooks opened in a blocking portal, or in async code that awaits the other threads' work).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from plugin.control.shield import loop_token
from runtime_hooks.hooks import RecallHooks

T = TypeVar("T")
P = ParamSpec("P")


class _HasHooks(Protocol):
    @property
    def hooks(self) -> RecallHooks: ...


S = TypeVar("S", bound=_HasHooks)


async def on_loop(
    loop: anyio.lowlevel.EventLoopToken | None, call: Callable[[], Coroutine[Any, Any, T]]
) -> T:
    """``call()`` on the event loop ``loop`` when this is another one: from a worker thread,
    while this loop waits. On the same loop, or with no loop known, it is awaited here."""
    if loop is None or loop_token() == loop:
        return await call()
    return await anyio.to_thread.run_sync(lambda: anyio.from_thread.run(call, token=loop))


def on_hooks_loop(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """A method of an object holding ``hooks``, run on the hooks' loop (:func:`on_loop`)."""

    @functools.wraps(method)
    async def forwarded(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await on_loop(self.hooks.loop, lambda: method(self, *args, **kwargs))

    return forwarded
