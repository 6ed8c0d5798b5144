"""Telling a real cancellation from one that code of the host's raised on its own.

A retriever's or an admission's own ``CancelledError`` is that code's failure; one the event
loop delivers (a deadline, the caller) must propagate.
"""

from __future__ import annotations

import asyncio

import anyio
import sniffio


def really_cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` carries a cancellation the event loop is really delivering.

    trio's ``Cancelled`` has no public constructor, so on trio one is real. On asyncio a
    ``CancelledError`` anyone can raise by hand: it is real only while the task has a pending
    cancel request (``Task.cancelling()``, Python 3.11+; before that it is taken as real).
    """
    cancelled = anyio.get_cancelled_exc_class()
    subgroup = getattr(exc, "subgroup", None)  # an exception group, on every Python
    if subgroup is not None:
        if subgroup(cancelled) is None:
            return False
    elif not isinstance(exc, cancelled):
        return False
    if sniffio.current_async_library() != "asyncio":
        return True
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0
