"""A burst of parallel ``search_memory`` calls of one run shares one deliberate round even when
its first call arrives alone: the first call's batch stays open up to the window for the rest.

In isolation (a stub for the hooks, virtual time on trio) and through a real ``recallbound mcp``
process on stdio, on asyncio and on trio, where the window is generous so that the burst
always lands inside it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from runtime_hooks.mcp.window import BatchWindow

from ._mcp_env import QUERIES, ledger_id, recall_server, search
from .test_mcp_window import _hooks, _send


@pytest.mark.trio
async def test_a_burst_whose_first_call_arrives_alone_shares_one_round(
    autojump_clock: Any,
) -> None:
    hooks = _hooks()  # a fresh run: 4 slots, 2 rounds
    window = BatchWindow(hooks, window_s=0.005)  # type: ignore[arg-type]
    results: dict[str, str] = {}
    started = anyio.current_time()
    async with window.running(), anyio.create_task_group() as tg:
        tg.start_soon(_send, window, "a", results)
        await anyio.sleep(0.002)  # "a" is alone in its batch for a while
        tg.start_soon(_send, window, "b", results)
        await anyio.sleep(0.002)
        tg.start_soon(_send, window, "c", results)
        await anyio.sleep(0.004)
        tg.start_soon(_send, window, "d", results)  # past the window: the next batch
    assert [sorted(ids) for _, ids in hooks.batches] == [["a", "b", "c"], ["d"]]
    assert hooks.batches[0][0] == pytest.approx(started + 0.005)  # bounded by the window
    assert results == {name: name for name in "abcd"}


@pytest.mark.trio
@pytest.mark.parametrize("window_s", [0.005, 0.0])
async def test_a_lone_call_waits_the_window_and_no_longer(
    autojump_clock: Any, window_s: float
) -> None:
    hooks = _hooks()
    window = BatchWindow(hooks, window_s=window_s)  # type: ignore[arg-type]
    started = anyio.current_time()
    async with window.running():
        await _send(window, "a", {})
    assert hooks.batches == [(pytest.approx(started + window_s), ["a"])]  # 0: never waits


@pytest.mark.trio
async def test_a_batch_as_large_as_the_slots_left_closes_without_waiting(
    autojump_clock: Any,
) -> None:
    hooks = _hooks(rounds=1, reserved=3)  # one slot, one round left
    window = BatchWindow(hooks, window_s=3600.0)  # type: ignore[arg-type]
    started = anyio.current_time()
    async with window.running():
        await _send(window, "a", {})
    assert hooks.batches == [(pytest.approx(started), ["a"])]


def _usage(folder: Path, run_id: str) -> tuple[int, int]:
    with contextlib.closing(sqlite3.connect(folder / "ledger.db")) as ledger:
        found = ledger.execute("select rounds, reserved from runs where run_id = ?",
                               (ledger_id(run_id),)).fetchone()
    return found[0], found[1]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the client's loop; the server runs on each loop in its own process


@pytest.mark.anyio
@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("size", [3, 4, 6])
async def test_a_stdio_burst_of_a_fresh_run_shares_one_round(
    tmp_path: Path, server_backend: str, size: int
) -> None:
    async with recall_server(tmp_path):
        pass  # seeded
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLBOUND_")}
    env.update(RECALLBOUND_LEDGER=str(tmp_path / "ledger.db"),
               RECALLBOUND_STORE=str(tmp_path / "store.db"))
    server = StdioServerParameters(
        command=sys.executable, env=env, cwd=str(tmp_path),
        args=["-m", "runtime_hooks", "mcp", "--principal", "ana", "--scope", "atlas",
              "--backend", server_backend, "--window-ms", "2000"])
    with anyio.fail_after(120):
        async with Client(server) as client:
            for trial in range(2):
                run_id = f"burst-{trial}"
                found: list[str] = []

                async def one(query: str, run_id: str = run_id,
                              found: list[str] = found) -> None:
                    found.append((await search(client, query, run_id=run_id))["status"])

                async with anyio.create_task_group() as tg:
                    for query in QUERIES[:size]:
                        tg.start_soon(one, query)
                granted = min(size, 4)
                assert sorted(found) == ["ok"] * granted + ["refused"] * (size - granted)
                assert _usage(tmp_path, run_id) == (1, granted)  # one round for the burst
                after = await search(client, "rollback runbook", run_id=run_id)
                if granted < 4:  # the run's second round takes the slot left
                    assert after["status"] == "ok"
                    assert _usage(tmp_path, run_id) == (2, granted + 1)
                else:
                    assert after["status"] == "refused"
                    assert after["refusal"]["reason"] == "slots"


# The SDK's HTTP client (httpx2) leaves its SSE async generators to the garbage collector;
# that is the client library's own cleanup, not the server's.
@pytest.mark.anyio
@pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning")
async def test_an_http_burst_of_a_fresh_run_shares_one_round(tmp_path: Path) -> None:
    from .test_mcp_transports import TOKEN, _http_client, _http_server, _seeded

    await _seeded(tmp_path)
    async with _http_server(tmp_path, "127.0.0.1", "--window-ms", "2000") as (url, _):
        with anyio.fail_after(120):
            async with _http_client(url, TOKEN) as client:
                found: list[str] = []

                async def one(query: str) -> None:
                    found.append((await search(client, query, run_id="burst-http"))["status"])

                async with anyio.create_task_group() as tg:
                    for query in QUERIES[:3]:
                        tg.start_soon(one, query)
                assert found == ["ok"] * 3
                assert _usage(tmp_path, "burst-http") == (1, 3)
