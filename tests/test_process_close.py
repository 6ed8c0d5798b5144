"""Closing a ProcessRetriever while a search is in flight: the search keeps its result, and its
worker is stopped when it ends, never kept idle in a closed retriever (a stray process)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from plugin import ProcessRetriever, SystemClock
from runtime_hooks.hooks import ToolResult

from . import _process_edge_factories as factories
from ._hooks_env import hooks_over, search_calls
from ._procs import running

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")
async def test_closing_with_a_search_in_flight_stops_its_worker_when_it_ends(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "worker.pid"
    retriever = ProcessRetriever(factories.slow, env={**os.environ, "RB_PIDFILE": str(pidfile)})
    hooks = hooks_over(retriever, SystemClock(), deadline_s=10.0)
    results: list[ToolResult] = []

    async def search() -> None:
        results.extend(await hooks.dispatch(search_calls("slow"), run_id="r", scope="atlas",
                                            principal="ana"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(search)
        with anyio.fail_after(10):
            while not pidfile.exists() or not pidfile.read_text():
                await anyio.sleep(0.02)
        await retriever.aclose()  # the search is in flight, in the worker
    assert [r.status for r in results] == ["ok"]
    assert retriever._idle == []
    pid = int(pidfile.read_text())
    with anyio.fail_after(5):
        while running(pid):
            await anyio.sleep(0.05)
