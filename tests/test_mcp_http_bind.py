"""``recallbound mcp --http`` on an address it cannot bind says why in one line and exits 1,
as every other server that cannot start does (never a traceback)."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_hooks.__main__ import main

TOKENS = json.dumps(
    [{"token": "t0ken-for-ana-0123456789abcdef", "principal": "ana", "scope": "atlas"}]
)


def _env(folder: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLBOUND_")}
    return {
        **env,
        "RECALLBOUND_LEDGER": str(folder / "ledger.db"),
        "RECALLBOUND_STORE": str(folder / "store.db"),
        "RECALLBOUND_MCP_TOKENS": TOKENS,
    }


def test_a_port_in_use_is_one_line_and_status_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, value in _env(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RECALLBOUND_CONFIG", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = io.StringIO()
        status = main(["mcp", "--http", f"127.0.0.1:{port}"], stderr=err)
    text = err.getvalue()
    assert status == 1
    assert text.startswith(f"recallbound: cannot serve HTTP on 127.0.0.1:{port}: ")
    assert text.count("\n") == 1


@pytest.mark.parametrize("address", ["in-use", "203.0.113.9:0", "host.invalid:0"])
def test_a_server_process_that_cannot_bind_prints_no_traceback(
    tmp_path: Path, address: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        if address == "in-use":
            address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = subprocess.run(
            [sys.executable, "-m", "runtime_hooks", "mcp", "--http", address],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(tmp_path),
            cwd=str(tmp_path),
        )
    host = address.rsplit(":", 1)[0]
    assert done.returncode == 1
    assert done.stderr.startswith(f"recallbound: cannot serve HTTP on {host}:"), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
