"""Every setting that widens a bound needs ``allow_looser_policy`` from a file or the
environment, and ``config show`` marks it looser: one rule, declared once beside the settings.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import attrs
import pytest

from plugin.errors import ConfigError
from runtime_hooks.__main__ import main
from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.config import FIELDS, load_config

WIDENING = {
    "policy.max_searches": ("5", 5),
    "policy.max_rounds": ("3", 3),
    "policy.deadline_s": ("10.5", 10.5),
    "policy.source_read_fallbacks": ("3", 3),
    "caps.max_items": ("9", 9),
    "caps.max_bytes": ("4097", 4097),
    "caps.candidates_per_arm": ("21", 21),  # it raises how many items of a read are examined
    "caps.beliefs_per_person": ("4", 4),
    "preparation_budget_s": ("2.5", 2.5),
    "admission_timeout_s": ("0.5", 0.5),
    "legacy": ("true", True),
}
"""Each widening key, one step past its default (in the environment's text, and in TOML)."""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("RECALLBOUND_"):
            monkeypatch.delenv(name)
    return tmp_path


def _env(key: str) -> str:
    return "RECALLBOUND_" + key.upper().replace(".", "_")


def _toml(key: str, value: object) -> str:
    text = json.dumps(value)
    if "." in key:
        section, name = key.split(".")
        return f"[{section}]\n{name} = {text}\n"
    return f"{key} = {text}\n"


def test_the_widening_keys_are_declared_beside_their_settings() -> None:
    assert {f.key for f in FIELDS if f.widens} == set(WIDENING)


@pytest.mark.parametrize("key", sorted(WIDENING))
def test_widening_from_the_environment_needs_allow_looser_policy(folder: Path, key: str) -> None:
    text, _ = WIDENING[key]
    with pytest.raises(ConfigError, match=rf"^{key} from env .*allow_looser_policy"):
        load_config(env={_env(key): text})
    loaded = load_config(env={_env(key): text, "RECALLBOUND_ALLOW_LOOSER_POLICY": "true"})
    assert loaded.looser() == {key}


@pytest.mark.parametrize("key", sorted(WIDENING))
def test_widening_from_a_file_needs_allow_looser_policy(folder: Path, key: str) -> None:
    _, value = WIDENING[key]
    (folder / "recallbound.toml").write_text(_toml(key, value))
    with pytest.raises(ConfigError, match=rf"^{key} from file .*allow_looser_policy"):
        load_config(env={})
    (folder / "recallbound.toml").write_text("allow_looser_policy = true\n" + _toml(key, value))
    assert load_config(env={}).looser() == {key}


@pytest.mark.parametrize("key", sorted(WIDENING))
def test_config_show_marks_each_widened_key_looser(folder: Path, key: str) -> None:
    text, _ = WIDENING[key]
    os.environ[_env(key)] = text
    os.environ["RECALLBOUND_ALLOW_LOOSER_POLICY"] = "true"
    try:
        out = io.StringIO()
        assert main(["config", "show", "--json"], stdout=out, stderr=io.StringIO()) == 0
    finally:
        del os.environ[_env(key)], os.environ["RECALLBOUND_ALLOW_LOOSER_POLICY"]
    rows = json.loads(out.getvalue())["settings"]
    assert {row["key"] for row in rows if row["looser"]} == {key}


def test_the_defaults_and_tighter_values_need_nothing(folder: Path) -> None:
    loaded = load_config(env={
        "RECALLBOUND_CAPS_MAX_ITEMS": "4", "RECALLBOUND_CAPS_MAX_BYTES": "4096",
        "RECALLBOUND_POLICY_SOURCE_READ_FALLBACKS": "1",
        "RECALLBOUND_PREPARATION_BUDGET_S": "1", "RECALLBOUND_ADMISSION_TIMEOUT_S": "0.25"})
    assert loaded.looser() == set()


def test_built_in_code_the_host_decides_and_is_told(folder: Path) -> None:
    caps = attrs.evolve(RecallConfig(ledger_path="l.db", store_path="m.db").caps,
                        max_bytes=1 << 20)
    config = RecallConfig(ledger_path="l.db", store_path="m.db", preparation_budget_s=9.0,
                          caps=caps)
    assert {key for key, _ in config.loosened()} == {"preparation_budget_s", "caps.max_bytes"}
