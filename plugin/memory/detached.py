"""A host callable run apart from its caller, waited for no longer than its time bound.

Awaited in the caller's own task, a callable that does not take a cancellation (a blocking
thread offload, a shielded wait, one that catches the cancellation and waits on) holds the
caller past any timeout. Run apart, it cannot: the caller stops waiting at the bound, the
callable is cancelled and left to end on its own, and what it returns or raises later is
dropped. A cancellation of the caller cancels it too.
"""

from __future__ import annotations

import asyncio
import contextvars
import signal
import threading
from collections.abc import Awaitable, Callable

import anyio
import attrs
import sniffio

from plugin.control.shield import read_outcome


@attrs.frozen
class Outcome:
    """What the callable returned (``value``) or raised (``error``) within its bound."""

    value: object = None
    error: BaseException | None = None


STOPS = (KeyboardInterrupt, SystemExit)
"""What a retriever raises that is never its own failure: the process is being stopped.
A ``GeneratorExit`` it leaks (from a generator it closed) is a failure like any other. Raised
in a child task on asyncio, one stops the event loop itself: a child task catches it and the
caller's task raises it."""


async def within(
    call: Callable[[], Awaitable[object]], timeout_s: float,
    *, past_it: Callable[[], bool] | None = None, settle_s: float = 0.0,
) -> Outcome | None:
    """``call()`` run apart, waited for at most ``timeout_s``: its outcome, or None when it
    did not end in time. With ``past_it``, a call still running at the bound is waited for on
    (until it ends, or the caller is cancelled) when ``past_it()`` says so then: a call whose
    own bounded work is all that is left. A caller cancelled (or stopped) while it waits
    cancels the call and gives it up to ``settle_s`` seconds, shielded, to end (a call that
    takes the cancellation finishes its own clean-up before the caller goes on)."""
    if sniffio.current_async_library() == "asyncio":
        return await _asyncio(call, timeout_s, past_it, settle_s)
    return await _trio(call, timeout_s, past_it, settle_s)


async def _wait(
    wait: Callable[[], Awaitable[object]], ended: Callable[[], bool], cancel: Callable[[], None],
    left: list[bool], timeout_s: float, past_it: Callable[[], bool] | None, settle_s: float,
) -> None:
    """Wait for the call run apart (``wait`` returns once it ended) as :func:`within` says,
    on either loop. A caller that stops waiting before it ended cancels it (``cancel``) and
    marks it ``left``; one cancelled itself first gives it ``settle_s`` seconds, shielded."""
    try:
        with anyio.move_on_after(timeout_s):
            await wait()
        if not ended() and past_it is not None and past_it():
            await wait()
    except BaseException:  # the caller's own cancellation
        cancel()
        if settle_s > 0:
            with anyio.CancelScope(shield=True), anyio.move_on_after(settle_s):
                await wait()
        raise
    finally:
        if not ended():  # the bound
            cancel()
            left.append(True)


async def _asyncio(
    call: Callable[[], Awaitable[object]], timeout_s: float,
    past_it: Callable[[], bool] | None = None, settle_s: float = 0.0,
) -> Outcome | None:
    # Cancelled through a cancel scope, as on trio: the cancellation holds at every later
    # await (a callable that catches one and waits again is cancelled again), where a bare
    # Task.cancel() is spent once caught, and the task could then outlive the event loop.
    scope = anyio.CancelScope()
    left: list[bool] = []

    async def run() -> Outcome:
        # Whatever the callable raises is kept in its outcome for its caller, never raised by
        # the task: an error of a callable that ends after its caller left (at the loop's
        # shutdown, say) would be logged as unhandled. A stop (Ctrl-C) that comes once the
        # caller left is raised, and stops the loop as it would from the caller's own task.
        # A cancellation by its own scope is caught by the scope.
        try:
            with scope:
                return Outcome(value=await call())
            return Outcome(error=asyncio.CancelledError())
        except BaseException as exc:
            if left and isinstance(exc, STOPS):
                raise
            return Outcome(error=exc)

    task = asyncio.ensure_future(run())  # a task of its own, in a copy of the context
    task.add_done_callback(read_outcome)
    await _wait(lambda: asyncio.wait({task}), task.done, scope.cancel, left, timeout_s,
                past_it, settle_s)
    if not task.done():
        return None
    if task.cancelled():
        return Outcome(error=asyncio.CancelledError())
    return task.result()


async def _trio(
    call: Callable[[], Awaitable[object]], timeout_s: float,
    past_it: Callable[[], bool] | None = None, settle_s: float = 0.0,
) -> Outcome | None:
    import trio

    ended = trio.Event()
    scope = trio.CancelScope()
    outcome: list[Outcome] = []
    left: list[bool] = []

    # A system task is shielded from KeyboardInterrupt unless it says otherwise: this one
    # takes it (and hands it to the caller in its outcome), so Ctrl-C still stops a call that
    # blocks the loop, as it would in the caller's own task. One that comes once the caller
    # left is handed to the run's main task, as trio hands it a Ctrl-C it could not deliver.
    @trio.lowlevel.disable_ki_protection
    async def run() -> None:
        try:
            with scope:
                outcome.append(Outcome(value=await call()))
        except BaseException as exc:
            if left and isinstance(exc, KeyboardInterrupt):
                _interrupt_again()
            outcome.append(Outcome(error=exc))
        finally:
            ended.set()

    trio.lowlevel.spawn_system_task(run, context=contextvars.copy_context())
    await _wait(ended.wait, ended.is_set, scope.cancel, left, timeout_s, past_it, settle_s)
    return outcome[0] if ended.is_set() and outcome else None


def _interrupt_again() -> None:
    """Raise SIGINT again from a frame shielded from KeyboardInterrupt: trio's handler then
    marks it pending and delivers it to the main task (a host's own handler is called)."""
    import trio

    @trio.lowlevel.enable_ki_protection
    def again() -> None:
        if threading.current_thread() is threading.main_thread():  # where signals are handled
            signal.raise_signal(signal.SIGINT)

    again()
