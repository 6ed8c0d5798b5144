"""The store's and the semantic arm's worker threads (plugin.memory.threads), and a hooks loop
that stops under a recall sent to it (runtime_hooks.adapters.hooks_loop)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

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
async def test_a_hooks_loop_that_stops_with_a_call_queued_ends_it_with_a_typed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An asyncio loop that stops (and closes) with the call's start still queued never runs
    # it and never says so: the caller must not wait for ever.
    from runtime_hooks.adapters import hooks_loop

    token: dict[str, anyio.lowlevel.EventLoopToken] = {}
    stopping, sent = threading.Event(), threading.Event()
    send = hooks_loop._soon

    def sent_then_told(loop: anyio.lowlevel.EventLoopToken, callback: Any) -> bool:
        queued = send(loop, callback)
        sent.set()
        return queued

    monkeypatch.setattr(hooks_loop, "_soon", sent_then_told)

    def hooks_thread() -> None:
        loop = asyncio.new_event_loop()

        async def take_token() -> None:
            token["loop"] = anyio.lowlevel.current_token()

        loop.run_until_complete(take_token())

        def stop_with_a_call_queued() -> None:
            loop.stop()  # this is the loop's last step: what is queued now never runs
            stopping.set()
            sent.wait(30)

        loop.call_soon(stop_with_a_call_queued)
        loop.run_forever()
        loop.close()

    async def call() -> int:
        return 42

    threading.Thread(target=hooks_thread, daemon=True).start()
    await anyio.to_thread.run_sync(stopping.wait)
    with anyio.fail_after(30), pytest.raises(HooksLoopStoppedError):
        await on_loop(token["loop"], call)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_hung_langgraph_store_holds_only_its_own_threads() -> None:
    # Off asyncio the LangGraph store's synchronous search runs in a thread left at the
    # round's deadline; hung, those threads must not take the store's vector math with them.
    from langgraph.store.memory import InMemoryStore

    from plugin.memory.langgraph_store import langgraph_store_retriever
    from plugin.memory.simple import SearchRequest

    release, entered = threading.Event(), threading.Semaphore(0)

    class Hung(InMemoryStore):
        def search(self, *args: Any, **kwargs: Any) -> Any:
            entered.release()
            release.wait()
            return []

    store = Hung(index={"dims": 4, "embed": lambda texts: [[0.0] * 4 for _ in texts]})
    retriever = langgraph_store_retriever(store)
    request = SearchRequest(text="x", embedding=None, principal="p", scope="s", limit=5,
                            query=None, seconds_left=lambda: 1.0)
    try:
        for _ in range(MEMORY_THREADS):
            async with anyio.create_task_group() as group:
                group.start_soon(retriever.search_fn, request)
                await anyio.to_thread.run_sync(entered.acquire)  # its thread is searching
                group.cancel_scope.cancel()  # the round's deadline leaves it
        with anyio.fail_after(30):
            assert await anyio.to_thread.run_sync(lambda: 1, limiter=memory_threads()) == 1
    finally:
        release.set()
