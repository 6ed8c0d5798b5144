"""The stdio transport: every line gets an answer, and no line is read whole past its cap.

The SDK's own stdio transport reads a line whole before looking at it and drops a line it
cannot parse without answering, so a client waits for ever. This one reads standard input in
chunks and frames lines itself:

* a line longer than ``max_line_bytes`` is skipped as it streams (never held whole) and
  answered with a JSON-RPC error under the id its head names (null if none), so the client
  that sent it is not left waiting;
* a line that is not UTF-8 or not JSON (``NaN`` and ``Infinity`` are not JSON), that nests
  deeper than ``max_depth``, that carries a lone surrogate (``"\\ud800"``), that is not one
  JSON-RPC message (a batch, ``params`` that is not an object, no ``method``) is answered
  with a JSON-RPC error carrying the request's id when it can be read (null otherwise);
* a request whose ``id`` is not a string or an integer (:mod:`~runtime_hooks.mcp.request_id`)
  is answered with an Invalid Request error with id null, and never reaches the server;
* everything else goes to the server, which answers unknown methods and bad tool arguments
  itself. The server keeps serving after each of these.

While serving, file descriptor 0 reads the null device and descriptor 1 writes to standard
error, so a stray ``print`` in a retriever cannot corrupt the protocol stream. A pipe (what a
client gives its server) is read and written from the event loop, with no thread per message;
anything else through a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import attrs
import mcp_types as types
import pydantic
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from .request_id import BAD_ID_MESSAGE, PARAMS_NOT_AN_OBJECT, invalid_request_id, null_params

MAX_LINE_BYTES = 4 * 1024 * 1024
"""The longest line read (a JSON-RPC message), in bytes: as the SDK's HTTP body limit."""
MAX_DEPTH = 64
"""The deepest nesting of arrays and objects in one message."""
CHUNK = 64 * 1024
ID_HEAD_BYTES = 64 * 1024
"""How much of a line past the cap is kept to read its id from (the id precedes the params)."""

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602

_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*(?:"(\s*:)?|\\?\Z)|[\[\]{}]', re.DOTALL)
# A whole integer (never the start of a fraction, an exponent or a longer number) or a string.
_ID_VALUE = re.compile(rb'\s*(-?\d{1,18}(?![\d.eE])|"(?:[^"\\]|\\.){0,256}")')
_SLOW = re.compile(rb"\\[uU][dD][89a-fA-F]|NaN|Infinity")  # what the one-pass parse lets by

Outgoing = SessionMessage | bytes


def error_line(request_id: object, code: int, message: str) -> bytes:
    """A JSON-RPC error response, as one line."""
    answer = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return json.dumps(answer, ensure_ascii=True).encode("ascii") + b"\n"


def _usable_id(value: object) -> str | int | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    if isinstance(value, str) and not _encodes(value):
        return None
    return value


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def scan(line: bytes, max_depth: int) -> tuple[bool, str | int | None]:
    """Whether ``line`` nests at most ``max_depth`` deep, and its top-level ``"id"``: read in one
    pass without parsing (a string left open runs to the end), so a bad line keeps its id."""
    depth = 0
    found: str | int | None = None
    for match in _TOKEN.finditer(line):
        token = match.group(0)
        if token[:1] == b'"':
            if match.group(1) and depth == 1 and token.startswith(b'"id"') and found is None:
                value = _ID_VALUE.match(line, match.end())
                if value is not None:
                    try:
                        found = _usable_id(json.loads(value.group(1)))
                    except ValueError:
                        found = None
        elif token in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                return False, found
        else:
            depth -= 1
    return True, found


def _has_lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        return not _encodes(value)
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(item) for item in value)
    return False


_BAD_ID = error_line(None, INVALID_REQUEST, BAD_ID_MESSAGE)


def read_message(line: bytes, *, max_depth: int = MAX_DEPTH) -> SessionMessage | bytes | None:
    """One line as a message for the server, an error line to send back, or None (blank)."""
    if not line.strip():
        return None
    shallow = line.count(b"[") + line.count(b"{") <= max_depth
    if shallow and not _SLOW.search(line):
        try:  # the common case, in one pass: a well-formed message
            parsed = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except pydantic.ValidationError:
            pass  # told apart below, to answer with the right error
        else:
            # A notification is rare; one is parsed again to tell it from a request whose
            # id the parser dropped (checked on the decoded keys, so an escaped "id" counts).
            if null_params(parsed):
                return error_line(parsed.id, INVALID_PARAMS, PARAMS_NOT_AN_OBJECT)
            if not isinstance(parsed, types.JSONRPCNotification) \
                    or not invalid_request_id(json.loads(line)):
                return SessionMessage(parsed)
            return _BAD_ID
    if not shallow:
        ok, salvaged = scan(line, max_depth)
        if not ok:
            return error_line(salvaged, INVALID_REQUEST,
                              f"Invalid request: nested deeper than {max_depth} levels")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return error_line(scan(line, max_depth)[1], PARSE_ERROR, "Parse error: not UTF-8 text")
    try:
        document = json.loads(text, parse_constant=int)  # NaN, Infinity: not JSON, int() refuses
    except ValueError:
        return error_line(scan(line, max_depth)[1], PARSE_ERROR, "Parse error: not JSON")
    request_id = _usable_id(document.get("id")) if isinstance(document, dict) else None
    if not isinstance(document, dict):
        return error_line(None, INVALID_REQUEST,
                          "Invalid request: expected one JSON-RPC message object")
    if invalid_request_id(document):
        return _BAD_ID
    if _has_lone_surrogate(document):
        return error_line(request_id, INVALID_PARAMS,
                          "Invalid params: a string holds a lone surrogate (not Unicode text)")
    if "params" in document and not isinstance(document["params"], dict):  # null included
        return error_line(request_id, INVALID_PARAMS, PARAMS_NOT_AN_OBJECT)
    try:
        message = types.jsonrpc_message_adapter.validate_python(document, by_name=False)
    except pydantic.ValidationError:
        if not isinstance(document.get("method"), str) and "result" not in document \
                and "error" not in document:
            return error_line(request_id, INVALID_REQUEST, "Invalid request: no method")
        return error_line(request_id, INVALID_REQUEST, "Invalid request: not JSON-RPC 2.0")
    return SessionMessage(message)


class Answers(Protocol):
    """Where the lines that never reach the server are answered."""

    async def send(self, item: bytes, /) -> None: ...


Intercept = Callable[[SessionMessage], bool]
"""Sees each message before the server does; True when it took the message (to answer it)."""


def _leave(message: SessionMessage) -> bool:
    return False


async def read_lines(
    read: Any, send: MemoryObjectSendStream[SessionMessage | Exception],
    answer: Answers, *, max_line_bytes: int = MAX_LINE_BYTES, max_depth: int = MAX_DEPTH,
    intercept: Intercept = _leave,
) -> None:
    """Frame ``read()`` chunks into lines; each goes to ``intercept``, the server or an answer."""
    pending = bytearray()
    skipping = False

    async def end_line() -> None:
        nonlocal skipping
        line, too_long, skipping = bytes(pending), skipping or len(pending) > max_line_bytes, False
        pending.clear()
        result = (error_line(scan(line[:ID_HEAD_BYTES], max_depth)[1], INVALID_REQUEST,
                             f"Invalid request: the line is longer than {max_line_bytes} bytes")
                  if too_long else read_message(line, max_depth=max_depth))
        if isinstance(result, SessionMessage):
            if not intercept(result):
                try:  # the server is waiting for it (the usual case): no yield
                    send.send_nowait(result)
                except anyio.WouldBlock:
                    await send.send(result)
        elif result is not None:
            await answer.send(result)

    async with send:
        while True:
            chunk: bytes = await read()
            if not chunk:
                break
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                pending += b"" if skipping else chunk[start:end]
                await end_line()
                start = end + 1
            if not skipping:
                pending += chunk[start:]
                if len(pending) > max_line_bytes:  # skipped as it streams, never held whole
                    del pending[ID_HEAD_BYTES:]  # only its head stays, to answer under its id
                    skipping = True
        await end_line()  # a last line the input ends without a newline is a line too


def encode(item: Outgoing) -> bytes:
    """``item`` as one line."""
    if isinstance(item, bytes):
        return item
    text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
    return text.encode("utf-8", "backslashreplace") + b"\n"


class LineWriter:
    """The server's write stream: each message one line, written by the task that sends it.

    No writer task stands between the server and the output. One line is written at a time
    (a sender waits while another's line is still going out, so lines never interleave), and a
    line once begun is written whole, even if its sender is cancelled meanwhile.
    """

    def __init__(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        self._write = write
        # One line at a time; taken without a yield when no other line is going out.
        self._lock = anyio.Lock(fast_acquire=True)
        self._closed = False

    async def send(self, item: Outgoing, /) -> None:
        """Write ``item`` as one line (``ClosedResourceError`` once closed)."""
        if self._closed:
            raise anyio.ClosedResourceError
        await self.write_line(encode(item))

    async def write_line(self, line: bytes) -> None:
        """Write ``line`` (open or closed: the reader's answers go out until it stops).

        Raises :class:`anyio.BrokenResourceError` when the output cannot be written (its
        reader is gone): the SDK then drops that answer and keeps serving.
        """
        async with self._lock:
            with anyio.CancelScope(shield=True):
                try:
                    await self._write(line)
                except OSError as exc:
                    raise anyio.BrokenResourceError from exc

    async def answer(self, line: bytes) -> None:
        """Write ``line`` as :meth:`write_line` does, or drop it when the output cannot be
        written (no client is left to read it)."""
        with contextlib.suppress(anyio.BrokenResourceError):
            await self.write_line(line)

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> LineWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@attrs.frozen
class _Answers:
    writer: LineWriter

    async def send(self, item: bytes, /) -> None:
        await self.writer.answer(item)


class _Descriptor:
    """Reads or writes one file descriptor from the event loop.

    A pipe (what MCP clients give a server) is reopened as a descriptor of its own,
    non-blocking, and waited on with the loop's own readiness (no thread per message; the
    flag is on the new descriptor only, never on one the process shares with its parent).
    Anything else, or where that cannot be done, is read and written in a worker thread.
    """

    def __init__(self, fd: int, *, writing: bool) -> None:
        self.fd, self.polled = fd, _reopen_pipe(fd, os.O_WRONLY if writing else os.O_RDONLY)

    async def read(self) -> bytes:
        """Up to :data:`CHUNK` bytes; ``b""`` at the end of the input."""
        if self.polled is None:
            return await anyio.to_thread.run_sync(os.read, self.fd, CHUNK,
                                                  abandon_on_cancel=True)
        try:
            data = os.read(self.polled, CHUNK)
        except BlockingIOError:
            while True:
                await anyio.wait_readable(self.polled)
                try:
                    return os.read(self.polled, CHUNK)
                except BlockingIOError:
                    continue
        await anyio.lowlevel.checkpoint()  # read without waiting: let the others run too
        return data

    async def write(self, data: bytes) -> None:
        """All of ``data``."""
        if self.polled is None:
            await anyio.to_thread.run_sync(_write_all, self.fd, data)
            return
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.polled, view):]
            except BlockingIOError:
                await anyio.wait_writable(self.polled)

    def close(self) -> None:
        """Close the descriptor of its own, if any (the one it was made from stays open)."""
        polled, self.polled = self.polled, None
        if polled is not None:
            os.close(polled)


def _reopen_pipe(fd: int, mode: int) -> int | None:
    """A non-blocking descriptor of its own onto the pipe ``fd``, or None."""
    if not hasattr(os, "O_NONBLOCK") or not stat.S_ISFIFO(os.fstat(fd).st_mode):
        return None
    try:  # a new open file description (Linux): the shared one stays as it was
        return os.open(f"/proc/self/fd/{fd}", mode | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@asynccontextmanager
async def stdio_streams(
    *, max_line_bytes: int = MAX_LINE_BYTES, max_depth: int = MAX_DEPTH,
    intercept: Intercept = _leave,
) -> AsyncIterator[tuple[MemoryObjectReceiveStream[SessionMessage | Exception], LineWriter]]:
    """The server's read and write streams over this process's standard input and output
    (``intercept`` sees each message first, as in :func:`read_lines`)."""
    wire_in, wire_out = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    source = _Descriptor(wire_in, writing=False)
    sink = _Descriptor(wire_out, writing=True)
    to_server, from_wire = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    writer = LineWriter(sink.write)

    async def reader() -> None:
        await read_lines(source.read, to_server, _Answers(writer),
                         max_line_bytes=max_line_bytes, max_depth=max_depth, intercept=intercept)

    try:
        async with anyio.create_task_group() as readers:
            readers.start_soon(reader)
            yield from_wire, writer  # every line is written by the time its send returns
            readers.cancel_scope.cancel()
    finally:
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        for fd in (saved_in, saved_out, wire_out):
            os.close(fd)
        sink.close()
        if source.polled is not None:
            source.close()
            os.close(wire_in)
        # else wire_in stays open: a worker thread may still be blocked reading it.
