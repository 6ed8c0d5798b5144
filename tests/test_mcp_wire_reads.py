"""How the stdio transport reads and writes its descriptors, in process, on asyncio and trio.

A pipe is read and written from the loop (a non-blocking descriptor of its own, the shared one
left as it was); anything else goes through a worker thread. Either way lines are framed across
reads, a line past the cap is skipped as it streams and answered, and the input may end in the
middle of a line. Lines written by concurrent senders never interleave, and a line once begun
is written whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import pytest
from mcp.shared.message import SessionMessage

from runtime_hooks.mcp.wire import LineWriter, Outgoing, _Descriptor, read_lines

pytestmark = pytest.mark.anyio

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="a pipe is reopened through /proc")


def request(number: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": number, "method": "tools/list"}).encode()


@contextmanager
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    try:
        yield read_end, write_end
    finally:
        for fd in (read_end, write_end):
            with contextlib.suppress(OSError):  # closed by the test already
                os.close(fd)


@asynccontextmanager
async def framing(read_end: int, *, max_line_bytes: int = 1024) -> AsyncIterator[
        tuple[anyio.abc.ObjectReceiveStream[SessionMessage | Exception],
              anyio.abc.ObjectReceiveStream[Outgoing], _Descriptor]]:
    """``read_lines`` over a descriptor reading ``read_end``: what it hands on and answers."""
    source = _Descriptor(read_end, writing=False)
    to_server, from_wire = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    answers, answered = anyio.create_memory_object_stream[Outgoing](16)
    try:
        async with from_wire, answered, anyio.create_task_group() as tasks:
            async def run() -> None:
                async with answers:
                    await read_lines(source.read, to_server, answers,
                                     max_line_bytes=max_line_bytes)

            tasks.start_soon(run)
            yield from_wire, answered, source
            tasks.cancel_scope.cancel()
    finally:
        source.close()


def message_id(message: SessionMessage | Exception) -> object:
    assert isinstance(message, SessionMessage)
    return message.message.id  # type: ignore[union-attr]


@linux_only
async def test_a_pipe_is_read_from_the_loop_and_the_shared_descriptor_stays_blocking() -> None:
    with pipe() as (read_end, _):
        async with framing(read_end) as (_, _, source):
            assert source.polled is not None and source.polled != read_end
            assert fcntl.fcntl(source.polled, fcntl.F_GETFL) & os.O_NONBLOCK
            assert not fcntl.fcntl(read_end, fcntl.F_GETFL) & os.O_NONBLOCK


@pytest.mark.parametrize("end", [b"\n", b""])  # a client may end without a last newline
async def test_a_regular_file_is_read_in_a_thread(tmp_path: Path, end: bytes) -> None:
    path = tmp_path / "input.jsonl"
    path.write_bytes(request(1) + b"\n" + request(2) + end)
    fd = os.open(path, os.O_RDONLY)
    try:
        async with framing(fd) as (messages, _, source):
            assert source.polled is None
            with anyio.fail_after(10):
                assert [message_id(await messages.receive()) for _ in range(2)] == [1, 2]
                with pytest.raises(anyio.EndOfStream):
                    await messages.receive()
    finally:
        os.close(fd)


async def test_lines_are_framed_across_reads() -> None:
    first, second, third = request(1), request(2), request(3)
    with pipe() as (read_end, write_end), anyio.fail_after(10):
        async with framing(read_end) as (messages, answered, _):
            os.write(write_end, first[:7])
            await anyio.sleep(0.05)  # the reader has read the first piece and waits
            os.write(write_end, first[7:] + b"\n" + second[:-3])
            assert message_id(await messages.receive()) == 1
            os.write(write_end, second[-3:] + b"\n\n" + third + b"\n")
            assert [message_id(await messages.receive()) for _ in range(2)] == [2, 3]
            os.close(write_end)
            with pytest.raises(anyio.EndOfStream):
                await messages.receive()
            with pytest.raises(anyio.EndOfStream):
                await answered.receive()  # the blank line needed no answer


async def test_a_line_past_the_cap_is_answered_as_it_streams_and_the_next_is_served() -> None:
    with pipe() as (read_end, write_end), anyio.fail_after(10):
        async with framing(read_end, max_line_bytes=1024) as (messages, answered, _):
            for _ in range(8):  # 8 KiB of one line, in pieces
                os.write(write_end, b"x" * 1024)
                await anyio.sleep(0.01)
            os.write(write_end, b"\n" + request(4) + b"\n")
            answer = await answered.receive()
            assert isinstance(answer, bytes)
            error = json.loads(answer)
            assert error["id"] is None and error["error"]["code"] == -32600
            assert "longer than 1024 bytes" in error["error"]["message"]
            assert message_id(await messages.receive()) == 4


async def test_the_input_may_end_in_the_middle_of_a_line() -> None:
    with pipe() as (read_end, write_end), anyio.fail_after(10):
        async with framing(read_end) as (messages, answered, _):
            os.write(write_end, request(5) + b"\n" + request(6)[:10])
            assert message_id(await messages.receive()) == 5
            os.close(write_end)
            with pytest.raises(anyio.EndOfStream):  # reading ends; half a line is no message
                await messages.receive()
            error = await answered.receive()  # but a line, answered as one
            assert isinstance(error, bytes) and b'"code":-32700' in error.replace(b" ", b"")
            with pytest.raises(anyio.EndOfStream):
                await answered.receive()


async def test_a_write_larger_than_the_pipe_waits_for_the_reader_and_keeps_order() -> None:
    data = bytes(range(256)) * 4096  # 1 MiB: far more than a pipe holds
    with pipe() as (read_end, write_end), anyio.fail_after(30):
        sink = _Descriptor(write_end, writing=True)
        received = bytearray()

        def drain() -> None:
            while len(received) < len(data):
                received.extend(os.read(read_end, 65536))

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(lambda: anyio.to_thread.run_sync(drain))
                await sink.write(data)
        finally:
            sink.close()
        assert bytes(received) == data


def drain_lines(read_end: int, count: int) -> list[bytes]:
    """Read ``count`` lines from ``read_end`` slowly (small reads: the pipe fills up)."""
    data = bytearray()
    while data.count(b"\n") < count:
        data.extend(os.read(read_end, 4096))
    return bytes(data).split(b"\n")[:count]


async def test_concurrent_lines_never_interleave_and_closing_stops_only_the_server() -> None:
    lines = [bytes([ord("a") + n]) * 200_000 + b"\n" for n in range(6)]
    with pipe() as (read_end, write_end), anyio.fail_after(30):
        sink = _Descriptor(write_end, writing=True)
        writer = LineWriter(sink.write)
        got: list[bytes] = []

        async def drain() -> None:
            got.extend(await anyio.to_thread.run_sync(drain_lines, read_end, len(lines) + 1))

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(drain)
                async with anyio.create_task_group() as senders:
                    for line in lines:
                        senders.start_soon(writer.send, line)
                await writer.aclose()
                with pytest.raises(anyio.ClosedResourceError):
                    await writer.send(b"late\n")
                await writer.write_line(b"answer\n")  # the reader's answers still go out
        finally:
            sink.close()
        assert sorted(got[:-1]) == sorted(line[:-1] for line in lines)
        assert got[-1] == b"answer"


async def test_a_line_once_begun_is_written_whole_when_its_sender_is_cancelled() -> None:
    line = b"x" * 1_000_000 + b"\n"  # far more than a pipe holds: the sender must wait
    with pipe() as (read_end, write_end), anyio.fail_after(30):
        sink = _Descriptor(write_end, writing=True)
        writer = LineWriter(sink.write)
        got: list[bytes] = []

        async def drain_later() -> None:
            await anyio.sleep(0.2)  # after the sender was cancelled
            got.extend(await anyio.to_thread.run_sync(drain_lines, read_end, 2))

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(drain_later)
                with anyio.move_on_after(0.05) as scope:
                    await writer.send(line)
                assert scope.cancel_called
                await writer.send(b"next\n")
        finally:
            sink.close()
        assert got == [line[:-1], b"next"]
