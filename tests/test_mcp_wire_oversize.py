"""A line past the stdio size cap is answered under the id it names, so the client that sent it
is not left waiting: the SDK's own client gets an error for an over-size call (it would wait
for ever on an answer with id null) and the server keeps serving."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters

from runtime_hooks.mcp.wire import MAX_LINE_BYTES

from ._mcp_env import recall_server, search
from .test_mcp_wire_reads import framing, message_id, pipe

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
async def test_an_over_size_call_from_the_sdk_client_gets_an_error_not_a_hang(
    tmp_path: Path, server_backend: str
) -> None:
    async with recall_server(tmp_path):
        pass  # seeded
    (tmp_path / "recallbound.toml").write_text('ledger = "ledger.db"\nstore = "store.db"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLBOUND_")}
    params = StdioServerParameters(
        command=sys.executable,
        cwd=str(tmp_path),
        env=env,
        args=[
            "-m",
            "runtime_hooks",
            "mcp",
            "--principal",
            "ana",
            "--scope",
            "atlas",
            "--backend",
            server_backend,
        ],
    )
    with anyio.fail_after(120):
        async with Client(params) as client:
            with anyio.fail_after(30), pytest.raises(MCPError) as raised:
                await client.call_tool("search_memory", {"query": "x" * (MAX_LINE_BYTES + 1)})
            assert str(MAX_LINE_BYTES) in str(raised.value)
            hit = await search(client, "deploy window", run_id="after-the-big-one")
            assert hit["status"] == "ok" and "m-deploy" in hit["evidence_ids"]


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"x":"', 7),
        (b'{"jsonrpc":"2.0","id":"call-8","method":"tools/call","params":{"x":"', "call-8"),
        (b'{"jsonrpc":"2.0","method":"tools/call","params":{"id":9,"x":"', None),  # not top level
        (b'{"jsonrpc":"2.0","method":"notifications/x","params":{"x":"', None),
        (b'{"jsonrpc":"2.0","id":true,"method":"tools/call","params":{"x":"', None),
    ],
)
@pytest.mark.parametrize("pieces", [1, 8], ids=["one-read", "streamed"])
async def test_a_line_past_the_cap_is_answered_under_the_id_it_names(
    head: bytes, expected: object, pieces: int
) -> None:
    line = head + b"a" * 8 * 1024 + b'"}}\n'
    with pipe() as (read_end, write_end), anyio.fail_after(10):
        async with framing(read_end, max_line_bytes=1024) as (messages, answered, _):
            step = -(-len(line) // pieces)
            for start in range(0, len(line), step):
                os.write(write_end, line[start : start + step])
                await anyio.sleep(0.01)
            os.write(write_end, b'{"jsonrpc":"2.0","id":4,"method":"tools/list"}\n')
            answer = await answered.receive()
            assert isinstance(answer, bytes)
            error = json.loads(answer)
            assert error["id"] == expected and error["error"]["code"] == -32600
            assert "longer than 1024 bytes" in error["error"]["message"]
            assert message_id(await messages.receive()) == 4


async def test_an_id_past_the_head_of_an_over_size_line_is_not_looked_for() -> None:
    line = b'{"jsonrpc":"2.0","params":{"x":"' + b"a" * (256 * 1024) + b'"},"id":5}\n'
    with pipe() as (read_end, write_end), anyio.fail_after(10):
        async with framing(read_end, max_line_bytes=1024) as (_, answered, _source):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(anyio.to_thread.run_sync, os.write, write_end, line)
                answer = await answered.receive()
            assert isinstance(answer, bytes) and json.loads(answer)["id"] is None
