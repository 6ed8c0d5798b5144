"""Closing a ProcessRetriever while ``start()`` is starting workers: none of that start's
workers is kept idle in the closed retriever (a stray process), those started after the close
included."""

from __future__ import annotations

import os

import anyio
import pytest

from plugin import ProcessRetriever

from . import _process_slow_factories as factories

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _children() -> set[int]:
    """This process's running children (read from /proc)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                found.add(int(entry))
    return found


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
        while _children():
            await anyio.sleep(0.05)
