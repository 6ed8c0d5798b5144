"""Launching a worker process: its environment, its process group, and killing it."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError

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


def load(target: str) -> Any:
    """The object ``module:qualname`` names."""
    module_name, _, qualname = target.partition(":")
    value: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def target(factory: object) -> tuple[str, str | None]:
    """``module:qualname`` of ``factory``, checked to name that very object."""
    if not callable(factory):
        raise InvalidArgumentTypeError(
            f"ProcessRetriever needs a callable factory, got {type(factory).__name__}"
        )
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        raise InvalidArgumentError(
            "ProcessRetriever's factory must be a module-level function or class (the worker "
            f"process imports it by name), got {factory!r}"
        )
    main_path: str | None = None
    if module == "__main__":
        main_path = getattr(sys.modules["__main__"], "__file__", None)
        if main_path is None:
            raise InvalidArgumentError(
                "ProcessRetriever's factory is in an interactive __main__; put it in a module"
            )
        main_path = os.path.abspath(main_path)
    try:
        found = load(f"{module}:{qualname}")
    except (ImportError, AttributeError):
        found = None
    if found is not factory:
        raise InvalidArgumentError(
            f"ProcessRetriever's factory {module}.{qualname} cannot be imported by that name"
        )
    return f"{module}:{qualname}", main_path
