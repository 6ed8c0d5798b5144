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
"""Worker threads one event loop lends the store and the semantic arm at once."""

_LIMITER: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "recallbound_memory_threads")


def memory_threads() -> anyio.CapacityLimiter:
    """The running event loop's limiter for the store's and the semantic arm's threads."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(MEMORY_THREADS)
        _LIMITER.set(limiter)
        return limiter
