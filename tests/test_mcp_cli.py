"""``recallbound mcp``'s settings, token table and refusals to start (no server runs here)."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path

import pytest

from plugin.errors import ConfigError
from runtime_hooks.__main__ import main
from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.mcp import cli
from runtime_hooks.mcp.errors import McpAuthError
from runtime_hooks.mcp.trust import TokenTable

TOKEN = "s3cret-token-0123456789"


def _run(argv: list[str], monkeypatch: pytest.MonkeyPatch, folder: Path) -> tuple[int, str]:
    monkeypatch.chdir(folder)
    for name in ("RECALLBOUND_CONFIG", "RECALLBOUND_MCP_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RECALLBOUND_LEDGER", str(folder / "ledger.db"))
    monkeypatch.setenv("RECALLBOUND_STORE", str(folder / "store.db"))
    err = io.StringIO()
    return main(argv, stderr=err), err.getvalue()


@pytest.mark.parametrize(("argv", "words"), [
    (["mcp"], "stdio needs --principal and --scope"),
    (["mcp", "--principal", "ana"], "stdio needs --principal and --scope"),
    (["mcp", "--http", "127.0.0.1:8765", "--backend", "trio"], "asyncio only"),
    (["mcp", "--http", "no-port"], "--http must be HOST:PORT"),
    (["mcp", "--http", "127.0.0.1:99999"], "got port '99999'"),
    (["mcp", "--http", "127.0.0.1:" + "9" * 5000], "a port from 0 to 65535"),
    (["mcp", "--http", ":8765"], "no host"),
    (["mcp", "--http", "127.0.0.1:8765"], "RECALLBOUND_MCP_TOKENS is not set"),
    (["mcp", "--principal", "ana", "--scope", "atlas", "--window-ms", "-1"], "--window-ms"),
    (["mcp", "--principal", "ana", "--scope", "atlas", "--window-ms", "1e300"],
     "at most 10000"),
    (["mcp", "--principal", "p" * 600, "--scope", "atlas"], "at most 512 UTF-8 bytes"),
    (["mcp", "--principal", "ana", "--scope", "atlas", "--config", "missing.toml"],
     "does not exist"),
])
def test_a_server_that_cannot_start_says_why_in_one_line(
    argv: list[str], words: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    status, err = _run(argv, monkeypatch, tmp_path)
    assert status == 1
    assert err.startswith("recallbound: ") and words in err and err.count("\n") == 1


def test_the_mcp_table_is_read_and_the_command_line_wins(tmp_path: Path) -> None:
    (tmp_path / "recallbound.toml").write_text(
        'ledger = "l.db"\nstore = "s.db"\n\n[mcp]\nprincipal = "ana"\nscope = "atlas"\n'
        'window_ms = 20\ntoken_file = "tokens.toml"\n'
    )
    parser = _parser()
    env = {"RECALLBOUND_CONFIG": str(tmp_path / "recallbound.toml")}
    chosen = cli.settings(parser.parse_args(["mcp"]), env)
    assert (chosen.principal, chosen.scope, chosen.window_s) == ("ana", "atlas", 0.02)
    assert chosen.token_file == tmp_path / "tokens.toml"
    chosen = cli.settings(parser.parse_args(["mcp", "--scope", "other", "--window-ms", "0"]), env)
    assert (chosen.principal, chosen.scope, chosen.window_s) == ("ana", "other", 0.0)
    # the hooks' own reader leaves the [mcp] table alone
    config = RecallConfig.from_sources(tmp_path / "recallbound.toml", env={})
    assert Path(config.ledger_path) == tmp_path / "l.db"


def test_an_unknown_mcp_key_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "recallbound.toml").write_text('[mcp]\nprincipial = "ana"\n')
    one_format = r"^unknown setting 'mcp\.principial' \(in .*\); did you mean 'mcp\.principal'\?$"
    with pytest.raises(ConfigError, match=one_format):
        cli.settings(_parser().parse_args(["mcp", "--config", str(tmp_path / "recallbound.toml")]),
                     {})


def test_the_server_s_own_variables_never_reach_the_hooks_configuration(
    tmp_path: Path,
) -> None:
    from runtime_hooks.config import load_config

    env = {"RECALLBOUND_MCP_TOKENS": "[]", "RECALLBOUND_LEDGER": "l.db", "HOME": "/h"}
    loaded = load_config(env=env, cwd=tmp_path)
    assert "RECALLBOUND_MCP_TOKENS" not in repr(loaded)


def _parser() -> argparse.ArgumentParser:
    from runtime_hooks.__main__ import _parser

    return _parser()


@pytest.mark.parametrize(("entries", "words"), [
    ([], "no token entries"),
    ([{"token": "short", "principal": "ana", "scope": "atlas"}], "at least 16"),
    ([{"token": TOKEN, "principal": "ana"}], "exactly 'token', 'principal', 'scope'"),
    ([{"token": TOKEN, "principal": "", "scope": "atlas"}], "principal must be"),
    ([{"token": TOKEN, "principal": "ana", "scope": "atlas"},
      {"token": TOKEN, "principal": "bo", "scope": "atlas"}], "appears twice"),
])
def test_a_bad_token_table_is_refused_without_showing_a_token(
    entries: list[object], words: str
) -> None:
    with pytest.raises(McpAuthError) as caught:
        TokenTable.from_entries(entries, source="test")
    assert words in str(caught.value) and TOKEN not in str(caught.value)


def test_a_token_file_maps_tokens_to_callers_and_keeps_no_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(f'[[token]]\ntoken = "{TOKEN}"\nprincipal = "ana"\nscope = "atlas"\n')
    table = TokenTable.from_file(path)
    caller = table.caller(TOKEN)
    assert caller is not None and (caller.principal, caller.scope) == ("ana", "atlas")
    assert table.caller(TOKEN + "x") is None and table.caller("") is None
    assert TOKEN not in repr(table)
    path.write_text("token = 1\n")
    with pytest.raises(McpAuthError, match=r"\[\[token\]\] tables only"):
        TokenTable.from_file(path)
    with pytest.raises(McpAuthError, match="not valid JSON"):
        TokenTable.from_env("T", {"T": "{"})


def test_importing_the_package_and_the_command_imports_no_sdk() -> None:
    code = (
        "import sys, runtime_hooks, runtime_hooks.mcp, runtime_hooks.__main__ as m; m._parser(); "
        "bad = [n for n in sys.modules if n == 'mcp' or n.startswith(('mcp.', 'mcp_types'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_runs_memory_and_http_settings_are_read_and_checked(tmp_path: Path) -> None:
    config = tmp_path / "recallbound.toml"
    config.write_text('[mcp]\nmax_runs_per_hour = 5\nmax_memory_bytes = 100\n'
                      'allowed_hosts = ["memory.example.org"]\n'
                      'allowed_origins = ["https://app.example.org"]\n')
    env = {"RECALLBOUND_CONFIG": str(config)}
    chosen = cli.settings(_parser().parse_args(
        ["mcp", "--allow-host", "proxy.local:*", "--allow-origin", "http://proxy.local"]), env)
    assert (chosen.max_runs_per_hour, chosen.max_memory_bytes, chosen.looser) == (5, 100, ())
    assert chosen.allowed_hosts == ("memory.example.org", "proxy.local:*")
    assert chosen.allowed_origins == ("https://app.example.org", "http://proxy.local")
    for bad in ("max_runs_per_hour = 0", "max_runs_per_hour = true",
                'max_memory_bytes = "8k"', 'allowed_hosts = "x"', "allowed_origins = [1]"):
        config.write_text(f"[mcp]\n{bad}\n")
        with pytest.raises(ConfigError, match=r"mcp\."):
            cli.settings(_parser().parse_args(["mcp"]), env)


def test_more_runs_per_hour_than_the_default_needs_allow_looser_policy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "recallbound.toml").write_text("[mcp]\nmax_runs_per_hour = 61\n")
    status, err = _run(["mcp", "--principal", "ana", "--scope", "atlas"], monkeypatch, tmp_path)
    assert status == 1 and "mcp.max_runs_per_hour" in err and "allow_looser_policy" in err


@pytest.mark.parametrize(("bind", "hosts"), [
    ("0.0.0.0", {"127.0.0.1:*", "localhost:*", "[::1]:*"}),
    ("10.1.2.3", {"127.0.0.1:*", "localhost:*", "[::1]:*", "10.1.2.3:*"}),
])
def test_host_checks_accept_loopback_and_a_specific_bind_only(bind: str, hosts: set[str]) -> None:
    security = cli.transport_security(bind, 8765)
    assert security.enable_dns_rebinding_protection
    assert {h for h in security.allowed_hosts if h.endswith(":*")} == hosts
    assert "0.0.0.0:*" not in security.allowed_hosts


def test_every_mcp_key_can_come_from_the_environment_over_the_file(tmp_path: Path) -> None:
    config = tmp_path / "recallbound.toml"
    config.write_text('[mcp]\nprincipal = "ana"\nscope = "atlas"\nmax_runs_per_hour = 5\n')
    env = {"RECALLBOUND_CONFIG": str(config), "RECALLBOUND_MCP_SCOPE": "beacon",
           "RECALLBOUND_MCP_MAX_RUNS_PER_HOUR": "2", "RECALLBOUND_MCP_WINDOW_MS": "50",
           "RECALLBOUND_MCP_MAX_MEMORY_BYTES": "100",
           "RECALLBOUND_MCP_ALLOWED_HOSTS": "memory.example.org, proxy.local:*",
           "RECALLBOUND_MCP_TOKENS": "[]"}
    chosen = cli.settings(_parser().parse_args(["mcp"]), env)
    assert (chosen.principal, chosen.scope, chosen.max_runs_per_hour) == ("ana", "beacon", 2)
    assert (chosen.window_s, chosen.max_memory_bytes) == (0.05, 100)
    assert chosen.allowed_hosts == ("memory.example.org", "proxy.local:*")
    chosen = cli.settings(_parser().parse_args(["mcp", "--scope", "cli"]), env)
    assert chosen.scope == "cli"  # the command line over the environment


def test_the_default_window_is_the_servers(tmp_path: Path) -> None:
    from runtime_hooks.mcp.window import DEFAULT_WINDOW_S

    assert cli.settings(_parser().parse_args(["mcp"]), {}).window_s == DEFAULT_WINDOW_S


@pytest.mark.parametrize(("name", "value", "words"), [
    ("RECALLBOUND_MCP_MAX_RUNS_PER_HUOR", "2", "did you mean 'RECALLBOUND_MCP_MAX_RUNS_PER_HOUR'"),
    ("RECALLBOUND_MCP_MAX_RUNS_PER_HOUR", "two", "must be an integer"),
    ("RECALLBOUND_MCP_MAX_RUNS_PER_HOUR", "0", "must be an integer >= 1"),
    ("RECALLBOUND_MCP_WINDOW_MS", "soon", "milliseconds"),
    ("RECALLBOUND_MCP_WINDOW_MS", "-1", "milliseconds"),
    ("RECALLBOUND_MCP_MAX_MEMORY_BYTES", "1_000", "must be an integer"),
    ("RECALLBOUND_MCP_MAX_MEMORY_BYTES", " 100", "must be an integer"),
    ("RECALLBOUND_MCP_MAX_MEMORY_BYTES", "\u0967\u0968\u0969", "must be an integer"),
    ("RECALLBOUND_MCP_WINDOW_MS", "5_0", "milliseconds"),
    ("RECALLBOUND_MCP_ALLOWED_ORIGINS", "https://a.example,,", "non-empty strings"),
])
def test_a_bad_or_unknown_mcp_variable_is_an_error(name: str, value: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        cli.settings(_parser().parse_args(["mcp"]), {name: value})


def test_more_runs_per_hour_from_the_environment_needs_allow_looser_policy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RECALLBOUND_MCP_MAX_RUNS_PER_HOUR", "61")
    status, err = _run(["mcp", "--principal", "ana", "--scope", "atlas"], monkeypatch, tmp_path)
    assert status == 1 and "mcp.max_runs_per_hour" in err and "allow_looser_policy" in err


def test_the_configuration_refuses_what_the_server_would(tmp_path: Path) -> None:
    from runtime_hooks.config import load_config

    config = tmp_path / "recallbound.toml"
    config.write_text('ledger = "l.db"\n\n[mcp]\nbogus = 1\n')
    with pytest.raises(ConfigError, match=r"mcp\.bogus"):
        load_config(config, env={}, cwd=tmp_path)
    config.write_text('ledger = "l.db"\n\n[mcp]\nmax_runs_per_hour = 0\n')
    with pytest.raises(ConfigError, match=r"mcp\.max_runs_per_hour"):
        load_config(config, env={}, cwd=tmp_path)
    config.write_text('ledger = "l.db"\n\n[mcp]\nprincipal = "ana"\n')
    env = {"RECALLBOUND_MCP_BOGUS": "1"}
    with pytest.raises(ConfigError, match="RECALLBOUND_MCP_BOGUS"):
        load_config(config, env=env, cwd=tmp_path)
    # the server's good settings and token tables (any name) pass, and are never shown
    env = {"RECALLBOUND_MCP_SCOPE": "atlas", "RECALLBOUND_MCP_TOKENS": "[]",
           "RECALLBOUND_MCP_TOKENS_STAGING": "[]"}
    loaded = load_config(config, env=env, cwd=tmp_path)
    assert "RECALLBOUND_MCP" not in repr(loaded)


def test_a_token_variable_of_any_name_is_the_servers_not_a_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--tokens-env`` may name a variable under ``RECALLBOUND_MCP_``: it is read as the token
    table (here an empty one, refused as such), never checked as an unknown setting."""
    monkeypatch.setenv("RECALLBOUND_MCP_ANA_TOKENS", "[]")
    status, err = _run(["mcp", "--http", "127.0.0.1:8765", "--tokens-env",
                        "RECALLBOUND_MCP_ANA_TOKENS"], monkeypatch, tmp_path)
    assert status == 1 and "no token entries" in err and "unknown" not in err
