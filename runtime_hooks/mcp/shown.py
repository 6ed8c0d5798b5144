"""The MCP server's settings as ``recallbound config show`` lists them, beside the hooks'."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .cli import (
    DEFAULT_MAX_MEMORY_BYTES,
    DEFAULT_MAX_RUNS_PER_HOUR,
    ENV_PREFIX,
    TOKENS_ENV,
    _mcp_env,
    _mcp_table,
)
from .window import DEFAULT_WINDOW_S

_DEFAULTS: dict[str, object] = {
    "principal": None, "scope": None, "window_ms": DEFAULT_WINDOW_S * 1000,
    "max_runs_per_hour": DEFAULT_MAX_RUNS_PER_HOUR, "max_memory_bytes": DEFAULT_MAX_MEMORY_BYTES,
    "token_file": None, "allowed_hosts": [], "allowed_origins": [],
}
"""Every ``[mcp]`` key in display order, with the value the server uses when nothing sets it.
The HTTP tokens are a secret and are never listed."""


def describe(file: Path | None, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per ``[mcp]`` key, in the shape of the hooks' rows (key, value, source, where,
    env, looser): the environment over the file, as the server reads them."""
    settings = {name: text for name, text in env.items()
                if not name.startswith(TOKENS_ENV)}  # token tables, under any name: secrets
    from_file, from_env = _mcp_table(file), _mcp_env(settings, TOKENS_ENV)
    rows = []
    for key, default in _DEFAULTS.items():
        name = f"{ENV_PREFIX}{key.upper()}"
        value, source, where = (
            (from_env[key], "env", name) if key in from_env
            else (from_file[key], "file", f"{file}: mcp.{key}") if key in from_file
            else (default, "default", ""))
        if isinstance(value, Path):
            value = str(value)
        looser = (key == "max_runs_per_hour" and isinstance(value, int)
                  and value > DEFAULT_MAX_RUNS_PER_HOUR)
        rows.append({"key": f"mcp.{key}", "value": value, "source": source, "where": where,
                     "env": name, "looser": looser})
    return rows
