"""Configuration cannot loosen or switch off the allowance without a word; one declaration."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import attrs
import pytest

from plugin.control import AllowancePolicy, SqliteLedger
from plugin.errors import ConfigError, LedgerPathError, RecallboundError
from plugin.memory.store import MemoryStore, MemoryStorePathError
from runtime_hooks.__main__ import main
from runtime_hooks.bootstrap import (
    RecallConfig,
    Semantic,
    admit_always,
    load_embedding,
    open_hooks,
)
from runtime_hooks.config import FIELDS, load_config, settings_table

from ._loops import LOOPS

ALLOW = {"RECALLBOUND_ALLOW_LOOSER_POLICY": "true"}
LOOSER_ENV = [
    ("RECALLBOUND_POLICY_MAX_SEARCHES", "2147483647", "policy.max_searches"),
    ("RECALLBOUND_POLICY_MAX_ROUNDS", "2147483647", "policy.max_rounds"),
    ("RECALLBOUND_POLICY_DEADLINE_S", "31536000", "policy.deadline_s"),
    ("RECALLBOUND_LEGACY", "true", "legacy"),
]


async def admit_never(experiment: str) -> bool:
    """An admission for ``admission = "module:function"``."""
    return False


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in list(__import__("os").environ):
        if name.startswith("RECALLBOUND_"):
            monkeypatch.delenv(name)
    return tmp_path


def _show(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(["config", "show", *argv], stdout=out, stderr=err), out.getvalue(), err.getvalue()


# -- a looser policy needs a word, and is logged -------------------------------------------------


@pytest.mark.parametrize(("name", "value", "key"), LOOSER_ENV)
def test_a_looser_policy_from_the_environment_needs_allow_looser_policy(
    folder: Path, name: str, value: str, key: str
) -> None:
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)} from env \({name}\): .*looser.*"
                                          r"allow_looser_policy = true"):
        load_config(env={name: value})
    loaded = load_config(env={name: value, **ALLOW})
    assert loaded.sources[key].kind == "env"


@pytest.mark.parametrize("text", ["[policy]\nmax_searches = 5\n", "[policy]\nmax_rounds = 3\n",
                                  "[policy]\ndeadline_s = 10.5\n", "legacy = true\n"])
def test_a_looser_policy_from_the_file_needs_allow_looser_policy(folder: Path, text: str) -> None:
    (folder / "recallbound.toml").write_text(text)
    with pytest.raises(ConfigError, match=r"from file \(.*recallbound.toml: .*\): .*"
                                          r"allow_looser_policy"):
        load_config(env={})
    (folder / "recallbound.toml").write_text("allow_looser_policy = true\n" + text)
    assert load_config(env={}).values["allow_looser_policy"] is True


def test_a_tighter_policy_needs_nothing(folder: Path) -> None:
    loaded = load_config(env={"RECALLBOUND_POLICY_MAX_SEARCHES": "2",
                              "RECALLBOUND_POLICY_DEADLINE_S": "5"})
    assert loaded.looser() == set()


@pytest.mark.parametrize("anyio_backend", LOOPS)
@pytest.mark.anyio
async def test_opening_hooks_with_a_looser_policy_warns_naming_setting_and_source(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"RECALLBOUND_LEDGER": "l.db", "RECALLBOUND_STORE": "m.db",
           "RECALLBOUND_POLICY_MAX_SEARCHES": "2147483647", "RECALLBOUND_LEGACY": "true",
           **ALLOW}
    config = RecallConfig.from_sources(env=env)
    with caplog.at_level(logging.WARNING, logger="recallbound.config"):
        async with open_hooks(config):
            pass
    warned = {r.recallbound["setting"]: r.recallbound["source"] for r in caplog.records
              if r.levelno == logging.WARNING and r.name == "recallbound.config"}
    assert warned == {"policy.max_searches": "env (RECALLBOUND_POLICY_MAX_SEARCHES)",
                      "legacy": "env (RECALLBOUND_LEGACY)"}


@pytest.mark.parametrize("anyio_backend", LOOPS)
@pytest.mark.anyio
async def test_a_looser_policy_built_in_code_is_allowed_and_warned(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = RecallConfig(ledger_path="l.db", store_path="m.db",
                          policy=AllowancePolicy(max_rounds=3, deadline_s=60.0))
    with caplog.at_level(logging.WARNING, logger="recallbound.config"):
        async with open_hooks(config):
            pass
    warned = sorted((r.recallbound["setting"], r.recallbound["source"]) for r in caplog.records
                    if r.name == "recallbound.config")
    assert warned == [("policy.deadline_s", "code (RecallConfig)"),
                      ("policy.max_rounds", "code (RecallConfig)")]


@pytest.mark.parametrize("anyio_backend", LOOPS)
@pytest.mark.anyio
async def test_the_default_policy_opens_without_a_warning(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="recallbound.config"):
        async with open_hooks(RecallConfig(ledger_path="l.db", store_path="m.db")):
            pass
    assert [r for r in caplog.records if r.name == "recallbound.config"] == []


def test_config_show_marks_looser_settings(folder: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECALLBOUND_POLICY_MAX_SEARCHES", "9")
    monkeypatch.setenv("RECALLBOUND_ALLOW_LOOSER_POLICY", "true")
    code, out, err = _show()
    assert (code, err) == (0, "")
    lines = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert lines["policy.max_searches"].endswith("LOOSER than the default allowance")
    assert "LOOSER" not in lines["policy.max_rounds"]
    code, out, _ = _show("--json")
    rows = {row["key"]: row for row in json.loads(out)["settings"]}
    assert rows["policy.max_searches"]["looser"] is True
    assert rows["policy.max_rounds"]["looser"] is False


# -- a durable ledger that is not durable ---------------------------------------------------------


@pytest.mark.parametrize("location", [":memory:", "file::memory:?cache=shared",
                                      "file:ledger?mode=memory", "file:x?vfs=memdb",
                                      "file:%3Amemory%3A", "FILE::memory:",
                                      # SQLite ignores a fragment
                                      "file:ledger.db?mode=memory#x",
                                      "file:ledger.db?vfs=memdb#x"])
def test_an_ephemeral_ledger_is_refused_unless_asked_for(folder: Path, location: str) -> None:
    with pytest.raises(ConfigError, match=r"^ledger from env \(RECALLBOUND_LEDGER\): .*keeps "
                                          r"nothing.*allow_ephemeral_ledger = true"):
        load_config(env={"RECALLBOUND_LEDGER": location})
    with pytest.raises(ConfigError, match=r"RecallConfig.ledger_path .* keeps nothing"):
        RecallConfig(ledger_path=location, store_path="m.db")
    assert load_config(env={"RECALLBOUND_LEDGER": location,
                            "RECALLBOUND_ALLOW_EPHEMERAL_LEDGER": "true"}).values["ledger"] \
        == location
    assert RecallConfig(ledger_path=location, store_path="m.db",
                        allow_ephemeral_ledger=True).allow_ephemeral_ledger


# SQLite reads these parameters of a ``file:`` URI: each one makes the file unsafe for a ledger
# or a store that several processes share (another VFS locks differently or not at all; nolock
# and immutable turn locking off; ro cannot write). Refused when named, with the reason.
_UNSAFE_URIS = ["file:ledger.db?vfs=unix-none", "file:ledger.db?vfs=unix-dotfile",
                "file:ledger.db?vfs=unix-excl", "file:ledger.db?nolock=1",
                "file:ledger.db?cache=shared&nolock=yes", "file:ledger.db?immutable=1",
                "file:ledger.db?mode=ro", "file:ledger.db?%76fs=unix-none",
                "file:ledger.db?nolock=on#x",
                # SQLite cuts a decoded NUL off a name or a value: still these parameters
                "file:ledger.db?vfs%00=unix-none", "file:ledger.db?nolock%00x=1",
                "file:ledger.db?mode=ro%00", "file:ledger.db?immutable=0001"]


@pytest.mark.parametrize("location", _UNSAFE_URIS)
def test_a_file_uri_that_changes_locking_is_refused_with_its_reason(
    folder: Path, location: str
) -> None:
    reason = r"(locks the file differently|turns SQLite's file locking off|read-only)"
    with pytest.raises(ConfigError, match=r"^ledger from env \(RECALLBOUND_LEDGER\): .*" + reason):
        load_config(env={"RECALLBOUND_LEDGER": location})
    with pytest.raises(ConfigError, match=r"^store from env \(RECALLBOUND_STORE\): .*" + reason):
        load_config(env={"RECALLBOUND_STORE": location})
    with pytest.raises(ConfigError, match=r"RecallConfig.ledger_path .*" + reason):
        RecallConfig(ledger_path=location, store_path="m.db")
    with pytest.raises(LedgerPathError, match=reason):
        SqliteLedger(location)
    with pytest.raises(MemoryStorePathError, match=reason):
        MemoryStore(location)
    assert not (folder / "ledger.db").exists()


@pytest.mark.parametrize("location", ["file:ledger.db?mode=rwc", "file:ledger.db?nolock=0",
                                      "file:ledger.db?cache=shared", "file:ledger.db?VFS=x",
                                      "file:ledger.db?immutable=off", "file:ledger.db?vfs=unix",
                                      # SQLite keeps a number's low byte: 256 is false
                                      "file:ledger.db?nolock=256", "file:ledger.db?nolock=+1"])
def test_a_file_uri_that_keeps_sqlites_locking_is_taken(folder: Path, location: str) -> None:
    assert load_config(env={"RECALLBOUND_LEDGER": location}).values["ledger"].endswith(
        location[location.index("?"):])
    SqliteLedger(location)
    MemoryStore(location)


@pytest.mark.parametrize("value", ["true", 1, None])
def test_the_safeguard_flags_need_a_real_bool(value: object) -> None:
    for name in ("allow_ephemeral_ledger", "allow_looser_policy"):
        with pytest.raises(RecallboundError, match=f"RecallConfig.{name} must be the bool"):
            RecallConfig(ledger_path="l.db", store_path="m.db", **{name: value})


# -- admission from the file and the environment --------------------------------------------------


def test_admission_always_and_module_function(folder: Path) -> None:
    (folder / "recallbound.toml").write_text(
        'ledger = "l.db"\nstore = "m.db"\nquery_planning = "task_context"\n'
        'admission = "always"\n')
    config = RecallConfig.from_sources(env={})
    assert config.admission is admit_always
    config = RecallConfig.from_sources(
        env={"RECALLBOUND_ADMISSION": "tests.test_config_safety:admit_never"})
    assert config.admission is admit_never
    shown = {row["key"]: row["value"] for row in load_config(env={}).describe()}
    assert shown["admission"] == "always"


@pytest.mark.parametrize(("value", "message"), [
    ("sometimes", r"'always' or 'module:function', got 'sometimes'"),
    ("tests.nowhere:admit", r"'tests.nowhere:admit' cannot be imported"),
    ("tests.test_config_safety:ALLOW", r"is a dict, not a callable"),
])
def test_a_bad_admission_names_the_key_and_source(folder: Path, value: str,
                                                  message: str) -> None:
    with pytest.raises(ConfigError, match=r"^admission from env \(RECALLBOUND_ADMISSION\): "
                                          r"RecallConfig.admission .*" + message):
        load_config(env={"RECALLBOUND_ADMISSION": value})


@pytest.mark.parametrize("anyio_backend", LOOPS)
@pytest.mark.anyio
async def test_task_context_that_can_never_be_admitted_is_warned(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = RecallConfig.from_sources(env={
        "RECALLBOUND_LEDGER": "l.db", "RECALLBOUND_STORE": "m.db",
        "RECALLBOUND_QUERY_PLANNING": "task_context"})
    with caplog.at_level(logging.WARNING, logger="recallbound.config"):
        async with open_hooks(config):
            pass
    (record,) = [r for r in caplog.records if r.name == "recallbound.config"]
    assert record.recallbound["event"] == "config.never_admitted"
    assert record.recallbound["source"] == "env (RECALLBOUND_QUERY_PLANNING)"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="recallbound.config"):
        async with open_hooks(attrs.evolve(config, admission="always")):
            pass
    assert [r for r in caplog.records if r.name == "recallbound.config"] == []


# -- every setting settable, one declaration -----------------------------------------------------


def test_preparation_budget_and_semantic_choices_are_settable(folder: Path) -> None:
    (folder / "recallbound.toml").write_text(
        'ledger = "l.db"\nstore = "m.db"\npreparation_budget_s = 0.5\nsemantic = "minilm"\n')
    config = RecallConfig.from_sources(env={})
    assert (config.preparation_budget_s, config.semantic) == (0.5, Semantic.MINILM)
    config = RecallConfig.from_sources(env={"RECALLBOUND_PREPARATION_BUDGET_S": "3",
                                            "RECALLBOUND_SEMANTIC": "auto", **ALLOW})
    assert (config.preparation_budget_s, config.semantic) == (3.0, Semantic.AUTO)
    with pytest.raises(ConfigError, match=r"^preparation_budget_s from env "
                                          r"\(RECALLBOUND_PREPARATION_BUDGET_S\): .*> 0"):
        load_config(env={"RECALLBOUND_PREPARATION_BUDGET_S": "0"})


def test_every_recallconfig_field_is_a_declared_setting() -> None:
    declared = {f.attribute for f in FIELDS}
    assert declared == {f.name for f in attrs.fields(RecallConfig)} - {"sources"}
    keys = [f.key for f in FIELDS]
    assert len(keys) == len(set(keys))
    assert {f.env for f in FIELDS} == {
        "RECALLBOUND_" + k.upper().replace(".", "_") for k in keys}
    policy = {f.part for f in FIELDS if f.attribute == "policy"}
    assert policy == {f.name for f in attrs.fields(AllowancePolicy)}


def test_the_operating_page_lists_every_setting_as_declared() -> None:
    page = (Path(__file__).parent.parent / "docs" / "operating.md").read_text(encoding="utf-8")
    assert settings_table() in page, "regenerate: python -m runtime_hooks.config --table"


@pytest.mark.parametrize("choice", list(Semantic))
def test_every_semantic_choice_is_loaded_in_one_place(choice: Semantic) -> None:
    from plugin.memory import minilm_adapter, wordllama_adapter

    if choice is Semantic.WORDLLAMA and not wordllama_adapter.available():
        pytest.skip("the semantic extra is not installed")  # pragma: no cover
    if choice is Semantic.MINILM and not minilm_adapter.available():
        pytest.skip("the minilm extra is not installed")  # pragma: no cover
    adapter = load_embedding(choice)
    assert (adapter is None) == (choice is Semantic.NONE or (
        choice is Semantic.AUTO and not wordllama_adapter.available()
        and not minilm_adapter.available()))


# -- the test suite's variables and one error format ----------------------------------------------


@pytest.mark.parametrize("name", ["RECALLBOUND_TEST_PG_DSN", "RECALLBOUND_STRESS",
                                  "RECALLBOUND_FLEET_WORKERS", "RECALLBOUND_FLEET_RUNS",
                                  "RECALLBOUND_TEST_ANYTHING", "RECALLBOUND_MCP_TOKENS"])
def test_the_test_suites_and_the_servers_variables_do_not_break_commands(
    folder: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "full")
    code, out, err = _show()
    assert (code, err) == (0, "")
    assert name not in out


def test_a_bad_key_has_one_error_format_wherever_it_comes_from(folder: Path) -> None:
    (folder / "recallbound.toml").write_text("[policy]\nmax_serches = 4\n")
    messages = []
    for attempt in (lambda: load_config(env={}),
                    lambda: load_config(env={"RECALLBOUND_POLICY_MAX_SERCHES": "4"},
                                        cwd=folder / "elsewhere"),
                    lambda: load_config(env={}, overrides={"policy.max_serches": 4},
                                        cwd=folder / "elsewhere")):
        (folder / "elsewhere").mkdir(exist_ok=True)
        with pytest.raises(ConfigError) as raised:
            attempt()
        messages.append(str(raised.value))
    pattern = r"^unknown setting '([A-Za-z_.]+)' \(([^)]*)\); did you mean '([A-Za-z_.]+)'\?$"
    parsed = [re.fullmatch(pattern, m) for m in messages]
    assert all(parsed), messages
    assert [p.group(3) for p in parsed if p] == [
        "policy.max_searches", "RECALLBOUND_POLICY_MAX_SEARCHES", "policy.max_searches"]


def test_the_semantic_choices_are_the_loaders_names() -> None:
    from plugin.memory import embedding_choice

    assert tuple(s.value for s in Semantic) == embedding_choice.CHOICES
    with pytest.raises(ValueError, match="unknown embedding 'glove'"):
        embedding_choice.load_embedding("glove")
