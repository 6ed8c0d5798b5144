"""A PostgreSQL URI whose scheme was lost or mistyped (``root:secret@host/db``,
``//root:secret@host/db``, ``postgresql//…``, ``postgresql;//…``) is not a file name.

Read as a SQLite path, it failed to open with an error that quoted the whole text, password and
all. A first path part that holds a user and password before an ``@`` (``user:password@``) is
a connection string with a typo: refused when the configuration is read, showing none of it.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from plugin.control.dsn import parse_location
from plugin.errors import LedgerConfigError
from runtime_hooks.__main__ import main

SECRET = "Sw0rdfish-XYZZY"

SCHEMELESS = [
    f"root:{SECRET}@127.0.0.1:5432/test",
    f"root:{SECRET}@127.0.0.1",
    f" root:{SECRET}@db.internal/test?sslmode=disable",
    f"//root:{SECRET}@127.0.0.1/test",
    f"postgresql//root:{SECRET}@127.0.0.1/test",
    f"postgresql;//root:{SECRET}@127.0.0.1/test",
    f"PostgreSQL//root:{SECRET}@127.0.0.1/test",
]

LOST_SCHEME = [  # no password, but no file name either: each worker would open its own file
    "postgresql//app@db.internal/fleet", "postgres//db.internal/fleet", "postgresql///fleet",
    "//app@db.internal/fleet", "app@db.internal:5432", "db.internal:5432",
    "localhost:5432/fleet",
]


@pytest.mark.parametrize("location", SCHEMELESS + LOST_SCHEME)
def test_a_uri_without_its_scheme_is_refused_and_shows_nothing(
    location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LedgerConfigError) as caught:
        parse_location(location)
    assert SECRET not in f"{caught.value!s} {caught.value!r}"
    assert "postgresql://" in str(caught.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("location", SCHEMELESS[:2])
def test_the_cli_says_so_without_the_password(
    location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RECALLBOUND_LEDGER", location)
    code = main(["ledger", "usage", "r1"], stdout=io.StringIO())
    out = capsys.readouterr()
    assert code != 0
    assert SECRET not in out.out + out.err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", [
    "ledger.db", "me@example.com.db", "data/run@2.db", "backup:2026-01-01.db",
    "./root:x@host/db", "/tmp/root:x@host/db", "app@db.internal", "C:5432",
    "ledger-2026-01:01.db", "run-10:30", "backup-2024-01-05T10:30", "./node-1:8080",
])
def test_file_names_that_hold_an_at_or_a_colon_stay_files(name: str) -> None:
    assert parse_location(name).kind == "sqlite"
