"""JSON nested past what the parser can read is bad input, named, never a traceback.

``recallbound memory import`` names the line and stores nothing (all or nothing); a token table
in ``RECALLBOUND_MCP_TOKENS`` nested that deeply is a configuration error of ``recallbound mcp``.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_hooks.__main__ import main
from runtime_hooks.mcp.errors import McpAuthError
from runtime_hooks.mcp.trust import TokenTable

GOOD = json.dumps({"text": "fine", "principal": "u1", "scope": "proj", "id": "g"})
DEEP = 100_000


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def _deep_lines() -> dict[str, bytes]:
    return {
        "an open array": b"[" * DEEP,
        "a balanced array": b"[" * DEEP + b"]" * DEEP,
        "a deep value": (b'{"text": "b", "principal": "u1", "scope": "proj", "x": '
                         + b"[" * DEEP + b"]" * DEEP + b"}"),
        "a deep object": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    }


@pytest.mark.parametrize("name", sorted(_deep_lines()))
def test_a_deeply_nested_line_is_named_and_nothing_is_stored(tmp_path: Path, name: str) -> None:
    store = tmp_path / "memory.db"
    data = tmp_path / "deep.jsonl"
    data.write_bytes(GOOD.encode() + b"\n" + _deep_lines()[name] + b"\n"
                     + GOOD.replace('"g"', '"h"').encode() + b"\n")
    status, out, err = _cli("memory", "--store", str(store), "import", str(data))
    assert (status, out) == (2, "")
    assert err == f"recallbound: {data} line 2: not valid JSON: nested too deeply\n"
    assert not store.exists()  # the file is read before the store opens


def test_a_deep_line_in_an_existing_store_changes_nothing(tmp_path: Path) -> None:
    store = tmp_path / "memory.db"
    assert _cli("memory", "--store", str(store), "add", "kept", "--id", "k",
                "--principal", "u1", "--scope", "proj")[0] == 0
    data = tmp_path / "deep.jsonl"
    data.write_bytes(GOOD.encode() + b"\n" + b"[" * DEEP + b"\n")
    status, _, err = _cli("memory", "--store", str(store), "import", str(data))
    assert status == 2 and "line 2: not valid JSON: nested too deeply" in err
    conn = sqlite3.connect(store)
    try:
        assert conn.execute("SELECT id FROM memories").fetchall() == [("k",)]
    finally:
        conn.close()


def test_a_deep_line_on_standard_input_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
        GOOD.encode() + b"\n\n" + b'{"a":' * DEEP)))
    status, out, err = _cli("memory", "--store", str(tmp_path / "m.db"), "import", "-")
    assert (status, out) == (2, "")
    assert err == "recallbound: standard input line 3: not valid JSON: nested too deeply\n"


def test_the_installed_command_prints_one_line(tmp_path: Path) -> None:
    data = tmp_path / "deep.jsonl"
    data.write_bytes(GOOD.encode() + b"\n" + b"[" * DEEP + b"]" * DEEP + b"\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLBOUND_")}
    done = subprocess.run(
        [sys.executable, "-m", "runtime_hooks", "memory", "--store", str(tmp_path / "m.db"),
         "import", str(data)], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"recallbound: {data} line 2: not valid JSON: nested too deeply\n"
    assert not (tmp_path / "m.db").exists()


# -- the MCP server's token table ------------------------------------------------------------------


@pytest.mark.parametrize("text", ["[" * DEEP, "[" * DEEP + "]" * DEEP,
                                  '[{"token": ' + "[" * DEEP + "]" * DEEP + "}]"])
def test_a_deeply_nested_token_table_is_a_configuration_error(text: str) -> None:
    with pytest.raises(McpAuthError) as caught:
        TokenTable.from_env("RECALLBOUND_MCP_TOKENS", {"RECALLBOUND_MCP_TOKENS": text})
    assert str(caught.value) == (
        "environment variable RECALLBOUND_MCP_TOKENS: not valid JSON: nested too deeply")


def test_recallbound_mcp_http_refuses_a_deep_token_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("RECALLBOUND_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RECALLBOUND_LEDGER", str(tmp_path / "ledger.db"))
    monkeypatch.setenv("RECALLBOUND_STORE", str(tmp_path / "store.db"))
    monkeypatch.setenv("RECALLBOUND_MCP_TOKENS", "[" * DEEP)
    status, out, err = _cli("mcp", "--http", "127.0.0.1:0")
    assert (status, out) == (1, "")
    assert err == ("recallbound: environment variable RECALLBOUND_MCP_TOKENS: not valid JSON: "
                   "nested too deeply\n")


def test_a_number_too_long_to_read_is_a_named_bad_line(tmp_path: Path) -> None:
    lines = tmp_path / "big.jsonl"
    lines.write_text('{"text": "a", "principal": "p", "scope": "s"}\n'
                     '{"text": "b", "principal": "p", "scope": "s", "x": ' + "9" * 5_000 + "}\n")
    out, err = io.StringIO(), io.StringIO()
    code = main(["memory", "--store", str(tmp_path / "store.db"), "import", str(lines)],
                stdout=out, stderr=err)
    assert code == 2 and "line 2" in err.getvalue() and "too long" in err.getvalue()
