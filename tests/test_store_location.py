"""The reference memory store is a SQLite file: a connection string given as its location is an
error, never a file of that name (the password in it never shown)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from plugin.errors import ConfigError, InvalidArgumentError, InvalidArgumentTypeError
from plugin.memory.store import MemoryStore
from plugin.memory.store.errors import MemoryStorePathError
from runtime_hooks.__main__ import main
from runtime_hooks.bootstrap import RecallConfig

CONNECTION_STRINGS = [
    "host=127.0.0.1 dbname=test password=s3cr3t-pw",
    " host=127.0.0.1 port=5432 user=postgres password='s3cr3t-pw'",
    "postgresql://postgres:s3cr3t-pw@127.0.0.1:5432/test",
    "postgres://127.0.0.1/test?password=s3cr3t-pw",
    # libpq cannot read these, so no password can be found in them to hide: none is echoed
    "postgresql://app:s3cr3t-pw X@db/x",
    "postgresql:app:s3cr3t-pw@db",
    "postgres:app:s3cr3t-pw@db/x",
]


@pytest.mark.parametrize("location", CONNECTION_STRINGS)
def test_the_store_refuses_a_connection_string_and_creates_no_file(
    location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MemoryStorePathError, match="connection string") as raised:
        MemoryStore(location)
    assert "s3cr3t-pw" not in str(raised.value)
    with pytest.raises(ConfigError, match="connection string") as config:
        RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=location)
    assert "s3cr3t-pw" not in str(config.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("location", CONNECTION_STRINGS)
def test_the_memory_command_refuses_a_connection_string_as_its_store(
    location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out, err_stream = io.StringIO(), io.StringIO()
    code = main(["memory", "--store", location, "add", "--principal", "p", "--scope", "s",
                 "hello"], stdout=out, stderr=err_stream)
    err = err_stream.getvalue()
    assert code == 2 and "connection string" in err and "s3cr3t-pw" not in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("location", CONNECTION_STRINGS)
def test_config_show_never_shows_a_password_of_a_store_location(
    location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RECALLBOUND_STORE", location)
    out, err = io.StringIO(), io.StringIO()
    main(["config", "show"], stdout=out, stderr=err)
    assert "s3cr3t-pw" not in out.getvalue() + err.getvalue()


@pytest.mark.parametrize("location", [":memory:", "file:memory.db", "file:///tmp/memory.db"])
@pytest.mark.parametrize("command", [["add", "hello"], ["list"], ["forget", "m1"]])
def test_the_memory_command_needs_a_file_path_for_every_subcommand(
    location: str, command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a URI's "//" folded by a path made "add" write where "list" then found nothing
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    code = main(["memory", "--store", location, *command, "--principal", "p", "--scope", "s"],
                stdout=io.StringIO(), stderr=err)
    assert code == 2 and "not a file path" in err.getvalue()
    assert os.listdir(tmp_path) == []


def test_a_file_path_is_still_a_store(tmp_path: Path) -> None:
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db")
    assert config.store_path == tmp_path / "memory.db"
    MemoryStore(tmp_path / "memory.db")
    MemoryStore(":memory:")


@pytest.mark.parametrize(("options", "error"), [
    ({"timeout": -1}, InvalidArgumentError),
    ({"timeout": float("nan")}, InvalidArgumentError),
    ({"timeout": "5"}, InvalidArgumentTypeError),
    ({"embedding": "wordllama"}, InvalidArgumentTypeError),
    ({"embedding": object()}, InvalidArgumentTypeError),
])
def test_a_misused_store_argument_is_a_typed_error_naming_it(
    options: dict[str, object], error: type[Exception], tmp_path: Path
) -> None:
    with pytest.raises(error, match=r"MemoryStore (timeout|embedding)"):
        MemoryStore(tmp_path / "memory.db", **options)  # type: ignore[arg-type]
    assert not (tmp_path / "memory.db").exists()
