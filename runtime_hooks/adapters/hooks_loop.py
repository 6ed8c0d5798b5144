"""The hooks' event loop: where an adapter's recall runs when the framework's run is on another.

The ledger's and the store's locks, connections and pools belong to the event loop they were
opened on (the hooks' loop, :attr:`RecallHooks.loop <runtime_hooks.hooks.RecallHooks.loop>`).
A framework may run an agent on a loop of its own (``Runner.run_sync``, pydantic-ai's
``run_sync``, ``asyncio.run`` in a request thread): its recall then runs on the hooks' loop,
from a worker thread, while its own loop waits. That loop must keep running meanwhile (the
hooks opened in a blocking portal, or in async code that awaits the other threads' work); an
asyncio loop that is not running (idle between ``run_until_complete`` calls, or closed) cannot
take the call, which then runs where it is awaited, as on the hooks' own loop.

A cancelled caller cancels its recall on the hooks' loop, as it would on its own loop: the
caller's cancellation reaches the forwarded call's scope there, and the caller does not wait
for it to end.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import attrs

from plugin.control.shield import loop_token
from runtime_hooks.hooks import RecallHooks

T = TypeVar("T")
P = ParamSpec("P")


class _HasHooks(Protocol):
    @property
    def hooks(self) -> RecallHooks: ...


S = TypeVar("S", bound=_HasHooks)


class _Abandoned(RuntimeError):
    """A forwarded call its caller cancelled: nobody reads its outcome."""


@attrs.define
class _Forwarded:
    """One call forwarded to the hooks' loop, and its caller's cancellation."""

    _scope: anyio.CancelScope | None = None
    _cancelled: bool = False

    async def run(self, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        with anyio.CancelScope() as self._scope:
            if self._cancelled:  # cancelled before it began
                self._scope.cancel()
            return await call()
        raise _Abandoned

    def cancel(self) -> None:
        """On the hooks' loop: stop the call (or, not begun yet, stop it as it begins)."""
        self._cancelled = True
        if self._scope is not None:
            self._scope.cancel()


def _takes_calls(loop: anyio.lowlevel.EventLoopToken) -> bool:
    """Whether ``loop`` runs a call sent to it now (an asyncio loop must be running)."""
    native = loop.native_token
    return native.is_running() if isinstance(native, asyncio.AbstractEventLoop) else True


async def on_loop(
    loop: anyio.lowlevel.EventLoopToken | None, call: Callable[[], Coroutine[Any, Any, T]]
) -> T:
    """``call()`` on the event loop ``loop`` when this is another one: from a worker thread,
    while this loop waits (see the module docstring). On the same loop, with no loop known,
    or when ``loop`` is an asyncio loop that is not running, it is awaited here."""
    if loop is None or loop_token() == loop or not _takes_calls(loop):
        return await call()
    forwarded: _Forwarded = _Forwarded()
    try:
        return await anyio.to_thread.run_sync(
            functools.partial(anyio.from_thread.run, forwarded.run, call, token=loop),
            abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(
                functools.partial(anyio.from_thread.run_sync, forwarded.cancel, token=loop))
        raise


def on_hooks_loop(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """A method of an object holding ``hooks``, run on the hooks' loop (:func:`on_loop`)."""

    @functools.wraps(method)
    async def forwarded(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await on_loop(self.hooks.loop, lambda: method(self, *args, **kwargs))

    return forwarded
