"""``start()`` interrupted while it starts workers: none of its workers is left running
outside the pool (a stray process). Closed meanwhile, the retriever keeps none of them idle,
those started after the close included; cancelled from outside, it stops those it started."""

from __future__ import annotations

import os

import anyio
import pytest

from plugin import ProcessRetriever

from . import _process_slow_factories as factories
from ._procs import children

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")
async def test_closing_during_start_keeps_none_of_its_workers() -> None:
    env = {**os.environ, "RB_SLOW_IMPORT": "0.6"}
    retriever = ProcessRetriever(factories.factory, timeout_s=10.0, env=env)
    async with anyio.create_task_group() as tg:
        tg.start_soon(retriever.start, 2)
        await anyio.sleep(0.2)  # the first worker is importing the factory
        await retriever.aclose()
    assert retriever._idle == []
    assert retriever.started == 2
    with anyio.fail_after(5):
        while children():
            await anyio.sleep(0.05)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")
async def test_a_cancelled_start_stops_the_workers_it_started() -> None:
    env = {**os.environ, "RB_SLOW_IMPORT": "0.5"}
    retriever = ProcessRetriever(factories.factory, timeout_s=10.0, env=env)
    async with anyio.create_task_group() as tg:
        tg.start_soon(retriever.start, 3)
        with anyio.fail_after(20):
            while retriever.started < 2:  # the first worker is ready, the second importing
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert retriever.started == 2 and retriever._idle == []
    with anyio.fail_after(5):
        while children():
            await anyio.sleep(0.05)
