"""``recallbound --version`` into a pipe whose reader went away ends as every other command
does: the shell's SIGPIPE status, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_version_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        process = subprocess.run([sys.executable, "-m", "runtime_hooks", "--version"],
                                 stdout=write, stderr=subprocess.PIPE, cwd=tmp_path,
                                 timeout=60, check=False)
    finally:
        os.close(write)
    assert (process.returncode, process.stderr) == (141, b"")
