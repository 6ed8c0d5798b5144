"""The HTTP server's Origin check accepts a loopback (or bound-address) origin with or without
a port, as its Host check does: a page served on the default port sends no port in Origin."""

from __future__ import annotations

import pytest
from mcp.server.transport_security import TransportSecurityMiddleware
from starlette.requests import Request

from runtime_hooks.mcp import cli

pytestmark = pytest.mark.anyio


def _request(host: str, origin: str) -> Request:
    headers = [
        (b"host", host.encode()),
        (b"origin", origin.encode()),
        (b"content-type", b"application/json"),
    ]
    return Request({"type": "http", "method": "POST", "path": "/mcp", "headers": headers})


async def _status(bind: str, host: str, origin: str) -> int:
    guard = TransportSecurityMiddleware(cli.transport_security(bind, 80))
    refused = await guard.validate_request(_request(host, origin), is_post=True)
    return 200 if refused is None else refused.status_code


@pytest.mark.parametrize(
    ("bind", "host", "origin"),
    [
        ("127.0.0.1", "localhost", "http://localhost"),
        ("127.0.0.1", "127.0.0.1", "http://127.0.0.1"),
        ("127.0.0.1", "127.0.0.1", "https://127.0.0.1"),
        ("::1", "[::1]", "http://[::1]"),
        ("10.1.2.3", "10.1.2.3", "http://10.1.2.3"),
        ("127.0.0.1", "localhost:80", "http://localhost:3000"),
    ],
)
async def test_a_loopback_or_bound_origin_without_a_port_is_accepted(
    bind: str, host: str, origin: str
) -> None:
    assert await _status(bind, host, origin) == 200


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "http://localhost.evil.example",
        "http://localhost.evil.example:80",
        "http://127.0.0.1.evil.example",
        "null",
        "http://0.0.0.0",
    ],
)
async def test_a_foreign_origin_is_still_refused(origin: str) -> None:
    assert await _status("0.0.0.0", "localhost", origin) == 403
