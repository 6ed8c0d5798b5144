"""A request whose id MCP does not allow (null, a boolean, a number with a fraction, an object,
an array) is answered with an Invalid Request error (id null) and never run, and one whose
``params`` is null with an Invalid Params error under its id: by the stdio
reader itself (tests/test_mcp_wire.py sends these lines to a real server process too) and over
streamable HTTP. The SDK's parser would
drop such an id and take the request for a notification: no answer, and the method run."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.shared.message import SessionMessage

from runtime_hooks.mcp.request_id import invalid_request_id
from runtime_hooks.mcp.wire import INVALID_PARAMS, INVALID_REQUEST, read_message

from ._mcp_env import search
from .test_mcp_transports import TOKEN, _http_client, _http_server, _seeded
from .test_mcp_wire import INITIALIZE

pytestmark = pytest.mark.anyio

BAD_IDS = ['{"a":1}', "[1]", "null", "1.5", "1.0", "1e3", "true", "false"]
SEARCH = '"method":"tools/call","params":{"name":"search_memory","arguments":{"query":"x"}}'


def _runs(folder: Path) -> int:
    """How many runs the ledger holds (a search that ran opened one)."""
    with contextlib.closing(sqlite3.connect(folder / "ledger.db")) as ledger:
        found: int = ledger.execute("select count(*) from runs").fetchone()[0]
    return found


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_request_with_an_invalid_id_is_answered_with_id_null(bad: str) -> None:
    for line in (f'{{"jsonrpc":"2.0","id":{bad},"method":"tools/list"}}',
                 f'{{"jsonrpc":"2.0","id":{bad},{SEARCH}}}',
                 f'{{"jsonrpc":"2.0","\\u0069d":{bad},"method":"ping"}}',  # an escaped key
                 f'{{"jsonrpc":"2.0","id":{bad},"method":"ping","params":{{"x":"\\ud800"}}}}'):
        answer = read_message(line.encode())
        assert isinstance(answer, bytes), line
        error = json.loads(answer)
        assert (error["id"], error["error"]["code"]) == (None, INVALID_REQUEST), line
        assert invalid_request_id(json.loads(line))


@pytest.mark.parametrize("good", ['"a"', "0", "-3", "99999999999999999999999"])
def test_string_and_integer_ids_and_notifications_go_to_the_server(good: str) -> None:
    request = read_message(f'{{"jsonrpc":"2.0","id":{good},"method":"ping"}}'.encode())
    assert isinstance(request, SessionMessage)
    assert isinstance(request.message, types.JSONRPCRequest)
    assert request.message.id == json.loads(good)
    notification = read_message(b'{"jsonrpc":"2.0","method":"notifications/initialized",'
                                b'"params":{"id":true}}')
    assert isinstance(notification, SessionMessage)
    assert isinstance(notification.message, types.JSONRPCNotification)


# The SDK's HTTP client (httpx2) under trio leaves its SSE async generators to the garbage
# collector; that is the client library's own cleanup, not the server's.
@pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning")
async def test_http_answers_every_invalid_id_and_runs_nothing(tmp_path: Path) -> None:
    await _seeded(tmp_path)
    async with _http_server(tmp_path) as (url, _):
        headers = {"Accept": "application/json, text/event-stream",
                   "Content-Type": "application/json"}
        with anyio.fail_after(120):
            async with httpx2.AsyncClient() as raw:
                opened = await raw.post(url, json=INITIALIZE, headers={
                    **headers, "Authorization": f"Bearer {TOKEN}"})
                assert opened.status_code == 200
                session = {"Mcp-Session-Id": opened.headers["mcp-session-id"]}
                for version, more in (("2025-06-18", session), ("2026-07-28", {})):
                    for bad in BAD_IDS:
                        body = f'{{"jsonrpc":"2.0","id":{bad},{SEARCH}}}'.encode()
                        sent = {**headers, "Mcp-Protocol-Version": version, **more}
                        answer = await raw.post(url, content=body, headers=sent)
                        assert answer.status_code == 401, (version, bad)  # no token: refused
                        answer = await raw.post(
                            url, content=body,
                            headers={**sent, "Authorization": f"Bearer {TOKEN}"})
                        assert 400 <= answer.status_code < 500, (version, bad)
                        error = answer.json()
                        assert error["id"] is None, (version, bad)
                        assert error["error"]["code"] == INVALID_REQUEST, (version, bad)
                    # params null: the SDK would read it as absent and list the tools
                    answer = await raw.post(
                        url, content=b'{"jsonrpc":"2.0","id":41,"method":"tools/list",'
                                     b'"params":null}',
                        headers={**headers, "Mcp-Protocol-Version": version, **more,
                                 "Authorization": f"Bearer {TOKEN}"})
                    assert answer.status_code == 400, version
                    assert (answer.json()["id"], answer.json()["error"]["code"]) == (
                        41, INVALID_PARAMS), version
            assert _runs(tmp_path) == 0  # no search ran
            async with _http_client(url, TOKEN) as client:  # and the server keeps serving
                hit = await search(client, "invoice backfill dry-run", run_id="run-after")
                assert hit["status"] == "ok"


@pytest.mark.parametrize("admitted", [False, True])
async def test_a_request_without_a_token_goes_to_the_sdk_with_none_of_its_body_read(
    admitted: bool,
) -> None:
    # No token: the body goes to the SDK unread (its bearer check refuses the request before
    # it reads it), so a client nobody admitted cannot make the server hold megabytes per
    # connection by declaring a large body and sending it slowly.
    from starlette.types import Message, Receive, Scope, Send

    from runtime_hooks.mcp.http_ids import RequestIdCheck

    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    read: list[str] = []

    async def receive() -> Message:
        read.append("check" if not reached else "app")
        return {"type": "http.request", "body": body, "more_body": False}

    reached = False

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal reached
        reached = True
        await receive()

    async def admit(request: object) -> bool:
        return admitted

    async def send(message: Message) -> None:
        raise AssertionError("only the SDK answers here")

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [],
             "query_string": b""}
    await RequestIdCheck(app, admit)(scope, receive, send)
    assert reached and read == (["check"] if admitted else ["app"])  # replayed to the SDK


async def _first_line(url: str, headers: dict[str, str], prefix: bytes) -> bytes:
    """The status line of a POST that declares a 3 MB body and sends only ``prefix`` of it."""
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    head = "".join(f"{name}: {value}\r\n" for name, value in {
        "Host": host_port, "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "Content-Length": "3000000",
        **headers}.items())
    host, port = host_port.rsplit(":", 1)
    async with await anyio.connect_tcp(host, int(port)) as stream:
        await stream.send(f"POST /mcp HTTP/1.1\r\n{head}\r\n".encode() + prefix)
        with anyio.fail_after(10):  # answered without the rest of the body
            return (await stream.receive()).split(b"\r\n", 1)[0]


@pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning")
async def test_a_token_holder_with_a_foreign_host_origin_or_content_type_is_refused_unread(
    tmp_path: Path,
) -> None:
    # The SDK reads a body (up to its cap) before its Host, Origin and content-type checks;
    # the server answers those refusals itself, before a byte of the body is read.
    await _seeded(tmp_path)
    async with _http_server(tmp_path) as (url, _):
        token = {"Authorization": f"Bearer {TOKEN}"}
        port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
        for headers, status in (({**token, "Host": f"evil.example:{port}"}, b"421"),
                                ({**token, "Origin": "http://evil.example"}, b"403"),
                                ({**token, "Content-Type": "text/plain"}, b"400"),
                                ({"Host": f"evil.example:{port}"}, b"401")):
            line = await _first_line(url, headers, b'{"jsonrpc"')
            assert line.split(b" ")[1] == status, (headers, line)
        assert _runs(tmp_path) == 0


@pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning")
async def test_http_answers_nan_and_infinity_with_a_parse_error_and_runs_nothing(
    tmp_path: Path,
) -> None:
    # NaN and Infinity are not JSON (stdio answers them with a Parse error); the SDK's parser
    # takes them, so over HTTP the server answers them itself.
    await _seeded(tmp_path)
    async with _http_server(tmp_path) as (url, _):
        headers = {"Accept": "application/json, text/event-stream",
                   "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}",
                   "Mcp-Protocol-Version": "2026-07-28"}
        with anyio.fail_after(60):
            async with httpx2.AsyncClient() as raw:
                for constant in ("NaN", "-Infinity", "Infinity"):
                    body = ('{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":'
                            '"search_memory","arguments":{"query":"invoice"},"_meta":{"x":'
                            + constant + "}}}").encode()
                    answer = await raw.post(url, content=body, headers=headers)
                    assert answer.status_code == 400, constant
                    assert answer.json()["error"]["code"] == -32700, constant
        assert _runs(tmp_path) == 0
