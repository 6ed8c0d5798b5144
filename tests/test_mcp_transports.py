"""The MCP server as a client launches it: a real subprocess over stdio (on asyncio and on
trio), two server processes on one SQLite ledger, and streamable HTTP with and without a
bearer token. Every server process is bounded: stdio ends when its client leaves, the HTTP
server is terminated by the test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from plugin import errors
from runtime_hooks.mcp.errors import McpSessionError

from ._mcp_env import QUERIES, recall_server, search, structured

pytestmark = pytest.mark.anyio

TOKEN = "t0ken-for-ana-0123456789abcdef"
BO_TOKEN = "t0ken-for-bo-0123456789abcdef"


def _env(folder: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLBOUND_")}
    return {**env, "RECALLBOUND_LEDGER": str(folder / "ledger.db"),
            "RECALLBOUND_STORE": str(folder / "store.db"), **extra}


def _stdio(folder: Path, backend: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "runtime_hooks", "mcp", "--principal", "ana", "--scope", "atlas",
              "--backend", backend, "--window-ms", "1000"],
        env=_env(folder), cwd=str(folder),
    )


async def _seeded(folder: Path) -> None:
    async with recall_server(folder):
        pass


async def _parallel(client: Client, queries: tuple[str, ...], run_id: str) -> list[str]:
    found: list[str] = []

    async def one(query: str) -> None:
        found.append((await search(client, query, run_id=run_id))["status"])

    async with anyio.create_task_group() as tg:
        for query in queries:
            tg.start_soon(one, query)
    return sorted(found)


async def _usage(folder: Path, run_id: str) -> tuple[int, int]:
    async with recall_server(folder, seeded=False) as server:
        found = await server.hooks.allowance.ledger.usage(run_id)
    return found.rounds, found.reserved


@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
async def test_stdio_subprocess_serves_searches_and_refusals(
    tmp_path: Path, server_backend: str
) -> None:
    await _seeded(tmp_path)
    with anyio.fail_after(120):
        async with Client(_stdio(tmp_path, server_backend)) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert names == ["search_memory", "recall_context"]
            statuses = await _parallel(client, QUERIES, "run-stdio")
            hit = await search(client, "invoice backfill dry-run")  # the session's own run
    assert statuses == ["ok"] * 4 + ["refused"] * 2
    assert hit["status"] == "ok" and "m-backfill" in hit["evidence_ids"]
    rounds, reserved = await _usage(tmp_path, "run-stdio")
    assert rounds <= 2 and reserved == 4


async def test_two_server_processes_share_one_runs_allowance(tmp_path: Path) -> None:
    await _seeded(tmp_path)
    with anyio.fail_after(120):
        async with Client(_stdio(tmp_path, "asyncio")) as first, \
                Client(_stdio(tmp_path, "asyncio")) as second:
            assert (await search(first, "cutover date", run_id="run-fleet"))["status"] == "ok"
            statuses = await _parallel(second, QUERIES, "run-fleet")
            late = await search(first, "deploy window", run_id="run-fleet")
    assert statuses == ["ok"] * 3 + ["refused"] * 3
    assert late["status"] == "refused"
    assert await _usage(tmp_path, "run-fleet") == (2, 4)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@asynccontextmanager
async def _http_server(folder: Path) -> AsyncIterator[str]:
    port = _free_port()
    tokens = json.dumps([
        {"token": TOKEN, "principal": "ana", "scope": "atlas"},
        {"token": BO_TOKEN, "principal": "bo", "scope": "atlas"},
    ])
    process = await anyio.open_process(
        [sys.executable, "-m", "runtime_hooks", "mcp", "--http", f"127.0.0.1:{port}"],
        env=_env(folder, RECALLBOUND_MCP_TOKENS=tokens), cwd=str(folder),
    )
    try:
        with anyio.fail_after(60):
            while True:
                try:
                    stream = await anyio.connect_tcp("127.0.0.1", port)
                except OSError:
                    await anyio.sleep(0.05)
                    continue
                await stream.aclose()
                break
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        with anyio.fail_after(30):
            await process.wait()
        await process.aclose()


@asynccontextmanager
async def _http_client(url: str, token: str, **kw: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http, \
            Client(streamable_http_client(url, http_client=http), **kw) as client:
        yield client


# The SDK's HTTP client (httpx2) under trio leaves its SSE async generators to the garbage
# collector; that is the client library's own cleanup, not the server's.
@pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning")
async def test_http_with_a_token_serves_and_without_one_is_rejected(tmp_path: Path) -> None:
    await _seeded(tmp_path)
    async with _http_server(tmp_path) as url:
        with anyio.fail_after(120):
            async with httpx2.AsyncClient() as raw:
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
                headers = {"Accept": "application/json, text/event-stream"}
                for auth in ({}, {"Authorization": "Bearer wrong-token-0123456789abcdef"}):
                    answer = await raw.post(url, json=body, headers={**headers, **auth})
                    assert answer.status_code == 401
                    assert TOKEN not in answer.text
            async with _http_client(url, TOKEN) as client:
                hit = await search(client, "invoice backfill dry-run", run_id="run-http")
                assert hit["status"] == "ok" and "m-backfill" in hit["evidence_ids"]
                # stateless HTTP has no session: a call must name its run
                nameless = await client.call_tool("search_memory", {"query": "cutover"})
                assert structured(nameless)["error"] == McpSessionError.__name__
            async with _http_client(url, BO_TOKEN) as client:  # another caller, same run id
                stolen = await client.call_tool("search_memory", {"query": "cutover"},
                                                meta={"recallbound/run_id": "run-http"})
                assert structured(stolen)["error"] == errors.RunIdentityError.__name__
                mine = await search(client, "backfill dry-run budget", run_id="run-bo")
                assert mine["status"] == "ok" and mine["evidence_ids"] == ["m-foreign"]
            async with _http_client(url, TOKEN, mode="legacy") as client:  # a session: one run
                first = await search(client, "cutover date")
                second = await search(client, "deploy window")
                third = await search(client, "rollback runbook")
                assert [first["status"], second["status"], third["status"]] == [
                    "ok", "ok", "refused"]
    assert await _usage(tmp_path, "run-http") == (1, 1)


def test_the_example_launches_the_server_and_prints_evidence_and_a_refusal() -> None:
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLBOUND_")}
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "mcp_client.py")],
        capture_output=True, text=True, timeout=120, env=env, check=True,
    )
    assert "[memory m-backfill]" in done.stdout  # recall_context's evidence
    assert done.stdout.count(": evidence [") == 2 and done.stdout.count(": refused (") == 4
    assert "not evidence that no memory exists" in done.stdout
