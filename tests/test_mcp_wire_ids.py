"""A line the stdio reader cannot parse is answered under the id it names only when that id is
one whole string or integer: a fraction (``1.5``), an exponent (``1e3``) or an integer too long
to read is never cut down to another request's id (``1``), which would answer, and fail, a call
the client still has in flight."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from runtime_hooks.mcp.wire import read_message, scan

from .test_mcp_wire import raw_server

NOT_UTF8 = b'"params":{"x":"\xff"}}'


@pytest.mark.parametrize(
    ("id_text", "expected"),
    [
        (b"1.5", None),
        (b"1e3", None),
        (b"1E3", None),
        (b"-2.0", None),
        (b"9" * 19, None),
        (b"9" * 5000, None),
        (b"9" * 18, 10**18 - 1),
        (b"-7", -7),
        (b"12 ", 12),
        (b'"call-3"', "call-3"),
    ],
)
def test_an_unparsed_line_is_answered_under_its_whole_id_or_null(
    id_text: bytes, expected: object
) -> None:
    line = b'{"jsonrpc":"2.0","id":' + id_text + b',"method":"tools/list",' + NOT_UTF8
    assert scan(line, 64)[1] == expected
    answer = read_message(line)
    assert isinstance(answer, bytes)
    error = json.loads(answer)
    assert error["id"] == expected and error["error"]["code"] == -32700


@pytest.mark.anyio
@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
async def test_a_fractional_id_never_answers_the_request_with_its_integer_part(
    tmp_path: Path, server_backend: str
) -> None:
    with anyio.fail_after(120):
        async with raw_server(tmp_path, server_backend) as raw:
            await raw.send(b'{"jsonrpc":"2.0","id":1.5,"method":"tools/list",' + NOT_UTF8)
            answer = await raw.answer()
            assert answer["id"] is None and answer["error"]["code"] == -32700
            await raw.send(b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
            listed = await raw.answer()
            assert listed["id"] == 1 and "result" in listed
