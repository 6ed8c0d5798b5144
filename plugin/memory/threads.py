"""The worker threads the memory store and the semantic arm compute in: a limiter of their own.

A loop's default thread limiter (40 threads) is shared with everything else on the loop,
including a host's own blocking calls: a host that runs each agent from
``anyio.to_thread.run_sync`` holds one of those threads for the whole run, so forty of them
would leave recall's vector math no thread, and the preparation bound would withhold the
semantic arm of every turn. Recall's own computations wait for :func:`memory_threads` instead.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel

MEMORY_THREADS = 8
"""Worker threads one event loop lends the store and the semantic arm at once (and, apart,
each embedding adapter whose calls may be abandoned)."""

_LIMITERS: anyio.lowlevel.RunVar[dict[int, anyio.CapacityLimiter]] = anyio.lowlevel.RunVar(
    "recallbound_memory_threads")


def memory_threads(owner: object | None = None) -> anyio.CapacityLimiter:
    """The running event loop's limiter for the store's and the semantic arm's threads.

    A call that may be abandoned while its thread runs on (a query's embedding, left at the
    preparation bound) names its adapter as ``owner`` and waits for a limiter of that adapter
    alone: a thread keeps its place until it returns (on trio), so a hung model holds only
    its own adapter's threads, never the store's or another model's."""
    try:
        limiters = _LIMITERS.get()
    except LookupError:
        limiters = {}
        _LIMITERS.set(limiters)
    key = 0 if owner is None else id(owner)
    limiter = limiters.get(key)
    if limiter is None:
        limiter = limiters[key] = anyio.CapacityLimiter(MEMORY_THREADS)
    return limiter
