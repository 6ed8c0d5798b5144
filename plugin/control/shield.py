"""Work that must finish whatever cancels its caller: a ledger write that records what ran.

An anyio shield (``CancelScope(shield=True)``) holds every anyio and trio cancellation. An
asyncio task's own ``cancel()`` (what ``asyncio.gather``, ``asyncio.wait_for`` and a
framework's task management send) passes any anyio shield, so on asyncio the work runs as a
task of its own, which a native cancel of the caller does not reach: the caller awaits it again
after each one and re-raises the cancellation only once the work is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import sniffio

T = TypeVar("T")


def read_outcome(task: asyncio.Future[Any]) -> None:
    """A done callback that reads a task's error, so asyncio never logs it as "never
    retrieved" (whoever awaits the task still gets it)."""
    if not task.cancelled():
        task.exception()


async def finish(work: Callable[[], Awaitable[T]]) -> T:
    """``await work()`` to its end, whatever cancels the caller meanwhile. A cancellation of
    the caller is raised once the work is done, whatever the work's own outcome (its error is
    then the cancellation's context)."""
    if sniffio.current_async_library() != "asyncio":
        with anyio.CancelScope(shield=True):
            done = await work()
        return done  # noqa: RET504 (a return inside the scope is not seen to return)
    task = asyncio.ensure_future(work())  # copies the context, as a child task does
    task.add_done_callback(read_outcome)
    cancelled: asyncio.CancelledError | None = None
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError as exc:  # the caller's native cancel: keep waiting
                cancelled = exc  # even when the work ended in the same step
            except BaseException:  # the work's own outcome: read below
                pass
    if cancelled is not None:
        error = None if task.cancelled() else task.exception()
        raise cancelled from error
    return task.result()


def loop_token() -> anyio.lowlevel.EventLoopToken | None:
    """The running event loop's token (None outside one): which loop a ledger, or the hooks
    an adapter was built beside, are used on."""
    try:
        return anyio.lowlevel.current_token()
    except RuntimeError:
        return None
