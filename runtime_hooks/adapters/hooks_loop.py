"""The hooks' event loop: where an adapter's recall runs when the framework's run is on another.

The ledger's and the store's locks, connections and pools belong to the event loop they were
opened on (the hooks' loop, :attr:`RecallHooks.loop <runtime_hooks.hooks.RecallHooks.loop>`).
A framework may run an agent on a loop of its own (``Runner.run_sync``, pydantic-ai's
``run_sync``, ``asyncio.run`` in a request thread): its recall then runs as a task of the
hooks' loop, started and awaited through the two loops' thread-safe callbacks (no worker
thread is taken from either loop), with the caller's context variables. The hooks' loop must
keep running meanwhile (the hooks opened in a blocking portal, or in async code that awaits
the other threads' work); an asyncio loop that is not running (idle between
``run_until_complete`` calls, or closed) cannot take the call, which then runs where it is
awaited.

A cancelled caller cancels its recall on the hooks' loop, as it would on its own loop, and
does not wait for it to end.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

import anyio
import anyio.lowlevel
import attrs
import sniffio

from plugin.control.shield import loop_token
from plugin.errors import RecallboundError
from runtime_hooks.hooks import RecallHooks

T = TypeVar("T")
P = ParamSpec("P")


class HooksLoopStoppedError(RecallboundError, RuntimeError):
    """The hooks' event loop stopped (its run ended) while a recall sent to it was running."""


class _HasHooks(Protocol):
    @property
    def hooks(self) -> RecallHooks: ...


S = TypeVar("S", bound=_HasHooks)


def _soon(loop: anyio.lowlevel.EventLoopToken, callback: Callable[[], object]) -> bool:
    """Run ``callback`` on ``loop`` soon, from any thread; False when the loop has ended."""
    native: Any = loop.native_token
    try:
        if isinstance(native, asyncio.AbstractEventLoop):
            native.call_soon_threadsafe(callback)
        else:  # trio's token
            native.run_sync_soon(callback)
    except RuntimeError:  # the loop is closed, or its run finished
        return False
    return True


_RUNNING: set[_Forwarded[Any]] = set()
"""Forwarded calls still running: a task is kept alive by a reference, and its caller may be
gone (cancelled)."""


@attrs.define(eq=False)
class _Forwarded(Generic[T]):
    """One call sent to the hooks' loop, its outcome, and its caller's cancellation."""

    _call: Callable[[], Coroutine[Any, Any, T]]
    _context: contextvars.Context
    _loop: anyio.lowlevel.EventLoopToken
    _done: Callable[[], object]
    _scope: anyio.CancelScope | None = None
    _cancelled: bool = False
    _outcome: tuple[T] | BaseException | None = None
    _task: object = None

    def start(self) -> None:
        """On the hooks' loop: run the call as a task of its own, in the caller's context."""
        _RUNNING.add(self)
        native: Any = self._loop.native_token
        if isinstance(native, asyncio.AbstractEventLoop):
            self._task = self._context.run(native.create_task, self._run())
        else:
            import trio.lowlevel

            self._task = trio.lowlevel.spawn_system_task(self._run, context=self._context)

    async def _run(self) -> None:
        try:
            with anyio.CancelScope() as self._scope:
                if self._cancelled:  # cancelled before it began
                    self._scope.cancel()
                self._outcome = (await self._call(),)
        except anyio.get_cancelled_exc_class():
            self._outcome = HooksLoopStoppedError(
                "the hooks' event loop stopped while a recall sent to it was running")
            raise
        except BaseException as exc:  # the caller reads it
            self._outcome = exc
        finally:
            _RUNNING.discard(self)
            self._done()

    def cancel(self) -> None:
        """On the hooks' loop: stop the call (or, not begun yet, stop it as it begins)."""
        self._cancelled = True
        if self._scope is not None:
            self._scope.cancel()

    def outcome(self) -> T:
        if isinstance(self._outcome, tuple):
            return self._outcome[0]
        if self._outcome is None:  # cancelled by its caller, who no longer waits
            raise HooksLoopStoppedError("the recall sent to the hooks' event loop was cancelled")
        raise self._outcome


_STOPPED_CHECK_S = 1.0
"""How often a caller waiting on the hooks' loop checks that it still runs: an asyncio loop
that stops or closes with the call queued never runs it, and never says so."""


def _takes_calls(loop: anyio.lowlevel.EventLoopToken) -> bool:
    """Whether ``loop`` runs a call sent to it now (an asyncio loop must be running)."""
    native = loop.native_token
    return native.is_running() if isinstance(native, asyncio.AbstractEventLoop) else True


async def on_loop(
    loop: anyio.lowlevel.EventLoopToken | None, call: Callable[[], Coroutine[Any, Any, T]]
) -> T:
    """``call()`` on the event loop ``loop`` when this is another one (see the module
    docstring). On the same loop, with no loop known, or when ``loop`` is an asyncio loop that
    is not running, it is awaited here."""
    here = loop_token()
    if loop is None or here is None or here == loop or not _takes_calls(loop):
        return await call()
    done = anyio.Event()
    context = contextvars.copy_context()
    # The caller's library (anyio.run sets it in the context) is not the hooks loop's.
    context.run(sniffio.current_async_library_cvar.set, None)
    forwarded = _Forwarded(call, context, loop, functools.partial(_soon, here, done.set))
    if not _soon(loop, forwarded.start):  # it ended since
        return await call()
    try:
        while not done.is_set():
            with anyio.move_on_after(_STOPPED_CHECK_S):
                await done.wait()
            if not done.is_set() and not _takes_calls(loop):  # it stopped under the call
                _soon(loop, forwarded.cancel)
                raise HooksLoopStoppedError(
                    "the hooks' event loop stopped before a recall sent to it ended")
    except anyio.get_cancelled_exc_class():
        _soon(loop, forwarded.cancel)
        raise
    return forwarded.outcome()


def on_hooks_loop(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """A method of an object holding ``hooks``, run on the hooks' loop (:func:`on_loop`)."""

    @functools.wraps(method)
    async def forwarded(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await on_loop(self.hooks.loop, lambda: method(self, *args, **kwargs))

    return forwarded
