"""The store's and the semantic arm's worker threads (plugin.memory.threads), and a hooks loop
that stops under a recall sent to it (runtime_hooks.adapters.hooks_loop)."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from plugin.memory.threads import MEMORY_THREADS, memory_threads
from runtime_hooks.adapters.hooks_loop import HooksLoopStoppedError, on_loop

pytestmark = pytest.mark.anyio


async def test_a_hung_models_abandoned_threads_hold_only_that_models_limiter() -> None:
    # On trio an abandoned thread keeps its limiter's place until it returns: a model that
    # hangs must not take the store's threads, nor another model's, with it.
    hung, healthy = object(), object()
    release = threading.Event()
    try:
        for _ in range(MEMORY_THREADS):
            with anyio.move_on_after(0):  # abandoned at once, its thread left running
                await anyio.to_thread.run_sync(release.wait, abandon_on_cancel=True,
                                               limiter=memory_threads(hung))
        assert memory_threads(hung) is memory_threads(hung)
        for limiter in (memory_threads(), memory_threads(healthy)):
            assert limiter is not memory_threads(hung)
            with anyio.fail_after(30):
                assert await anyio.to_thread.run_sync(lambda: 1, limiter=limiter) == 1
    finally:
        release.set()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_hooks_loop_that_stops_with_a_call_queued_ends_it_with_a_typed_error() -> None:
    # An asyncio loop that stops (and closes) with the call's start still queued never runs
    # it and never says so: the caller must not wait for ever.
    token: dict[str, anyio.lowlevel.EventLoopToken] = {}
    queued = threading.Event()

    def hooks_thread() -> None:
        loop = asyncio.new_event_loop()

        async def take_token() -> None:
            token["loop"] = anyio.lowlevel.current_token()

        loop.run_until_complete(take_token())

        def stop_with_a_call_queued() -> None:
            loop.stop()
            queued.set()
            time.sleep(0.3)  # the caller's call is queued behind this callback

        loop.call_soon(stop_with_a_call_queued)
        loop.run_forever()
        loop.close()

    async def call() -> int:
        return 42

    threading.Thread(target=hooks_thread, daemon=True).start()
    await anyio.to_thread.run_sync(queued.wait)
    with anyio.fail_after(30), pytest.raises(HooksLoopStoppedError):
        await on_loop(token["loop"], call)
