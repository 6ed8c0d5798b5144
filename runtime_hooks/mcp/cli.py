"""``recallbound mcp``: serve the tools over stdio (default) or streamable HTTP.

Settings, highest precedence first: the command line, the environment
(``RECALLBOUND_MCP_<KEY>`` for each ``[mcp]`` key; lists comma-separated; any other
``RECALLBOUND_MCP_`` variable but the tokens' is an error), the ``[mcp]`` table of the
configuration file (``--config``, else ``$RECALLBOUND_CONFIG``, else ``recallbound.toml`` in
the working folder), defaults. The ledger, the store and the policy come from the same
configuration as the hooks (:meth:`RecallConfig.from_sources
<runtime_hooks.bootstrap.RecallConfig.from_sources>`); a ledger or store that nothing names is
kept in :func:`data_folder` (``~/.local/share/recallbound``, created on first use), beside the
store ``recallbound memory`` writes to, so a desktop client's bare command line works.

``[mcp]`` keys: ``principal``, ``scope`` (stdio), ``window_ms`` (the batch window),
``max_runs_per_hour`` (runs a principal and scope may open an hour, counted in the ledger;
default 60, more needs ``allow_looser_policy = true``), ``max_memory_bytes`` (the longest text
``remember`` stores; default 8 KiB, at most the store's 64 KiB), ``token_file`` (HTTP;
relative to the file's folder), ``allowed_hosts`` and ``allowed_origins`` (HTTP: the ``Host``
and ``Origin`` headers accepted besides the loopback names and the bound address; ``"name:*"``
for any port). HTTP tokens come
from ``--token-file`` or ``token_file``, else from the environment variable named by
``--tokens-env`` (default ``RECALLBOUND_MCP_TOKENS``, a JSON list of ``{"token", "principal",
"scope"}``).

The HTTP transport runs on asyncio only: the SDK serves it through uvicorn, which has no trio
backend. stdio runs on both (``--backend trio``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import anyio
import attrs

from plugin.errors import ConfigError
from plugin.memory.store.values import MAX_MEMORY_TEXT_BYTES

from ..config_fields import FLOAT_TEXT, INT_TEXT, unknown_setting
from .errors import McpAuthError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

TOKENS_ENV = "RECALLBOUND_MCP_TOKENS"
_KEYS = {"principal", "scope", "window_ms", "token_file", "max_runs_per_hour",
         "max_memory_bytes", "allowed_hosts", "allowed_origins"}
DEFAULT_MAX_MEMORY_BYTES = 8 * 1024
"""The longest memory text ``remember`` stores (UTF-8 bytes) unless configured otherwise."""
DEFAULT_MAX_RUNS_PER_HOUR = 60
"""Runs a (principal, scope) may open an hour; more widens a bound (``allow_looser_policy``)."""
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_command(commands: Any) -> None:
    """Register ``mcp`` on the ``recallbound`` command's subparsers."""
    mcp = commands.add_parser("mcp", help="serve search_memory and recall_context over MCP")
    mcp.add_argument("--principal", help="the user every stdio call runs as")
    mcp.add_argument("--scope", help="the scope every stdio call runs in")
    mcp.add_argument("--http", metavar="HOST:PORT",
                     help="serve streamable HTTP here (bearer tokens) instead of stdio; port 0 "
                          "picks a free one (the address served is printed)")
    mcp.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    mcp.add_argument("--config", type=Path, default=None,
                     help="configuration file (default: $RECALLBOUND_CONFIG or ./recallbound.toml)")
    mcp.add_argument("--window-ms", type=float, default=None,
                     help="how long a burst of parallel searches of one run is gathered, "
                          "and the most a lone search waits (ms; 0: never wait)")
    mcp.add_argument("--token-file", type=Path, default=None,
                     help="TOML file of [[token]] tables (token, principal, scope) for HTTP")
    mcp.add_argument("--allow-host", action="append", default=None, metavar="HOST[:PORT]",
                     help="HTTP: also accept this Host header (repeatable; 'name:*' any port)")
    mcp.add_argument("--allow-origin", action="append", default=None, metavar="ORIGIN",
                     help="HTTP: also accept this Origin header (repeatable)")
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
    max_runs_per_hour: int = 60
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    looser: tuple[str, ...] = ()
    """Settings that widen a bound (they need ``allow_looser_policy``)."""


def _config_file(given: Path | None, env: Mapping[str, str]) -> Path | None:
    if given is not None:
        return given
    named = env.get("RECALLBOUND_CONFIG")
    if named:
        return Path(named)
    default = Path("recallbound.toml")
    return default if default.is_file() else None


def _check_table(table: Mapping[str, Any], where: Callable[[str], str]) -> None:
    """Each known key's type and range; ``where(key)`` names the key in an error."""
    for key in ("principal", "scope", "token_file"):
        if key in table and not isinstance(table[key], str):
            raise ConfigError(f"{where(key)} must be a string")
    for key in ("max_runs_per_hour", "max_memory_bytes"):
        value = table.get(key)
        if key in table and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{where(key)} must be an integer >= 1")
    if table.get("max_memory_bytes", 0) > MAX_MEMORY_TEXT_BYTES:  # the store keeps no more
        raise ConfigError(f"{where('max_memory_bytes')} must be at most {MAX_MEMORY_TEXT_BYTES} "
                          "(the longest text the memory store holds)")
    for key in ("allowed_hosts", "allowed_origins"):
        value = table.get(key)
        if key in table and not (isinstance(value, list)
                                 and all(isinstance(v, str) and v.strip() for v in value)):
            raise ConfigError(f"{where(key)} must be a list of non-empty strings")


def check_settings(table: object, path: Path, env: Mapping[str, str]) -> None:
    """Check a configuration file's ``[mcp]`` table (``None`` when it has none) and the
    environment's ``RECALLBOUND_MCP_`` variables as the server would read them: the general
    configuration reader calls this, so ``config show`` and the hooks refuse what the server
    would. Raises :class:`~plugin.errors.ConfigError` naming the key and where it came from."""
    if table is not None:
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: mcp must be a table ([mcp])")
        unknown = sorted(set(table) - _KEYS)
        if unknown:
            raise unknown_setting(f"mcp.{unknown[0]}", f"in {path.resolve()}",
                                  [f"mcp.{key}" for key in sorted(_KEYS)])
        _check_table(table, lambda key: f"{path}: mcp.{key}")
    _mcp_env(env, TOKENS_ENV)


def _mcp_table(path: Path | None) -> dict[str, Any]:
    if path is None or not path.is_file():
        return {}  # the hooks' configuration reader reports a missing named file
    try:
        with path.open("rb") as handle:
            table = tomllib.load(handle).get("mcp", {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}  # reported by the hooks' configuration reader
    check_settings(table, path, {})
    assert isinstance(table, dict)
    if "token_file" in table:
        table["token_file"] = path.parent / table["token_file"]
    return table


ENV_PREFIX = "RECALLBOUND_MCP_"
_ENV_KEYS = {f"{ENV_PREFIX}{key.upper()}": key for key in _KEYS}
"""``RECALLBOUND_MCP_<KEY>`` for each ``[mcp]`` key (a desktop client configures its server
through the environment it starts it with)."""


def _mcp_env(env: Mapping[str, str], tokens_env: str) -> dict[str, Any]:
    """The ``[mcp]`` keys the environment sets: numbers parsed, lists comma-separated, a token
    file relative to the working folder. Any other ``RECALLBOUND_MCP_`` variable than these
    and the tokens' is an error (a misspelt setting is never silently ignored)."""
    table: dict[str, Any] = {}
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX) or name in (TOKENS_ENV, tokens_env):
            continue
        key = _ENV_KEYS.get(name)
        if key is None:
            raise unknown_setting(name, "environment variable", sorted([*_ENV_KEYS, TOKENS_ENV]))
        if key in ("max_runs_per_hour", "max_memory_bytes"):  # plain decimal, as elsewhere
            if not INT_TEXT.fullmatch(text):
                raise ConfigError(f"environment variable {name} must be an integer >= 1, "
                                  f"got {text!r}")
            table[key] = int(text)
        elif key == "window_ms":
            if not FLOAT_TEXT.fullmatch(text):
                raise ConfigError(f"environment variable {name} must be a number of "
                                  f"milliseconds, got {text!r}")
            table[key] = float(text)
        elif key in ("allowed_hosts", "allowed_origins"):
            table[key] = [item.strip() for item in text.split(",")]
        else:
            table[key] = text
    _check_table(table, lambda key: f"environment variable {ENV_PREFIX}{key.upper()}")
    if "token_file" in table:
        table["token_file"] = Path(table["token_file"])
    return table


MAX_WINDOW_MS = 10_000
"""The longest batch window: a run's whole default deadline (a longer one would wait it out)."""


def _window_s(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        math.isfinite(value) and 0 <= value <= MAX_WINDOW_MS
    ):
        raise ConfigError(f"{where} must be a number of milliseconds from 0 to at most "
                          f"{MAX_WINDOW_MS}")
    return float(value) / 1000


def _http(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host:
        raise ConfigError("--http must be HOST:PORT: no host before the last ':'")
    # The port alone is echoed: the whole value reads as a URI, whose text an error never shows.
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) < 65536):
        raise ConfigError(f"--http must be HOST:PORT with a port from 0 to 65535, got port "
                          f"{port[:16]!r}")
    return host.strip("[]"), int(port)


def settings(args: argparse.Namespace, env: Mapping[str, str]) -> McpSettings:
    """The server settings from the parsed command line and the ``[mcp]`` table."""
    from .window import DEFAULT_WINDOW_S

    # The environment over the file (as for every other setting); the command line over both.
    table = {**_mcp_table(_config_file(args.config, env)), **_mcp_env(env, args.tokens_env)}
    window = (_window_s(args.window_ms, "--window-ms") if args.window_ms is not None
              else _window_s(table["window_ms"], "mcp.window_ms") if "window_ms" in table
              else DEFAULT_WINDOW_S)
    runs = int(table.get("max_runs_per_hour", DEFAULT_MAX_RUNS_PER_HOUR))
    return McpSettings(
        max_runs_per_hour=runs,
        max_memory_bytes=int(table.get("max_memory_bytes", DEFAULT_MAX_MEMORY_BYTES)),
        allowed_hosts=(*table.get("allowed_hosts", ()), *(args.allow_host or ())),
        allowed_origins=(*table.get("allowed_origins", ()), *(args.allow_origin or ())),
        looser=("mcp.max_runs_per_hour",) if runs > DEFAULT_MAX_RUNS_PER_HOUR else (),
        principal=args.principal if args.principal is not None else table.get("principal"),
        scope=args.scope if args.scope is not None else table.get("scope"),
        window_s=window,
        token_file=args.token_file if args.token_file is not None else table.get("token_file"),
        tokens_env=args.tokens_env,
        http=_http(args.http) if args.http else None,
    )


def data_folder(env: Mapping[str, str]) -> Path:
    """``$XDG_DATA_HOME/recallbound``, or ``~/.local/share/recallbound``: where a server that
    was given no ledger or store keeps them (the folder ``recallbound memory`` writes to)."""
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    base = env.get("XDG_DATA_HOME", "")
    if not os.path.isabs(base):  # relative or unset: ignored, as the XDG specification says
        base = str(home / ".local" / "share")
    return Path(base) / "recallbound"


def _first_use(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, object]:
    """The ledger and store in :func:`data_folder` (created now) when none is configured."""
    from runtime_hooks.config import load_config

    values = load_config(args.config, env=env).values
    missing = [key for key in ("ledger", "store") if values.get(key) is None]
    if not missing:
        return {}
    folder = data_folder(env)
    folder.mkdir(parents=True, exist_ok=True)
    files = {"ledger": folder / "ledger.db", "store": folder / "memory.db"}
    return {key: str(files[key]) for key in missing}


async def serve(args: argparse.Namespace, chosen: McpSettings, env: Mapping[str, str],
                err: TextIO = sys.stderr) -> None:
    """Open the hooks from the configuration and serve until the client goes away."""
    from runtime_hooks.bootstrap import RecallConfig, open_hooks

    from .server import RecallServer
    from .trust import Caller, TableTokenVerifier, TokenTable

    # The token table's variable is the server's secret, whatever its name: not a setting.
    settings_env = {name: text for name, text in env.items() if name != chosen.tokens_env}
    config = RecallConfig.from_sources(args.config, env=settings_env,
                                       overrides=_first_use(args, settings_env))
    if chosen.looser and not config.allow_looser_policy:
        raise ConfigError(f"{chosen.looser[0]} above its default widens a bound: it "
                                 f"needs allow_looser_policy = true")
    options: dict[str, Any] = {"window_s": chosen.window_s,
                               "max_runs_per_hour": chosen.max_runs_per_hour,
                               "max_memory_bytes": chosen.max_memory_bytes}
    if chosen.http is not None:
        table = (TokenTable.from_file(chosen.token_file) if chosen.token_file is not None
                 else TokenTable.from_env(chosen.tokens_env, env))
        async with open_hooks(config) as hooks:
            await _serve_http(RecallServer(hooks, **options), TableTokenVerifier(table),
                              chosen, err)
        return
    if not chosen.principal or not chosen.scope:
        raise McpAuthError("stdio needs --principal and --scope (or mcp.principal and "
                           "mcp.scope in the configuration file)")
    caller = Caller(principal=chosen.principal, scope=chosen.scope)
    async with open_hooks(config) as hooks:
        await RecallServer(hooks, caller=caller, **options).serve_stdio()


def _authority(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def transport_security(host: str, port: int, hosts: tuple[str, ...] = (),
                       origins: tuple[str, ...] = ()) -> Any:
    """The ``Host`` and ``Origin`` checks of an HTTP server bound to ``host``, on every bind.

    Accepted: the loopback names, the bound address itself unless it is a wildcard
    (``0.0.0.0``, ``::``), and ``hosts``/``origins`` (``"name:*"`` is any port). Everything
    else is refused before any tool runs (DNS rebinding, a web page's cross-site request).
    """
    from mcp.server.transport_security import TransportSecuritySettings

    names = list(_LOOPBACK)
    if host not in ("0.0.0.0", "::", "") and host not in names:
        names.append(host)
    allowed_hosts = [f"{_authority(name)}:*" for name in names]
    allowed_hosts += [_authority(name) for name in names]
    # An origin on its scheme's default port carries no port (``http://localhost``).
    allowed_origins = [f"{scheme}://{_authority(name)}{suffix}" for name in names
                       for scheme in ("http", "https") for suffix in (":*", "")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*allowed_hosts, *hosts],
        allowed_origins=[*allowed_origins, *origins],
    )


async def _serve_http(server: Any, verifier: Any, chosen: McpSettings, err: TextIO) -> None:
    import uvicorn
    from mcp.server.auth.settings import AuthSettings
    from pydantic import AnyHttpUrl

    from .http_ids import RequestIdCheck, admitted_by
    from .listen import listen

    assert chosen.http is not None
    host, port = chosen.http
    authority = _authority(host)
    security = transport_security(host, port, chosen.allowed_hosts, chosen.allowed_origins)
    app = server.server.streamable_http_app(
        host=host,
        auth=AuthSettings(issuer_url=AnyHttpUrl(f"http://{authority}:{port}"),
                          resource_server_url=None),
        token_verifier=verifier,
        transport_security=security,
    )
    app = RequestIdCheck(app, admitted_by(security, verifier))
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    web = uvicorn.Server(config)

    async def announce() -> None:
        while not web.started:
            if web.should_exit:
                return
            await anyio.sleep(0.01)
        bound = [s.getsockname() for listener in web.servers for s in listener.sockets]
        real_port = bound[0][1] if bound else port
        if host not in _LOOPBACK:
            err.write(f"recallbound: warning: serving plain HTTP on {host}, off the loopback "
                      f"interface: bearer tokens and memories cross the network unencrypted; "
                      f"put a TLS proxy in front\n")
        err.write(f"recallbound: MCP over streamable HTTP at http://{authority}:{real_port}/mcp\n")
        err.flush()

    sockets = listen(host, port)  # a bind that fails is one line, before anything starts
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(announce)
            await web.serve(sockets=sockets)
            tasks.cancel_scope.cancel()
    finally:
        for sock in sockets:
            sock.close()


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
    anyio.run(partial(serve, args, chosen, env, err), backend=args.backend)
    return 0
