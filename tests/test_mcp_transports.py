"""The MCP server as a client launches it: a real subprocess over stdio (on asyncio and on
trio), two server processes on one SQLite ledger, and streamable HTTP with and without a
bearer token. Every server process is bounded: stdio ends when its client leaves, the HTTP
server is terminated by the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.streams.text
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from runtime_hooks.mcp import Caller

from ._mcp_env import QUERIES, ledger_id, recall_server, search

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


async def _usage(folder: Path, run_id: str, principal: str = "ana") -> tuple[int, int]:
    async with recall_server(folder, seeded=False) as server:
        found = await server.hooks.allowance.ledger.usage(
            ledger_id(run_id, Caller(principal=principal, scope="atlas")))
    return found.rounds, found.reserved


@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
async def test_stdio_subprocess_serves_searches_and_refusals(
    tmp_path: Path, server_backend: str
) -> None:
    await _seeded(tmp_path)
    with anyio.fail_after(120):
        async with Client(_stdio(tmp_path, server_backend)) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert names == ["search_memory", "recall_context", "remember", "forget"]
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


async def test_a_call_resent_to_another_stdio_process_answers_from_the_ledger(
    tmp_path: Path,
) -> None:
    await _seeded(tmp_path)
    meta = {"recallbound/run_id": "run-resend", "recallbound/call_id": "call-1"}
    found = []
    with anyio.fail_after(120):
        for _ in range(2):  # a reconnect: a new server process, the same ledger
            async with Client(_stdio(tmp_path, "asyncio")) as client:
                result = await client.call_tool("search_memory", {"query": "cutover date"},
                                                meta=meta)
            assert result.structured_content is not None
            found.append(result.structured_content)
            if len(found) == 1:
                assert await _usage(tmp_path, "run-resend") == (1, 1)
    assert [f["status"] for f in found] == ["ok", "ok"]
    assert found[0]["evidence_ids"] and found[1]["evidence_ids"] == found[0]["evidence_ids"]
    assert await _usage(tmp_path, "run-resend") == (1, 1)  # nothing reserved again


@asynccontextmanager
async def _http_server(folder: Path, bind: str = "127.0.0.1",
                       *extra: str) -> AsyncIterator[tuple[str, list[str]]]:
    """A server process on ``bind`` (a free port); yields its URL and its stderr lines."""
    tokens = json.dumps([
        {"token": TOKEN, "principal": "ana", "scope": "atlas"},
        {"token": BO_TOKEN, "principal": "bo", "scope": "atlas"},
    ])
    process = await anyio.open_process(
        [sys.executable, "-m", "runtime_hooks", "mcp", "--http", f"{bind}:0", *extra],
        env=_env(folder, RECALLBOUND_MCP_TOKENS=tokens), cwd=str(folder),
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        buffered = anyio.streams.text.TextReceiveStream(process.stderr)
        text = ""
        with anyio.fail_after(60):
            while "/mcp\n" not in text:
                text += await buffered.receive()
        lines.extend(text.splitlines())
        url = lines[-1].rsplit(" at ", 1)[1]
        port = url.rsplit(":", 1)[1].split("/")[0]
        yield f"http://127.0.0.1:{port}/mcp", lines
    finally:
        process.terminate()
        with anyio.fail_after(30):
            await process.wait()
        await process.aclose()


@asynccontextmanager
async def _http_client(url: str, token: str, headers: dict[str, str] | None = None,
                       **kw: Any) -> AsyncIterator[Client]:
    sent = {"Authorization": f"Bearer {token}", **(headers or {})}
    async with httpx2.AsyncClient(headers=sent) as http, \
            Client(streamable_http_client(url, http_client=http), **kw) as client:
        yield client


# The SDK's HTTP client (httpx2) under trio leaves its SSE async generators to the garbage
# collector; that is the client library's own cleanup, not the server's.
@pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning")
async def test_http_with_a_token_serves_and_without_one_is_rejected(tmp_path: Path) -> None:
    await _seeded(tmp_path)
    async with _http_server(tmp_path) as (url, _):
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
            async with _http_client(url, BO_TOKEN) as client:  # another caller, same run id:
                for query in ("cutover date", "deploy window"):  # bo's own run, no squatting
                    mine = await search(client, query, run_id="run-http")
                    assert mine["status"] == "ok"
                mine = await search(client, "backfill dry-run budget", run_id="run-bo")
                assert mine["status"] == "ok" and mine["evidence_ids"] == ["m-foreign"]
            async with _http_client(url, TOKEN, mode="legacy") as client:  # a session: one run
                first = await search(client, "cutover date")
                second = await search(client, "deploy window")
                third = await search(client, "rollback runbook")
                assert [first["status"], second["status"], third["status"]] == [
                    "ok", "ok", "refused"]
    assert await _usage(tmp_path, "run-http") == (1, 1)  # ana's run, untouched by bo
    assert await _usage(tmp_path, "run-http", "bo") == (2, 2)


# The SDK's HTTP client (httpx2) under trio leaves its SSE async generators to the garbage
# collector; that is the client library's own cleanup, not the server's.
@pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning")
async def test_stateless_http_has_one_current_run_per_caller_and_session_ids_name_none(
    tmp_path: Path,
) -> None:
    await _seeded(tmp_path)
    async with _http_server(tmp_path) as (url, _):
        with anyio.fail_after(120):
            # stateless HTTP: every request is on its own; made-up session ids change nothing
            statuses = []
            for n, query in enumerate(("cutover date", "deploy window", "rollback runbook")):
                forged = {"Mcp-Session-Id": f"made-up-{n}"}
                async with _http_client(url, TOKEN, headers=forged) as client:
                    statuses.append((await search(client, query))["status"])
            assert statuses == ["ok", "ok", "refused"]  # one current run: two rounds
            # bo sends the same made-up ids: his own current run, never ana's
            for n in range(2):
                async with _http_client(url, BO_TOKEN,
                                        headers={"Mcp-Session-Id": f"made-up-{n}"}) as client:
                    assert (await search(client, "cutover date"))["status"] == "ok"
            async with httpx2.AsyncClient() as raw:  # a forged session id on the handshake
                answer = await raw.post(url, json={"jsonrpc": "2.0", "id": 1,
                                                   "method": "tools/list", "params": {}},
                                        headers={"Accept": "application/json, text/event-stream",
                                                 "Authorization": f"Bearer {BO_TOKEN}",
                                                 "Mcp-Session-Id": "made-up-0"})
                assert answer.status_code == 404


# The SDK's HTTP client (httpx2) under trio leaves its SSE async generators to the garbage
# collector; that is the client library's own cleanup, not the server's.
@pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning")
async def test_stateless_http_gives_a_caller_one_current_run_across_two_server_processes(
    tmp_path: Path,
) -> None:
    """Behind a load balancer a caller's requests reach any server: the (principal, scope)'s
    current run is the ledger's, so two servers on one ledger give it one run's two rounds."""
    await _seeded(tmp_path)
    async with _http_server(tmp_path) as (one, _), _http_server(tmp_path) as (two, _):
        with anyio.fail_after(120):
            statuses = []
            for url, query in ((one, "cutover date"), (two, "deploy window"),
                               (one, "rollback runbook"), (two, "invoice backfill")):
                async with _http_client(url, TOKEN) as client:
                    statuses.append((await search(client, query))["status"])
    assert statuses == ["ok", "ok", "refused", "refused"]


def test_the_example_launches_the_server_and_prints_evidence_and_a_refusal() -> None:
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLBOUND_")}
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "mcp_client.py")],
        capture_output=True, text=True, timeout=120, env=env, check=True,
    )
    assert "[memory m-backfill]" in done.stdout  # recall_context's evidence
    assert done.stdout.count(": evidence [") == 2 and done.stdout.count(": refused\n") == 4
    assert "a search after them: refused (rounds)" in done.stdout
    assert "not evidence that no memory exists" in done.stdout


@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
async def test_stdio_without_a_run_id_gets_four_searches_then_a_fresh_run_after_the_deadline(
    tmp_path: Path, server_backend: str
) -> None:
    await _seeded(tmp_path)
    params = _stdio(tmp_path, server_backend)
    params.env = {**(params.env or {}), "RECALLBOUND_POLICY_DEADLINE_S": "2"}  # tighter: allowed
    with anyio.fail_after(120):
        async with Client(params) as client:
            found: list[str] = []

            async def one(query: str) -> None:
                found.append((await search(client, query))["status"])

            async with anyio.create_task_group() as tg:
                for query in QUERIES[:5]:
                    tg.start_soon(one, query)
            assert sorted(found) == ["ok"] * 4 + ["refused"]
            assert (await search(client, QUERIES[5]))["status"] == "refused"
            await anyio.sleep(2.1)  # the run's deadline passes; the next call opens a new run
            fresh = await search(client, "invoice backfill dry-run")
            assert fresh["status"] == "ok" and "m-backfill" in fresh["evidence_ids"]


async def test_the_runs_per_hour_cap_holds_across_two_server_processes(tmp_path: Path) -> None:
    await _seeded(tmp_path)
    (tmp_path / "recallbound.toml").write_text("[mcp]\nmax_runs_per_hour = 2\n")
    with anyio.fail_after(120):
        async with Client(_stdio(tmp_path, "asyncio")) as first, \
                Client(_stdio(tmp_path, "asyncio")) as second:
            assert (await search(first, "cutover date", run_id="run-1"))["status"] == "ok"
            assert (await search(second, "cutover date", run_id="run-2"))["status"] == "ok"
            for client in (first, second):
                for run_id in ("run-3", None):
                    refused = await search(client, "deploy window", run_id=run_id)
                    assert refused["status"] == "refused"
                    assert refused["refusal"]["reason"] == "run_rate"
                    assert "bounded" in refused["content"]
            assert (await search(first, "deploy window", run_id="run-2"))["status"] == "ok"


# The SDK's HTTP client (httpx2) under trio leaves its SSE async generators to the garbage
# collector; that is the client library's own cleanup, not the server's.
@pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning")
@pytest.mark.parametrize("bind", ["0.0.0.0", "127.0.0.1"])
async def test_host_and_origin_are_checked_on_every_bind(tmp_path: Path, bind: str) -> None:
    await _seeded(tmp_path)
    extra = ("--allow-host", "memory.example.org", "--allow-origin", "https://app.example.org")
    async with _http_server(tmp_path, bind, *extra) as (url, lines):
        port = url.rsplit(":", 1)[1].split("/")[0]
        assert lines[-1].endswith(f"at http://{bind}:{port}/mcp")
        warned = any("warning: serving plain HTTP" in line for line in lines)
        assert warned is (bind == "0.0.0.0")
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "probe", "version": "1"}}}
        base = {"Accept": "application/json, text/event-stream",
                "Authorization": f"Bearer {TOKEN}"}
        with anyio.fail_after(60):
            async with httpx2.AsyncClient() as raw:
                for headers, status in [
                    ({"Host": "evil.example"}, 421),
                    ({"Host": f"evil.example:{port}"}, 421),
                    ({"Origin": "http://evil.example"}, 403),
                    ({"Origin": f"http://evil.example:{port}"}, 403),
                    ({"Host": "memory.example.org"}, 200),
                    ({"Origin": "https://app.example.org"}, 200),
                    ({"Origin": f"http://localhost:{port}"}, 200),
                    ({}, 200),
                ]:
                    answer = await raw.post(url, json=body, headers={**base, **headers})
                    assert answer.status_code == status, (headers, answer.text)


@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
async def test_stdio_remember_and_forget(tmp_path: Path, server_backend: str) -> None:
    await _seeded(tmp_path)
    with anyio.fail_after(120):
        async with Client(_stdio(tmp_path, server_backend)) as client:
            made = await client.call_tool("remember", {"text": "The audit moved to Friday."})
            memory_id = made.structured_content["id"] if made.structured_content else None
            assert isinstance(memory_id, str)
            found = await search(client, "audit moved", run_id="run-write")
            assert memory_id in found["evidence_ids"]
            gone = await client.call_tool("forget", {"id": memory_id})
            assert gone.structured_content == {
                "status": "ok", "id": memory_id, "forgotten": True,
                "content": f"Forgot {memory_id!r}."}
            after = await search(client, "audit moved", run_id="run-write")
            assert memory_id not in after.get("evidence_ids", [])


# The SDK's HTTP client (httpx2) under trio leaves its SSE async generators to the garbage
# collector; that is the client library's own cleanup, not the server's.
@pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning")
async def test_every_malformed_http_request_is_answered_and_the_server_keeps_serving(
    tmp_path: Path,
) -> None:
    await _seeded(tmp_path)
    async with _http_server(tmp_path) as (url, _):
        headers = {"Accept": "application/json, text/event-stream",
                   "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}",
                   "Mcp-Protocol-Version": "2025-06-18"}
        bodies = [
            b"{not json", b'\xff\xfe{"jsonrpc":"2.0","id":1,"method":"initialize"}',
            b'{"jsonrpc":"2.0","id":2,"method":"initialize","params":[1]}',
            b'{"jsonrpc":"2.0","id":3}', b"[" * 50_000 + b"]" * 50_000,
            b'{"jsonrpc":"2.0","id":4,"method":"initialize","params":{"x":"\\ud800"}}',
            b'{"jsonrpc":"2.0","id":5,"method":"initialize","params":{"x":"'
            + b"a" * (5 * 1024 * 1024) + b'"}}',
        ]
        with anyio.fail_after(120):
            async with httpx2.AsyncClient() as raw:
                for body in bodies:
                    answer = await raw.post(url, content=body, headers=headers)
                    assert 400 <= answer.status_code < 500, (body[:40], answer.status_code)
                    if answer.headers.get("content-type", "").startswith("application/json"):
                        assert "error" in answer.json()
            async with _http_client(url, TOKEN) as client:
                hit = await search(client, "invoice backfill dry-run", run_id="run-after")
                assert hit["status"] == "ok"


async def test_a_server_on_a_machine_with_nothing_set_up_starts_and_keeps_its_files(
    tmp_path: Path,
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    # what the SDK's stdio client passes a server by default: no RECALLBOUND_* at all
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "runtime_hooks", "mcp", "--principal", "ana", "--scope", "atlas"],
        env={"HOME": str(home), "PATH": os.environ.get("PATH", "")}, cwd=str(work),
    )
    with anyio.fail_after(120):
        async with Client(params) as client:
            made = await client.call_tool("remember", {"text": "The cutover is on Friday."})
            assert made.structured_content is not None
            found = await search(client, "cutover Friday")
            assert made.structured_content["id"] in found["evidence_ids"]
    folder = home / ".local" / "share" / "recallbound"
    assert sorted(p.name for p in folder.glob("*.db")) == ["ledger.db", "memory.db"]
    assert list(work.iterdir()) == []
