"""``start()`` cancelled from outside while it starts workers: the workers it already
started are stopped, never left running outside the pool (stray processes)."""

from __future__ import annotations

import os

import anyio
import pytest

from plugin import ProcessRetriever

from . import _process_slow_factories as factories
from .test_process_start_close import _children

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


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
        while _children():
            await anyio.sleep(0.05)
