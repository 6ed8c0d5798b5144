"""``recallbound mcp``: serve the tools over stdio (default) or streamable HTTP.

Settings, highest precedence first: the command line, the ``[mcp]`` table of the
configuration file (``--config``, else ``$RECALLBOUND_CONFIG``, else ``recallbound.toml`` in
the working folder), defaults. The ledger, the store and the policy come from the same
configuration as the hooks (:meth:`RecallConfig.from_sources
<runtime_hooks.bootstrap.RecallConfig.from_sources>`).

``[mcp]`` keys: ``principal``, ``scope`` (stdio), ``window_ms`` (the batch window),
``token_file`` (HTTP; relative to the file's folder). HTTP tokens come from ``--token-file``
or ``token_file``, else from the environment variable named by ``--tokens-env`` (default
``RECALLBOUND_MCP_TOKENS``, a JSON list of ``{"token", "principal", "scope"}``).

The HTTP transport runs on asyncio only: the SDK serves it through uvicorn, which has no trio
backend. stdio runs on both (``--backend trio``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import anyio
import attrs

from plugin.errors import ConfigError

from .errors import McpAuthError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

TOKENS_ENV = "RECALLBOUND_MCP_TOKENS"
_KEYS = {"principal", "scope", "window_ms", "token_file"}


def add_command(commands: Any) -> None:
    """Register ``mcp`` on the ``recallbound`` command's subparsers."""
    mcp = commands.add_parser("mcp", help="serve search_memory and recall_context over MCP")
    mcp.add_argument("--principal", help="the user every stdio call runs as")
    mcp.add_argument("--scope", help="the scope every stdio call runs in")
    mcp.add_argument("--http", metavar="HOST:PORT",
                     help="serve streamable HTTP here (bearer tokens) instead of stdio")
    mcp.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    mcp.add_argument("--config", type=Path, default=None,
                     help="configuration file (default: $RECALLBOUND_CONFIG or ./recallbound.toml)")
    mcp.add_argument("--window-ms", type=float, default=None,
                     help="how long a burst of parallel searches of one run is gathered (ms)")
    mcp.add_argument("--token-file", type=Path, default=None,
                     help="TOML file of [[token]] tables (token, principal, scope) for HTTP")
    mcp.add_argument("--tokens-env", default=TOKENS_ENV,
                     help=f"environment variable holding the HTTP tokens as JSON "
                          f"(default {TOKENS_ENV})")


@attrs.frozen(kw_only=True)
class McpSettings:
    """The server's own settings, after the command line and the ``[mcp]`` table."""

    principal: str | None = None
    scope: str | None = None
    window_s: float = 0.005
    token_file: Path | None = None
    tokens_env: str = TOKENS_ENV
    http: tuple[str, int] | None = None


def _config_file(given: Path | None, env: Mapping[str, str]) -> Path | None:
    if given is not None:
        return given
    named = env.get("RECALLBOUND_CONFIG")
    if named:
        return Path(named)
    default = Path("recallbound.toml")
    return default if default.is_file() else None


def _mcp_table(path: Path | None) -> dict[str, Any]:
    if path is None or not path.is_file():
        return {}  # the hooks' configuration reader reports a missing named file
    try:
        with path.open("rb") as handle:
            table = tomllib.load(handle).get("mcp", {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}  # reported by the hooks' configuration reader
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: mcp must be a table ([mcp])")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key mcp.{unknown[0]} "
                                 f"(known: {', '.join(sorted(_KEYS))})")
    for key in ("principal", "scope", "token_file"):
        if key in table and not isinstance(table[key], str):
            raise ConfigError(f"{path}: mcp.{key} must be a string")
    if "token_file" in table:
        table["token_file"] = path.parent / table["token_file"]
    return table


def _window_s(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        math.isfinite(value) and value >= 0
    ):
        raise ConfigError(f"{where} must be a finite number of milliseconds >= 0")
    return float(value) / 1000


def _http(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--http must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def settings(args: argparse.Namespace, env: Mapping[str, str]) -> McpSettings:
    """The server settings from the parsed command line and the ``[mcp]`` table."""
    table = _mcp_table(_config_file(args.config, env))
    window = (_window_s(args.window_ms, "--window-ms") if args.window_ms is not None
              else _window_s(table["window_ms"], "mcp.window_ms") if "window_ms" in table
              else 0.005)
    return McpSettings(
        principal=args.principal if args.principal is not None else table.get("principal"),
        scope=args.scope if args.scope is not None else table.get("scope"),
        window_s=window,
        token_file=args.token_file if args.token_file is not None else table.get("token_file"),
        tokens_env=args.tokens_env,
        http=_http(args.http) if args.http else None,
    )


async def serve(args: argparse.Namespace, chosen: McpSettings, env: Mapping[str, str]) -> None:
    """Open the hooks from the configuration and serve until the client goes away."""
    from runtime_hooks.bootstrap import RecallConfig, open_hooks

    from .server import RecallServer
    from .trust import Caller, TableTokenVerifier, TokenTable

    config = RecallConfig.from_sources(args.config, env=env)
    if chosen.http is not None:
        table = (TokenTable.from_file(chosen.token_file) if chosen.token_file is not None
                 else TokenTable.from_env(chosen.tokens_env, env))
        async with open_hooks(config) as hooks:
            await _serve_http(RecallServer(hooks, window_s=chosen.window_s),
                              TableTokenVerifier(table), *chosen.http)
        return
    if not chosen.principal or not chosen.scope:
        raise McpAuthError("stdio needs --principal and --scope (or mcp.principal and "
                           "mcp.scope in the configuration file)")
    caller = Caller(principal=chosen.principal, scope=chosen.scope)
    async with open_hooks(config) as hooks:
        from mcp.server.stdio import stdio_server

        server = RecallServer(hooks, caller=caller, window_s=chosen.window_s).server
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


async def _serve_http(server: Any, verifier: Any, host: str, port: int) -> None:
    import uvicorn
    from mcp.server.auth.settings import AuthSettings
    from pydantic import AnyHttpUrl

    authority = f"[{host}]" if ":" in host else host
    app = server.server.streamable_http_app(
        host=host,
        auth=AuthSettings(issuer_url=AnyHttpUrl(f"http://{authority}:{port}"),
                          resource_server_url=None),
        token_verifier=verifier,
    )
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    await uvicorn.Server(config).serve()


def run(args: argparse.Namespace, err: TextIO, env: Mapping[str, str] | None = None) -> int:
    """Run ``recallbound mcp``; returns the exit status."""
    env = os.environ if env is None else env
    chosen = settings(args, env)
    if chosen.http is not None and args.backend == "trio":
        raise ConfigError("--http runs on asyncio only (the SDK serves HTTP through "
                                 "uvicorn, which has no trio backend); use stdio with trio")
    try:
        import mcp.server  # noqa: F401  (the SDK: the mcp extra)
    except ImportError as exc:
        raise ConfigError(f"recallbound mcp needs the mcp extra "
                                 f"(pip install 'recallbound[mcp]'): {exc}") from None
    anyio.run(partial(serve, args, chosen, env), backend=args.backend)
    return 0
