"""Launching a worker process: its environment, its process group, and killing it."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping

from plugin.errors import InvalidArgumentTypeError

GROUPS = hasattr(os, "killpg")
"""Whether a worker runs in a process group of its own (POSIX), killed as a whole."""
LAUNCHER_GRACE_S = 0.5
"""How long a launcher has to relay SIGTERM to its worker before the group gets SIGKILL."""


def kill_group(pgid: int) -> None:
    with contextlib.suppress(OSError):  # gone already, or a member this user may not signal
        os.killpg(pgid, signal.SIGKILL)


_HOST_ONLY = ("RECALLBOUND_", "PG", "DATABASE_URL")
"""Names (prefixes) of the variables a worker does not inherit: the ledger's and the store's
location, PostgreSQL's connection settings and password."""


def worker_env(env: Mapping[str, str], *, default: bool) -> dict[str, str]:
    """A worker's environment: ``env`` as given, or (by ``default``) this process's without
    the :data:`_HOST_ONLY` variables."""
    if not isinstance(env, Mapping) or not all(
            isinstance(name, str) and isinstance(value, str) for name, value in env.items()):
        raise InvalidArgumentTypeError("env must be a mapping of str to str")
    if not default:
        return dict(env)
    return {name: value for name, value in env.items() if not name.startswith(_HOST_ONLY)}
