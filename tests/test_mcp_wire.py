"""Every request over stdio gets an answer: a real server process on asyncio and on trio, fed
malformed lines by hand (as a buggy or hostile client would), keeps serving after each; and a
line past the size cap is answered without being read whole."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from runtime_hooks.mcp.wire import _TOKEN, MAX_LINE_BYTES, read_message, scan

from ._mcp_env import server_process

pytestmark = pytest.mark.anyio

INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "raw", "version": "1"}}}


class Raw:
    """A hand-driven stdio client: send raw lines, read answer lines."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.buffer = b""

    async def send(self, line: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(line + b"\n")

    async def answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while b"\n" not in self.buffer:
            self.buffer += await self.process.stdout.receive()
        line, _, self.buffer = self.buffer.partition(b"\n")
        found: dict[str, Any] = json.loads(line)
        return found


@asynccontextmanager
async def raw_server(folder: Path, backend: str) -> AsyncIterator[Raw]:
    async with server_process(folder, backend) as process:
        raw = Raw(process)
        await raw.send(json.dumps(INITIALIZE).encode())
        assert (await raw.answer())["id"] == 0
        await raw.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        yield raw


MALFORMED = [
    (b"{not json", None, -32700),
    (b'\xff\xfe{"jsonrpc":"2.0","id":8,"method":"tools/list"}', 8, -32700),
    (b'{"jsonrpc":"2.0","id":2,"method":"tools/list","params":[1]}', 2, -32602),
    # params null is no object either (the SDK's model reads it as absent and runs the method);
    # the second line takes the slower parse (an escaped "NaN" in a string)
    (b'{"jsonrpc":"2.0","id":10,"method":"tools/list","params":null}', 10, -32602),
    (b'{"jsonrpc":"2.0","id":11,"method":"tools/list","params":null,"x":"NaN"}', 11, -32602),
    (b'{"jsonrpc":"2.0","id":"three"}', "three", -32600),
    (b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"search_memory",'
     b'"arguments":{"query":"\\ud800"}}}', 4, -32602),
    (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"search_memory",'
     b'"arguments":{"query":' + b"[" * 50_000 + b"]" * 50_000 + b"}}}", 5, -32600),
    (b"[" * 50_000 + b"]" * 50_000, None, -32600),
    (b"[1, 2]", None, -32600),
    (b'"just a string"', None, -32600),
    (b'{"jsonrpc":"1.0","id":6,"method":"tools/list"}', 6, -32600),
    # an id MCP does not allow: answered with id null, the method never run (the SDK's parser
    # would take the request for a notification)
    *((b'{"jsonrpc":"2.0","id":' + bad + b',"method":"tools/call","params":{"name":'
       b'"search_memory","arguments":{"query":"deploy"}}}', None, -32600)
      for bad in (b'{"a":1}', b"[1]", b"null", b"1.5", b"true")),
    (b'{"jsonrpc":"2.0","id":7,"method":"no/such/method","params":{}}', 7, -32601),
    (b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"arguments":{}}}', 9, -32602),
]


@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
async def test_every_malformed_request_is_answered_and_the_server_keeps_serving(
    tmp_path: Path, server_backend: str
) -> None:
    with anyio.fail_after(120):
        async with raw_server(tmp_path, server_backend) as raw:
            for number, (line, request_id, code) in enumerate(MALFORMED):
                await raw.send(line)
                answer = await raw.answer()
                assert (answer["id"], answer["error"]["code"]) == (request_id, code), line[:80]
                await raw.send(json.dumps({"jsonrpc": "2.0", "id": 100 + number,
                                           "method": "tools/list"}).encode())
                listed = await raw.answer()
                assert listed["id"] == 100 + number and len(listed["result"]["tools"]) == 4


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
async def test_a_200_mb_line_is_answered_without_being_read_whole(
    tmp_path: Path, server_backend: str
) -> None:
    with anyio.fail_after(300):
        async with raw_server(tmp_path, server_backend) as raw:
            assert raw.process.stdin is not None
            before = _peak_rss_kib(raw.process.pid)
            await raw.process.stdin.send(b'{"jsonrpc":"2.0","id":1,"method":"tools/list",'
                                         b'"params":{"x":"')
            block = b"a" * (1024 * 1024)
            for _ in range(200):
                await raw.process.stdin.send(block)
            await raw.send(b'"}}')
            answer = await raw.answer()
            assert answer["id"] == 1 and answer["error"]["code"] == -32600
            assert str(MAX_LINE_BYTES) in answer["error"]["message"]
            await raw.send(b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}')
            assert (await raw.answer())["id"] == 2
            grown_mib = (_peak_rss_kib(raw.process.pid) - before) / 1024
            assert grown_mib < 32, grown_mib  # the cap (4 MiB) and a chunk, not 200 MB


def test_a_string_left_open_is_one_token_to_the_end_of_the_line() -> None:
    # A line cut at the cap, or one that never closes its string, is read once: the open
    # string runs to the end of the line. Were it tried again from each escaped quote inside
    # it, a line of escaped quotes would cost the square of its length.
    assert [m.group(0) for m in _TOKEN.finditer(b'{"id": 4, "t": "a\\"b\\"c')] == [
        b"{", b'"id":', b'"t":', b'"a\\"b\\"c']
    assert [m.group(0) for m in _TOKEN.finditer(b'"x\\')] == [b'"x\\']
    line = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"t": "' \
        + b'\\"' * 200_000
    assert scan(line, 64) == (True, 7)
    answer = read_message(line)
    assert isinstance(answer, bytes)
    assert json.loads(answer)["id"] == 7


def test_the_scanner_reads_the_top_level_id_only() -> None:
    assert scan(b'{"params":{"id":1},"id":"x"}', 64) == (True, "x")
    assert scan(b'{"id": 12, "method": "a"', 64) == (True, 12)
    assert scan(b'{"id": true}', 64) == (True, None)
    assert scan(b'{"a":"[[[[", "id": 3}', 2) == (True, 3)  # brackets in strings do not nest
    assert scan(b'{"id": 3, "a": [[[]]]}', 2) == (False, 3)
    assert read_message(b"   ") is None
