"""A URI whose user and password land in its path: ``postgresql:///user:secret@host/db`` (a
slash too many) or ``postgresql://user:pa/ss@host/db`` (a raw ``/`` in the password).

libpq reads such a path as the database name, password and all, and the server's "database
... does not exist" repeats it. A raw ``@`` in a URI's path is refused when the configuration
is read, without showing the value; a database name holding ``@`` is written ``%40``.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from plugin.control.dsn import parse_location, redact
from plugin.errors import ConfigError, LedgerConfigError
from runtime_hooks.__main__ import main
from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.config import load_config

SECRET = "Sw0rdfish-XYZZY"

IN_PATH = [
    f"postgresql:///root:{SECRET}@127.0.0.1:5432/test",
    f"postgres:///root:{SECRET}@127.0.0.1/test?sslmode=disable",
    f"postgresql:////root:{SECRET}@127.0.0.1/test",
    f"postgresql://127.0.0.1:5432/root:{SECRET}@127.0.0.1/test",
    "postgresql://root:Sw0rd/fish-XYZZY@127.0.0.1/test",
]


def _chain(exc: BaseException | None) -> str:
    seen = []
    while exc is not None:
        seen.append(f"{exc!s} {exc!r}")
        exc = exc.__cause__ or exc.__context__
    return " ".join(seen)


@pytest.mark.parametrize("dsn", IN_PATH)
def test_a_uri_with_userinfo_in_its_path_is_refused_without_showing_it(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LedgerConfigError, match="database name"):
        parse_location(dsn)
    for attempt in (
        lambda: parse_location(dsn),
        lambda: RecallConfig(ledger_path=dsn, store_path=tmp_path / "m.db"),
        lambda: load_config(env={"RECALLBOUND_LEDGER": dsn, "RECALLBOUND_STORE": "m.db"}),
    ):
        with pytest.raises(ConfigError, match="%40") as caught:
            attempt()
        assert "XYZZY" not in _chain(caught.value)
    assert "XYZZY" not in redact(dsn)
    for name in [n for n in os.environ if n.startswith("RECALLBOUND_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RECALLBOUND_LEDGER", dsn)
    monkeypatch.setenv("RECALLBOUND_STORE", "m.db")
    for argv in (["config", "show"], ["config", "show", "--json"], ["ledger", "runs"],
                 ["ledger", "--ledger", dsn, "runs"]):
        out, err = io.StringIO(), io.StringIO()
        assert main(argv, stdout=out, stderr=err) == 1, argv
        assert "XYZZY" not in out.getvalue() + err.getvalue(), argv
    assert list(tmp_path.iterdir()) == []  # no SQLite file, no store


def test_a_message_quoting_a_uri_with_a_slash_too_many_hides_its_password() -> None:
    assert "XYZZY" not in redact(f"unrecognized arguments: postgresql:///root:{SECRET}@h/db")


@pytest.mark.parametrize("dsn", [
    "postgresql://127.0.0.1:5432/fleet%40team",
    "postgresql://127.0.0.1/test?application_name=ops@team",
    "postgresql://127.0.0.1?application_name=ops/x@team",
    f"postgresql://root:{SECRET}@127.0.0.1/test",
    "postgresql:///test?host=/var/run/postgresql",
])
def test_an_at_sign_encoded_in_the_path_or_in_the_query_is_still_a_postgres_ledger(
    dsn: str,
) -> None:
    assert parse_location(dsn).kind == "postgres"
