"""``NaN`` and ``Infinity`` are not JSON: a stdio line that holds one as a value is answered
with a Parse error (under its id) and never reaches the server, as any other line that is not
JSON; the same words inside a string are ordinary text."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp.shared.message import SessionMessage

from runtime_hooks.mcp.wire import read_message

from .test_mcp_wire import raw_server


def _call(value: bytes) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"search_memory",'
        b'"arguments":{"query":' + value + b"}}}"
    )


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b'"x","n":NaN'])
def test_a_non_json_number_is_a_parse_error(value: bytes) -> None:
    answer = read_message(_call(value))
    assert isinstance(answer, bytes)
    error = json.loads(answer)
    assert error["id"] == 3 and error["error"]["code"] == -32700


@pytest.mark.parametrize("text", [b'"NaN handling"', b'"Infinity pool budget"'])
def test_the_words_inside_a_string_are_text(text: bytes) -> None:
    message = read_message(_call(text))
    assert isinstance(message, SessionMessage)
    params = message.message.params  # type: ignore[union-attr]
    assert params["arguments"]["query"] == json.loads(text)


@pytest.mark.anyio
@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
async def test_the_server_answers_nan_with_a_parse_error_and_keeps_serving(
    tmp_path: Path, server_backend: str
) -> None:
    with anyio.fail_after(120):
        async with raw_server(tmp_path, server_backend) as raw:
            await raw.send(b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":NaN}}')
            answer = await raw.answer()
            assert answer["id"] == 1 and answer["error"]["code"] == -32700
            await raw.send(b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}')
            listed = await raw.answer()
            assert listed["id"] == 2 and "result" in listed
