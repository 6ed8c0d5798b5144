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
from typing import TypeVar

import anyio
import sniffio

T = TypeVar("T")


async def finish(work: Callable[[], Awaitable[T]]) -> T:
    """``await work()`` to its end, whatever cancels the caller meanwhile (then re-raised)."""
    if sniffio.current_async_library() != "asyncio":
        with anyio.CancelScope(shield=True):
            done = await work()
        return done  # noqa: RET504 (a return inside the scope is not seen to return)
    task = asyncio.ensure_future(work())  # copies the context, as a child task does
    cancelled: asyncio.CancelledError | None = None
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError as exc:  # the caller's native cancel: keep waiting
                if task.done():
                    break
                cancelled = exc
    result = task.result()  # the work's own error, if any, comes first
    if cancelled is not None:
        raise cancelled
    return result
