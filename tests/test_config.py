"""Configuration: precedence, sources, strict validation, ``config show``; the bootstrap."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugin.control import AllowancePolicy, RoundKind, SqliteLedger, observe
from plugin.control.dsn import parse_location
from plugin.errors import LedgerConfigError
from plugin.memory.pipeline import ContextCaps
from plugin.memory.planning import QueryStrategy
from runtime_hooks.__main__ import main
from runtime_hooks.bootstrap import RecallConfig, Semantic, Telemetry, open_hooks
from runtime_hooks.config import ConfigError, Source, load_config

TOML = """\
ledger = "data/ledger.db"
store = "data/store.db"
query_planning = "task_context"
legacy = false
allow_looser_policy = true

[policy]
max_searches = 6
deadline_s = 20

[caps]
max_items = 5
"""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory with no RECALLBOUND_* variable set."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write(folder: Path, text: str, name: str = "recallbound.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


# -- sources and precedence --------------------------------------------------------------------


def test_defaults_with_no_file_and_no_environment(folder: Path) -> None:
    loaded = load_config(env={})
    assert loaded.file is None
    assert loaded.values["policy.max_searches"] == 4
    assert {s.kind for s in loaded.sources.values()} == {"default"}
    with pytest.raises(ConfigError, match=r"ledger is not configured: set 'ledger' in "
                                          r"recallbound\.toml or RECALLBOUND_LEDGER"):
        loaded.recall_config()


def test_the_file_in_the_working_directory_is_read(folder: Path) -> None:
    path = _write(folder, TOML)
    config = RecallConfig.from_sources(env={})
    assert config == RecallConfig(
        ledger_path=str(folder / "data/ledger.db"), store_path=str(folder / "data/store.db"),
        policy=AllowancePolicy(max_searches=6, deadline_s=20.0),
        query_planning=QueryStrategy.TASK_CONTEXT, caps=ContextCaps(max_items=5),
        allow_looser_policy=True,
    )
    loaded = load_config(env={})
    assert loaded.file == path
    assert loaded.sources["policy.max_searches"] == Source(
        "file", f"{path}: policy.max_searches")
    assert loaded.sources["policy.max_rounds"] == Source("default")


def test_precedence_explicit_over_env_over_file_over_default(folder: Path) -> None:
    _write(folder, TOML)
    env = {"RECALLBOUND_POLICY_MAX_SEARCHES": "8", "RECALLBOUND_POLICY_MAX_ROUNDS": "3",
           "RECALLBOUND_SEMANTIC": "hashing"}
    loaded = load_config(env=env, overrides={"policy.max_searches": 9})
    v, s = loaded.values, loaded.sources
    assert (v["policy.max_searches"], s["policy.max_searches"].kind) == (9, "explicit")
    assert (v["policy.max_rounds"], s["policy.max_rounds"]) == (
        3, Source("env", "RECALLBOUND_POLICY_MAX_ROUNDS"))
    assert (v["policy.deadline_s"], s["policy.deadline_s"].kind) == (20.0, "file")
    assert (v["policy.automatic_slots"], s["policy.automatic_slots"].kind) == (2, "default")
    assert v["semantic"] is Semantic.HASHING
    config = loaded.recall_config()
    assert config.policy == AllowancePolicy(max_searches=9, max_rounds=3, deadline_s=20.0)


def test_an_explicit_file_and_recallbound_config(folder: Path) -> None:
    _write(folder, 'ledger = "from-default.db"\n')
    other = _write(folder, 'ledger = "/abs/from-named.db"\n', name="other.toml")
    assert load_config(other, env={}).values["ledger"] == "/abs/from-named.db"
    named = load_config(env={"RECALLBOUND_CONFIG": str(other)})
    assert (named.file, named.values["ledger"]) == (other, "/abs/from-named.db")
    with pytest.raises(ConfigError, match=r"'.*missing.toml' \(given explicitly\) does not"):
        load_config(folder / "missing.toml", env={})
    with pytest.raises(ConfigError, match=r"'nope.toml' \(from RECALLBOUND_CONFIG\) does not"):
        load_config(env={"RECALLBOUND_CONFIG": "nope.toml"})


@pytest.mark.anyio
async def test_a_relative_file_uri_in_the_file_names_one_ledger_from_any_working_folder(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = folder / "shared dir"
    shared.mkdir()
    path = _write(shared, 'ledger = "file:ledger.db?mode=rwc"\nstore = "file:/abs/m.db"\n')
    grants = []
    for worker in ("a", "b"):  # two workers, each started in a folder of its own
        (folder / worker).mkdir()
        monkeypatch.chdir(folder / worker)
        loaded = load_config(path, env={})
        assert loaded.values["ledger"] == f"file:{folder}/shared%20dir/ledger.db?mode=rwc"
        assert loaded.values["store"] == "file:/abs/m.db"
        async with SqliteLedger(loaded.values["ledger"]) as ledger:
            grant = await ledger.reserve("run", RoundKind.DELIBERATE, 4, AllowancePolicy(),
                                         1_800_000_000.0)
            grants.append(getattr(grant, "slots", 0))
    assert grants == [4, 0]  # one allowance: the second worker finds it spent
    assert sorted(p.name for p in shared.iterdir() if p.suffix == ".db") == ["ledger.db"]


def test_paths_in_the_environment_are_relative_to_the_working_directory(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # taken at load time: a later chdir (a library that daemonises) does not move the ledger
    _write(folder, TOML)
    loaded = load_config(env={"RECALLBOUND_LEDGER": "here.db"})
    monkeypatch.chdir("/")
    assert loaded.values["ledger"] == str(folder / "here.db")
    uri = load_config(env={"RECALLBOUND_LEDGER": "file:here.db?mode=rwc"}, cwd=folder)
    assert uri.values["ledger"] == f"file:{folder}/here.db?mode=rwc"
    given = load_config(env={}, overrides={"ledger": "there.db"}, cwd=folder)
    assert given.values["ledger"] == str(folder / "there.db")
    dsn = load_config(env={"RECALLBOUND_LEDGER": "postgresql://u:pw@db/recall"})
    assert dsn.values["ledger"] == "postgresql://u:pw@db/recall"


def test_a_dsn_in_the_file_is_kept_as_written(folder: Path) -> None:
    _write(folder, 'ledger = "postgresql://db/recall"\n')
    assert load_config(env={}).values["ledger"] == "postgresql://db/recall"


# -- validation: field and source named, nothing coerced ---------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('legacy = "false"\n', r"legacy from .*recallbound.toml: legacy: must be a boolean "
                               r"\(true or false\), got str 'false'"),
        ("legacy = 1\n", r"legacy from .*: legacy: must be a boolean"),
        ("[policy]\nmax_searches = 4.0\n", r"policy.max_searches from .*recallbound.toml: "
                                           r"policy.max_searches: must be an integer"),
        ("[policy]\nmax_searches = true\n", r"policy.max_searches .* must be an integer, "
                                            r"got bool True"),
        ('[policy]\ndeadline_s = "10"\n', r"policy.deadline_s .* must be a number"),
        ('query_planning = "smart"\n', r"query_planning .* must be one of 'baseline', "
                                       r"'task_context', got 'smart'"),
        ("ledger = 3\n", r"ledger from .*: ledger: must be a string"),
        ('ledger = ""\n', r"ledger .* must be a non-empty string"),
        ("[policy]\nmax_search = 4\n", r"unknown setting 'policy.max_search' \(in .*"
                                         r"recallbound.toml\); did you mean "
                                         r"'policy.max_searches'\?"),
        ("polcy = 1\n", r"unknown setting 'polcy' \(in .*\); did you mean 'policy'\?"),
        ("policy = 4\n", r"recallbound.toml: policy must be a table \(\[policy\]\), got int"),
        ("[policy]\nmax_searches = 0\n",
         r"policy.max_searches from file \(.*recallbound.toml: policy.max_searches\): "),
        ("[policy]\nmax_searches = 2\nautomatic_slots = 3\n",
         r"policy.max_searches from file .*; policy.automatic_slots from file"),
        ("[policy]\ndeadline_s = nan\n", r"policy.deadline_s from file"),
        ("[caps]\nmax_bytes = -1\n", r"caps.max_bytes from file"),
        ("admission_timeout_s = 0\n", r"admission_timeout_s from file .* finite and > 0"),
        ("ledger = [\n", r"recallbound.toml: not valid TOML"),
    ],
)
def test_bad_file_values_name_the_key_and_the_file(folder: Path, text: str,
                                                   message: str) -> None:
    _write(folder, text)
    with pytest.raises(ConfigError, match=message):
        load_config(env={})


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RECALLBOUND_LEGACY", "1", "legacy from RECALLBOUND_LEGACY: must be exactly 'true' or "
                                    "'false', got '1'"),
        ("RECALLBOUND_LEGACY", "True", "must be exactly 'true' or 'false', got 'True'"),
        ("RECALLBOUND_LEGACY", "yes", "got 'yes'"),
        ("RECALLBOUND_LEGACY", "", "got ''"),
        ("RECALLBOUND_POLICY_MAX_SEARCHES", "4.0",
         "policy.max_searches from RECALLBOUND_POLICY_MAX_SEARCHES: must be a decimal integer"),
        ("RECALLBOUND_POLICY_MAX_SEARCHES", "1_000", "must be a decimal integer"),
        ("RECALLBOUND_POLICY_MAX_SEARCHES", " 4", "must be a decimal integer"),
        ("RECALLBOUND_POLICY_DEADLINE_S", "inf", "policy.deadline_s from "
                                                 "RECALLBOUND_POLICY_DEADLINE_S: must be a "
                                                 "decimal number"),
        ("RECALLBOUND_POLICY_DEADLINE_S", "-5", r"policy.deadline_s from env"),
        ("RECALLBOUND_SEMANTIC", "WordLlama", "semantic from RECALLBOUND_SEMANTIC: must be one "
                                              "of"),
        ("RECALLBOUND_TELEMETRY", "on", "telemetry from RECALLBOUND_TELEMETRY"),
        ("RECALLBOUND_LEDGER", "", "ledger from RECALLBOUND_LEDGER: must be a non-empty"),
        ("RECALLBOUND_POLICY_MAX_SEARCH", "4", "unknown setting 'RECALLBOUND_POLICY_MAX_SEARCH' "
                                               "(environment variable); did you mean "
                                               "'RECALLBOUND_POLICY_MAX_SEARCHES'?"),
    ],
)
def test_bad_environment_values_name_the_key_and_the_variable(
    folder: Path, name: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(env={name: value})
    assert message in str(raised.value) or __import__("re").search(message, str(raised.value))


def test_environment_booleans_parse_exactly(folder: Path) -> None:
    allow = {"RECALLBOUND_ALLOW_LOOSER_POLICY": "true"}
    assert load_config(env={"RECALLBOUND_LEGACY": "true", **allow}).values["legacy"] is True
    assert load_config(env={"RECALLBOUND_LEGACY": "false"}).values["legacy"] is False


def test_explicit_values_are_checked_too(folder: Path) -> None:
    with pytest.raises(ConfigError, match="legacy from argument legacy: must be a boolean"):
        load_config(env={}, overrides={"legacy": "false"})
    with pytest.raises(ConfigError, match=r"^unknown setting 'polcy' \(argument\)$"):
        load_config(env={}, overrides={"polcy": 1})
    with pytest.raises(ConfigError, match=r"^unknown setting 'policy.max_serches' \(argument\); "
                                          r"did you mean 'policy.max_searches'\?$"):
        load_config(env={}, overrides={"policy.max_serches": 1})


def test_config_error_is_a_recallbound_value_error() -> None:
    from plugin.errors import RecallboundError

    assert issubclass(ConfigError, RecallboundError) and issubclass(ConfigError, ValueError)


# -- config show -------------------------------------------------------------------------------


def _show(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(["config", "show", *argv], stdout=out, stderr=err), out.getvalue(), err.getvalue()


def test_config_show_names_every_source(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(folder, TOML)
    monkeypatch.setenv("RECALLBOUND_POLICY_MAX_ROUNDS", "3")
    code, out, err = _show()
    assert (code, err) == (0, "")
    lines = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert out.splitlines()[:2] == [f"configuration file: {path}",
                                    "precedence: explicit > env > file > default"]
    assert lines["policy.max_rounds"].split()[1:4] == ["3", "env",
                                                       "[RECALLBOUND_POLICY_MAX_ROUNDS]"]
    assert lines["policy.max_searches"].split()[1:3] == ["6", "file"]
    assert lines["policy.automatic_slots"].split()[1:] == ["2", "default"]
    assert lines["query_planning"].split()[1] == '"task_context"'


def test_config_show_escapes_a_hostile_file_name(tmp_path: Path) -> None:
    hostile = tmp_path / 'evil\x1b[31m\nstore  "FORGED" explicit.toml'
    hostile.write_text('ledger = "l.db"\nstore = "s.db"\n')
    code, out, _ = _show("--config", str(hostile))
    assert code == 0 and "\x1b" not in out and "FORGED" in out
    assert len(out.splitlines()) == 2 + len(
        [line for line in out.splitlines()[2:] if line.startswith("  ")])
    assert not any(line.startswith('store  "FORGED"') for line in out.splitlines())


def test_config_show_json_hides_a_dsn_password(folder: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECALLBOUND_LEDGER", "postgresql://alice:s3cret@db:5432/recall")
    code, out, _ = _show("--json")
    assert code == 0 and "s3cret" not in out
    settings = {row["key"]: row for row in json.loads(out)["settings"]}
    assert settings["ledger"] == {"key": "ledger", "value": "postgresql://alice:***@db:5432/recall",
                                  "source": "env", "where": "RECALLBOUND_LEDGER",
                                  "env": "RECALLBOUND_LEDGER", "looser": False}
    assert settings["store"]["value"] is None


def test_config_show_lists_the_mcp_servers_settings_and_marks_a_looser_run_cap(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(folder, 'allow_looser_policy = true\n[mcp]\nmax_runs_per_hour = 90\n'
                   'allowed_hosts = ["mcp.example.com"]\n')
    monkeypatch.setenv("RECALLBOUND_MCP_MAX_MEMORY_BYTES", "1024")
    monkeypatch.setenv("RECALLBOUND_MCP_TOKENS", '[{"token": "t0ps3cret"}]')
    monkeypatch.setenv("RECALLBOUND_MCP_TOKENS_STAGING", '[{"token": "t0ps3cret"}]')
    code, out, err = _show()
    assert (code, err) == (0, "") and "t0ps3cret" not in out
    lines = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert lines["mcp.max_runs_per_hour"].split()[1:3] == ["90", "file"]
    assert lines["mcp.max_runs_per_hour"].endswith("! LOOSER than the default allowance")
    assert lines["mcp.max_memory_bytes"].split()[1:4] == [
        "1024", "env", "[RECALLBOUND_MCP_MAX_MEMORY_BYTES]"]
    assert lines["mcp.window_ms"].split()[1:] == ["20.0", "default"]
    assert lines["mcp.allowed_hosts"].split()[1:3] == ['["mcp.example.com"]', "file"]
    assert lines["mcp.principal"].split()[1:] == ["(unset)", "default"]
    _, out, _ = _show("--json")
    keys = [row["key"] for row in json.loads(out)["settings"]]
    assert "mcp.token_file" in keys and not any("tokens" in key for key in keys)


@pytest.mark.parametrize("where", ["file", "env"])
def test_more_mcp_runs_an_hour_needs_allow_looser_policy_wherever_it_is_read(
    folder: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    if where == "file":
        _write(folder, "[mcp]\nmax_runs_per_hour = 61\n")
    else:
        monkeypatch.setenv("RECALLBOUND_MCP_MAX_RUNS_PER_HOUR", "61")
    code, out, err = _show()
    assert (code, out) == (1, "")
    assert "mcp.max_runs_per_hour from" in err and "allow_looser_policy" in err
    assert ("recallbound.toml" if where == "file" else "RECALLBOUND_MCP_MAX_RUNS_PER_HOUR") in err


@pytest.mark.parametrize("value", [
    ["postgresql://ops:Hunter2Secret@db/agents"],
    b"host=db password=Hunter2Secret dbname=x",
    "postgresql://ops:Hunter2Secret@db/agents\x00",
])
@pytest.mark.parametrize("key", ["ledger", "store"])
def test_a_bad_location_is_refused_without_repeating_it(
    folder: Path, key: str, value: object
) -> None:
    # no redaction reads a password inside a list, bytes or a NUL-cut string: never echo it
    with pytest.raises(ConfigError) as raised:
        load_config(env={}, overrides={key: value})
    assert "Hunter2Secret" not in str(raised.value) and f"{key} from" in str(raised.value)
    _write(folder, f"{key} = [\"postgresql://ops:Hunter2Secret@db/agents\"]\n")
    with pytest.raises(ConfigError) as from_file:
        load_config(env={})
    assert "Hunter2Secret" not in str(from_file.value)


@pytest.mark.parametrize(("where", "text"), [
    ("file", b"ledger = \"l\xe9.db\"\n"),  # Latin-1, not UTF-8
    ("file", b"[caps]\nmax_items = " + b"9" * 5000 + b"\n"),
    ("env", "9" * 5000),
    ("file", b"[caps]\ncandidates_per_arm = 99999999999999999999\n"),
])
def test_an_unreadable_or_unusable_value_is_one_config_error(
    folder: Path, monkeypatch: pytest.MonkeyPatch, where: str, text: object
) -> None:
    if where == "file":
        assert isinstance(text, bytes)
        (folder / "recallbound.toml").write_bytes(b"allow_looser_policy = true\n" + text)
    else:
        monkeypatch.setenv("RECALLBOUND_ALLOW_LOOSER_POLICY", "true")
        monkeypatch.setenv("RECALLBOUND_CAPS_MAX_ITEMS", str(text))
    code, out, err = _show()
    assert (code, out) == (1, "") and err.startswith("recallbound: ") and err.count("\n") == 1


def test_config_show_refuses_a_store_the_hooks_would_refuse(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECALLBOUND_STORE", "postgresql://u:pw-secret@h/db")
    code, out, err = _show()
    assert (code, out) == (1, "") and "store from env" in err and "connection string" in err
    assert "pw-secret" not in err


def test_config_show_reports_a_bad_value_without_a_traceback(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECALLBOUND_LEGACY", "1")
    code, out, err = _show()
    assert (code, out) == (1, "")
    assert err.startswith("recallbound: legacy from RECALLBOUND_LEGACY: ")


# -- the bootstrap reads it --------------------------------------------------------------------


@pytest.fixture
def no_observer() -> Iterator[None]:
    previous = observe.set_observer(None)
    yield
    observe.set_observer(previous)


@pytest.mark.anyio
async def test_open_hooks_opens_what_the_configuration_names(
    folder: Path, no_observer: None
) -> None:
    _write(folder, 'telemetry = "otel"\nsemantic = "none"\n' + TOML)
    (folder / "data").mkdir()
    config = RecallConfig.from_sources(env={})
    assert config.telemetry is Telemetry.OTEL
    async with open_hooks(config) as hooks:
        assert hooks.allowance.policy.max_searches == 6
        assert observe.current_observer() is not None  # installed for the block
    assert observe.current_observer() is None
    assert (folder / "data/ledger.db").exists()


@pytest.mark.anyio
async def test_otel_telemetry_without_the_extra_is_a_config_error(
    folder: Path, no_observer: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    import runtime_hooks

    # As if the `otel` extra were not installed: importing the OpenTelemetry module fails.
    monkeypatch.setitem(sys.modules, "runtime_hooks.telemetry", None)
    monkeypatch.delattr(runtime_hooks, "telemetry", raising=False)
    config = RecallConfig(ledger_path=folder / "l.db", store_path=folder / "m.db",
                          telemetry="otel")
    with pytest.raises(ConfigError, match=r"telemetry = 'otel' needs the otel extra"):
        async with open_hooks(config):
            pass  # pragma: no cover
    assert observe.current_observer() is None


# -- a path no file system can name: a typed error, at construction or at open -------------------


@pytest.mark.parametrize("value", ["l\ud800.db", "data/\udfff.db", "host=h password=S\ud800"])
@pytest.mark.parametrize("key", ["ledger", "store"])
def test_a_path_with_a_lone_surrogate_is_a_config_error(folder: Path, key: str,
                                                        value: str) -> None:
    field = f"{key}_path"
    given = {"ledger_path": folder / "l.db", "store_path": folder / "m.db", field: value}
    with pytest.raises(ConfigError, match=field) as caught:
        RecallConfig(**given)
    assert "\ud800" not in str(caught.value) and "\udfff" not in str(caught.value)
    with pytest.raises(ConfigError, match=f"{key} from"):
        load_config(env={"RECALLBOUND_LEDGER": "l.db", "RECALLBOUND_STORE": "m.db",
                         f"RECALLBOUND_{key.upper()}": value})
    assert list(folder.iterdir()) == []


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["x" * 5000, "l\ud800.db", "y" * 300 + "/l.db"])
async def test_a_path_the_file_system_refuses_is_a_path_error_at_open(
    folder: Path, name: str
) -> None:
    from plugin.errors import LedgerPathError
    from plugin.memory import MemoryStore
    from plugin.memory.store.errors import MemoryStorePathError

    with pytest.raises(LedgerPathError):
        async with SqliteLedger(str(folder / name)):
            pass  # pragma: no cover
    with pytest.raises(MemoryStorePathError):
        async with MemoryStore(str(folder / name)):
            pass  # pragma: no cover
    assert list(folder.iterdir()) == []


# -- a path in code follows the loader's rule: no blank, no control or invisible character -------


@pytest.mark.parametrize("value", ["   ", "\ufeffl.db", "l.db\n", "\tl.db", "l\u200b.db",
                                   "l\x00.db", "l\x1b[31m.db", "l.db\r"])
@pytest.mark.parametrize("key", ["ledger", "store"])
def test_a_blank_or_invisible_path_is_refused_in_code_as_from_a_file(
    folder: Path, key: str, value: str
) -> None:
    field = f"{key}_path"
    for make in (
        lambda: RecallConfig(**{"ledger_path": folder / "l.db", "store_path": "m.db",
                                field: value}),
        lambda: RecallConfig(**{"ledger_path": folder / "l.db", "store_path": "m.db",
                                field: Path(value)}),
        lambda: load_config(env={"RECALLBOUND_LEDGER": "l.db", "RECALLBOUND_STORE": "m.db",
                                 f"RECALLBOUND_{key.upper()}": value}),
    ):
        with pytest.raises(ConfigError, match=rf"{field}|{key} from"):
            make()
    other = "store" if key == "ledger" else "ledger"
    _write(folder, f"{other} = \"o.db\"\n{key} = {json.dumps(value)}\n")
    with pytest.raises(ConfigError, match=f"{key} from"):
        load_config(env={})
    assert [p.name for p in folder.iterdir()] == ["recallbound.toml"]


@pytest.mark.parametrize("value", ["l.db", "data/my ledger.db", "./host=x.db", "ledger-é.db",
                                   "\U0001F468\u200d\U0001F469\u200d\U0001F467.db",  # ZWJ
                                   "\u062f\u0641\u062a\u0631\u200c\u06a9\u0644.db",  # ZWNJ
                                   "\U0001F3F4\U000E0067\U000E0062\U000E007F.db",  # tags
                                   "so\u00adft.db", "\u05d3\u05d5\u05d7\u200f.db",
                                   "host=h dbname=x\n", "postgresql://h/db\n"])
def test_a_file_name_or_a_dsn_with_its_white_space_is_kept(value: str) -> None:
    assert RecallConfig(ledger_path=value).ledger_path == value


@pytest.mark.parametrize("ledger", ["/srv/ledger.db ", " /srv/ledger.db", "/srv/ledger.db\u00a0",
                                    "ledger.db\u3000"])
def test_a_file_name_that_begins_or_ends_with_white_space_is_refused(
    folder: Path, ledger: str
) -> None:
    # "/srv/ledger.db " is another file than "/srv/ledger.db": two workers, two allowances
    with pytest.raises(ConfigError, match="white space"):
        load_config(env={"RECALLBOUND_LEDGER": ledger})
    with pytest.raises(LedgerConfigError, match="white space"):
        parse_location(ledger)
    assert list(folder.iterdir()) == []
