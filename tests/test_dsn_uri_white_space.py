"""A URI whose password ends in white space before its ``@`` (a password pasted with a space or
a tab after it): libpq reads it, and its password never shows.

libpq refuses white space inside a URI's parts but accepts it at the end of one, so
``postgresql://app:secret @db/fleet`` is a PostgreSQL ledger whose password is ``secret``; its
``repr``, ``config show`` and every message hide it as they hide any other form's.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from plugin.control.dsn import LedgerLocation, parse_location, redact, shown_location
from runtime_hooks.__main__ import main
from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.config import load_config

SECRET = "Sw0rdfish-XYZZY"

LOCATIONS = [
    f"postgresql://root:{SECRET} @127.0.0.1:5432/test",
    f"postgresql://root:{SECRET}\t@127.0.0.1:5432/test",
    f"postgres://root:{SECRET}  @127.0.0.1/test?sslmode=disable",
]


@pytest.mark.parametrize("ledger", LOCATIONS)
def test_libpq_reads_it_as_a_postgres_ledger(ledger: str) -> None:
    assert parse_location(ledger).kind == "postgres"
    assert conninfo_to_dict(ledger)["password"].strip() == SECRET


@pytest.mark.parametrize("ledger", LOCATIONS)
def test_no_display_of_it_shows_the_password(
    ledger: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    shown = [redact(ledger), shown_location(ledger), repr(parse_location(ledger)),
             repr(LedgerLocation(kind="postgres", target=ledger)),
             repr(RecallConfig(ledger_path=ledger, store_path=tmp_path / "s.db")),
             repr(load_config(env={"RECALLBOUND_LEDGER": ledger,
                                   "RECALLBOUND_STORE": "s.db"}, cwd=tmp_path)),
             redact(f"cannot open {ledger}: refused")]
    for text in shown:
        assert SECRET not in text, text
    assert "***" in redact(ledger)
    assert "127.0.0.1" in redact(ledger)


@pytest.mark.parametrize("ledger", LOCATIONS)
def test_config_show_never_prints_the_password(
    ledger: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith(("RECALLBOUND_", "PG"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RECALLBOUND_LEDGER", ledger)
    monkeypatch.setenv("RECALLBOUND_STORE", "memory.db")
    for flags in ([], ["--json"]):
        out, err = io.StringIO(), io.StringIO()
        assert main(["config", "show", *flags], stdout=out, stderr=err) == 0, err.getvalue()
        assert SECRET not in out.getvalue() + err.getvalue()
    out = io.StringIO()
    main(["config", "show", "--json"], stdout=out, stderr=io.StringIO())
    value = json.loads(out.getvalue())["settings"][0]["value"]
    assert "***" in value and SECRET not in value
