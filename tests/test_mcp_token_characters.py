"""A token the HTTP server could never match is refused when the table is read: an HTTP
client sends a bearer token as visible ASCII, so a token with any other character (non-ASCII,
a space, a control character) would authenticate no request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_hooks.mcp.errors import McpAuthError
from runtime_hooks.mcp.trust import TokenTable


@pytest.mark.parametrize(
    "token",
    [
        "tökén-secret-0123456789",
        "secret-0123456789 ",
        " secret-0123456789",
        "secret 0123456789abc",
        "secret-0123456789\t",
        "secret-\x7f0123456789",
    ],
)
def test_a_token_no_request_could_carry_is_refused_without_showing_it(token: str) -> None:
    entries = [
        {"token": "fine-token-0123456789", "principal": "ana", "scope": "atlas"},
        {"token": token, "principal": "bo", "scope": "atlas"},
    ]
    with pytest.raises(McpAuthError) as raised:
        TokenTable.from_entries(entries, source="tokens")
    assert "token entry 1" in str(raised.value) and "visible ASCII" in str(raised.value)
    assert token.strip() not in str(raised.value)


def test_the_server_refuses_to_start_on_such_a_token_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLBOUND_")}
    env.update(
        RECALLBOUND_LEDGER=str(tmp_path / "ledger.db"),
        RECALLBOUND_STORE=str(tmp_path / "store.db"),
        RECALLBOUND_MCP_TOKENS=json.dumps(
            [{"token": "tökén-secret-0123456789", "principal": "ana", "scope": "atlas"}]
        ),
    )
    done = subprocess.run(
        [sys.executable, "-m", "runtime_hooks", "mcp", "--http", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=str(tmp_path),
    )
    assert done.returncode == 1
    assert done.stderr.startswith("recallbound: environment variable RECALLBOUND_MCP_TOKENS")
    assert done.stderr.count("\n") == 1 and "tökén" not in done.stderr


def test_visible_ascii_tokens_still_map_to_their_callers() -> None:
    token = "Abc-._~+/=!#$%&*0123456789"
    table = TokenTable.from_entries(
        [{"token": token, "principal": "ana", "scope": "atlas"}], source="tokens"
    )
    found = table.caller(token)
    assert found is not None and found.principal == "ana"
