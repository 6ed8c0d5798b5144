"""The stdio short path for tool calls: on a connection that opens in the 2026-07-28 era, a
``tools/call`` is answered without the SDK's dispatch, with the very bytes the SDK would have
written; everything else, and every call while the SDK has something to add, goes to the SDK;
a cancelled call is never answered; a call cut short by shutdown is answered "Connection closed".

In process, the server is fed lines through the stdio reader (:func:`read_lines`) exactly as
``recallbound mcp`` feeds it, minus the file descriptors; a real server process on asyncio and
on trio is driven the same way at the end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.memory import MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from plugin import ManualClock, SqliteLedger
from runtime_hooks.mcp import Caller, RecallServer
from runtime_hooks.mcp.identity import ledger_run_id
from runtime_hooks.mcp.lane import FastLane
from runtime_hooks.mcp.wire import LineWriter, read_lines

from ._calls_env import WALL, Counting, P, S, recall_hooks
from ._mcp_env import recall_server, server_process

pytestmark = pytest.mark.anyio

ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}


def request(request_id: object, method: str, params: dict[str, Any] | None = None,
            **meta: object) -> bytes:
    """One modern-era request line (the envelope in ``_meta``, with ``meta`` beside it)."""
    body = dict(params or {})
    body["_meta"] = {**ENVELOPE, **{f"recallbound/{k}": v for k, v in meta.items()}}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                       "params": body}).encode()


def tool_call(request_id: object, name: str, arguments: object, **meta: object) -> bytes:
    return request(request_id, "tools/call", {"name": name, "arguments": arguments}, **meta)


class Lines:
    """What the server wrote, line by line."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self._grew = anyio.Event()

    broken = False
    """Set: every write fails as a pipe whose reader is gone does."""
    failed = 0
    """Writes that failed so."""

    async def write(self, data: bytes) -> None:
        if self.broken:
            self.failed += 1
            raise BrokenPipeError("the client is gone")
        self.lines.append(data)
        self._grew.set()
        self._grew = anyio.Event()

    async def send(self, item: bytes, /) -> None:  # the reader's own answers
        await self.write(item)

    def answers(self) -> dict[object, dict[str, Any]]:
        found = (json.loads(line) for line in self.lines)
        return {answer.get("id"): answer for answer in found}

    async def answer(self, request_id: object) -> dict[str, Any]:
        with anyio.fail_after(10):
            while request_id not in self.answers():
                await self._grew.wait()
        return self.answers()[request_id]


class Connection:
    """One client connection to ``server``: lines in through the stdio reader, lines out."""

    def __init__(self, chunks: MemoryObjectSendStream[bytes], out: Lines,
                 lane: FastLane | None) -> None:
        self._chunks, self.out, self.lane, self.taken = chunks, out, lane, 0

    def take(self, message: SessionMessage) -> bool:
        took = self.lane is not None and self.lane.take(message)
        self.taken += took
        return took

    async def send(self, line: bytes) -> None:
        await self._chunks.send(line + b"\n")

    async def ask(self, line: bytes) -> dict[str, Any]:
        await self.send(line)
        return await self.out.answer(json.loads(line)["id"])

    async def close(self) -> None:
        await self._chunks.aclose()


@asynccontextmanager
async def connection(server: RecallServer, *, lane: bool = True) -> AsyncIterator[Connection]:
    chunks, arriving = anyio.create_memory_object_stream[bytes](64)
    out = Lines()
    writer = LineWriter(out.write)
    to_server, from_wire = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    conn = Connection(chunks, out, FastLane(server) if lane else None)

    async def read() -> bytes:
        try:
            return await arriving.receive()
        except anyio.EndOfStream:
            return b""

    async with arriving, anyio.create_task_group() as tasks:
        tasks.start_soon(partial(read_lines, read, to_server, out, intercept=conn.take))
        tasks.start_soon(partial(server.serve, from_wire, writer, lane=conn.lane))
        try:
            yield conn
        finally:
            await conn.close()


SEQUENCE = [
    request(1, "server/discover"),
    request(2, "tools/list"),
    tool_call(3, "search_memory", {"query": "invoice backfill dry-run"}, run_id="r1",
              call_id="c1"),
    tool_call(4, "search_memory", {"query": "currency rounding rule"}, run_id="r1",
              call_id="c2"),
    tool_call(5, "search_memory", {"query": "invoice backfill dry-run"}, run_id="r1",
              call_id="c1"),  # the same call again: answered from its record
    tool_call(6, "search_memory", {"query": 5}, run_id="r1"),
    tool_call(7, "no_such_tool", {}, run_id="r1"),
    tool_call(8, "recall_context", {"current_request": "Continue"}, run_id="r2"),
    tool_call(9, "remember", {"text": "The cutover is on Friday.", "id": "m-cutover"}),
    tool_call(10, "forget", {"id": "m-cutover"}),
    tool_call(11, "search_memory", {"query": "cutover"}, run_id="r3", call_id=""),
    request(12, "tools/call", {"arguments": {}}),  # no name: the SDK's error
    json.dumps({"jsonrpc": "2.0", "id": 13, "method": "tools/call", "params": {
        "name": "search_memory", "arguments": {"query": "x"},
        "_meta": {**ENVELOPE, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}}}
    ).encode(),  # a version nobody serves: the SDK's error
]
TAKEN = 9  # requests 3 to 11


async def _answers(folder: Path, *, lane: bool) -> tuple[list[bytes], int]:
    folder.mkdir()
    async with recall_server(folder) as server, connection(server, lane=lane) as conn:
        for line in SEQUENCE:
            await conn.ask(line)
    return conn.out.lines, conn.taken


async def test_the_lane_writes_the_very_lines_the_sdk_writes(tmp_path: Path) -> None:
    through_sdk, none = await _answers(tmp_path / "sdk", lane=False)
    through_lane, taken = await _answers(tmp_path / "lane", lane=True)
    assert (none, taken) == (0, TAKEN)
    assert through_lane == through_sdk
    answers = [json.loads(line) for line in through_lane]
    assert answers[2]["result"]["structuredContent"]["status"] == "ok"
    assert answers[5]["result"]["structuredContent"]["status"] == "invalid"
    assert [answer["error"]["code"] for answer in answers[-2:]] == [-32602, -32022]


class Waiting(Counting):
    """A retriever whose searches wait for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = anyio.Event()
        self.release = anyio.Event()
        self.finished = 0

    async def search(self, request: Any) -> list[Any]:
        self.entered.set()
        await self.release.wait()
        found = await super().search(request)
        self.finished += 1
        return found


@asynccontextmanager
async def waiting_server(folder: Path) -> AsyncIterator[tuple[RecallServer, Waiting]]:
    retriever = Waiting()
    async with SqliteLedger(folder / "ledger.db") as ledger:
        hooks = recall_hooks(ledger, ManualClock(WALL), retriever)
        yield RecallServer(hooks, caller=Caller(principal=P, scope=S)), retriever


async def test_a_cancelled_call_is_never_answered_and_its_round_runs_on(tmp_path: Path) -> None:
    async with waiting_server(tmp_path) as (server, retriever):
        async with connection(server) as conn:
            await conn.ask(request(0, "tools/list"))  # the first request is the SDK's
            await conn.send(tool_call(1, "search_memory", {"query": "cutover"}, run_id="r",
                                      call_id="c"))
            await retriever.entered.wait()
            await conn.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                        "params": {"requestId": 1}}).encode())
            # The reader takes lines in order: once a later request is answered, the
            # cancellation was taken, and the search has not ended.
            assert "result" in await conn.ask(request(5, "tools/list"))
            retriever.release.set()
            with anyio.fail_after(10):
                while not retriever.finished:
                    await anyio.sleep(0.01)
            assert "result" in await conn.ask(request(2, "tools/list")), conn.out.lines
            assert conn.taken == 1
            assert 1 not in conn.out.answers()
        [record] = await server.hooks.allowance.ledger.recorded_calls(
            ledger_run_id("r", principal=P, scope=S), ["c"])
        assert record.call_id == "c"  # the round ran on and recorded its call


async def test_a_call_cut_short_by_shutdown_is_answered_connection_closed(
    tmp_path: Path,
) -> None:
    async with waiting_server(tmp_path) as (server, retriever):
        async with connection(server) as conn:
            await conn.send(tool_call(1, "search_memory", {"query": "cutover"}, run_id="r"))
            await retriever.entered.wait()
            await conn.close()  # the client goes away mid-search
        assert conn.out.answers()[1]["error"]["message"] == "Connection closed"


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "sdk"])
async def test_a_client_gone_before_its_answer_leaves_the_server_serving(
    tmp_path: Path, lane: bool,
) -> None:
    async with waiting_server(tmp_path) as (server, retriever):
        async with connection(server, lane=lane) as conn:
            await conn.send(tool_call(1, "search_memory", {"query": "cutover"}, run_id="r"))
            await retriever.entered.wait()
            conn.out.broken = True  # the reader of the server's output went away
            retriever.release.set()
            with anyio.fail_after(10):
                while not conn.out.failed:  # the answer's write
                    await anyio.sleep(0.01)
            assert retriever.finished
            conn.out.broken = False
            assert "result" in await conn.ask(request(2, "tools/list"))
        assert 1 not in conn.out.answers()


async def test_a_handshake_connection_is_served_by_the_sdk(tmp_path: Path) -> None:
    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "search_memory", "arguments": {"query": "cutover date"}}}
    async with recall_server(tmp_path) as server, connection(server) as conn:
        await conn.ask(json.dumps(initialize).encode())
        await conn.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        answer = await conn.ask(json.dumps(call).encode())
        # a 2026-era request on a handshake connection is the SDK's to refuse
        refused = await conn.ask(tool_call(2, "search_memory", {"query": "cutover date"}))
    assert answer["result"]["structuredContent"]["status"] == "ok"
    assert refused["error"]["code"] == -32600
    assert conn.taken == 0


class Recording:
    """An SDK middleware that notes the methods it sees."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        self.methods.append(ctx.method)
        return await call_next(ctx)


async def test_a_middleware_sees_every_call(tmp_path: Path) -> None:
    recording = Recording()
    async with recall_server(tmp_path) as server, connection(server) as conn:
        server.server.middleware.append(recording)
        answer = await conn.ask(tool_call(1, "search_memory", {"query": "cutover date"}))
    assert answer["result"]["structuredContent"]["status"] == "ok"
    assert (recording.methods, conn.taken) == (["tools/call"], 0)


async def test_a_tracer_provider_gets_its_span(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", TracerProvider)
    async with recall_server(tmp_path) as server, connection(server) as conn:
        answer = await conn.ask(tool_call(1, "search_memory", {"query": "cutover date"}))
    assert answer["result"]["structuredContent"]["status"] == "ok"
    assert conn.taken == 0


@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
async def test_a_server_process_answers_modern_calls_and_cancellations(
    tmp_path: Path, server_backend: str,
) -> None:
    lines = [tool_call(i, "search_memory", {"query": "invoice backfill dry-run"},
                       run_id="burst", call_id=f"c{i}") for i in range(1, 4)]
    lines.append(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": 99}}).encode())  # not in flight
    lines.append(request(5, "tools/list"))
    async with server_process(tmp_path, server_backend) as process:
        assert process.stdin is not None and process.stdout is not None
        await process.stdin.send(b"\n".join(lines) + b"\n")
        buffer = b""
        with anyio.fail_after(30):
            while buffer.count(b"\n") < 4:
                buffer += await process.stdout.receive()
    answers = {answer["id"]: answer for answer in map(json.loads, buffer.splitlines())}
    assert sorted(answers) == [1, 2, 3, 5]
    statuses = [answers[i]["result"]["structuredContent"]["status"] for i in (1, 2, 3)]
    assert statuses == ["ok", "ok", "ok"]  # one burst, one round, three slots


async def test_a_connection_that_opens_with_a_call_keeps_the_era_the_sdk_would_pick(
    tmp_path: Path,
) -> None:
    """The SDK picks a connection's era from the first request it sees: the lane leaves it
    the first one, so a later request without an envelope cannot make it pick another."""
    sequence = [
        tool_call(1, "search_memory", {"query": "invoice backfill dry-run"}, run_id="r1"),
        json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"}).encode(),  # no envelope
        request(3, "tools/list"),
    ]

    async def answers(folder: Path, lane: bool) -> list[Any]:
        folder.mkdir()
        async with recall_server(folder) as server, connection(server, lane=lane) as conn:
            return [await conn.ask(line) for line in sequence]

    through_sdk = await answers(tmp_path / "sdk", False)
    through_lane = await answers(tmp_path / "lane", True)
    assert "result" in through_sdk[2]
    assert [sorted(a) for a in through_lane] == [sorted(a) for a in through_sdk]
