"""A command started with its standard output closed (``recallbound ... >&-``) does its work
and ends without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _closed_stdout(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "runtime_hooks", *args],
        stdout=None,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        timeout=120,
        check=False,
        preexec_fn=lambda: os.close(1),  # closed before Python starts: sys.stdout is None
    )


@pytest.mark.parametrize(
    "args",
    [
        ("--version",),
        ("memory", "--store", "{tmp}/m.db", "add", "a note", "--principal", "u", "--scope", "s"),
        ("config", "show"),
    ],
)
def test_a_command_with_standard_output_closed_has_no_traceback(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    done = _closed_stdout(*(a.format(tmp=tmp_path) for a in args), cwd=tmp_path)
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    assert done.returncode == 0, done.stderr.decode()
