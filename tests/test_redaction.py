"""One redaction: a ledger password never comes out, in any form libpq accepts.

libpq's key=value form ends an unquoted value at white space only (``#``, ``&`` and a
backslash-escaped space belong to it) and reads single-quoted values with backslash escapes;
its URI form takes the password from the userinfo (up to the first ``@``) or from a
``password`` query parameter (up to the next ``&``, ``#`` included, the key percent-decoded too).
Every form is checked against psycopg's own parser (libpq's), and the redaction must also work
without psycopg (the ``postgres`` extra). Objects that hold a location show it redacted in their
``repr``.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict

from plugin.control.dsn import LedgerLocation, parse_location, redact
from plugin.errors import ConfigError
from runtime_hooks.__main__ import main
from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.config import load_config

TAIL = "TAILSECRET"

_SPACES = " \t\n\r\f\v"


@contextlib.contextmanager
def _without_psycopg() -> Iterator[None]:
    """As if the ``postgres`` extra were not installed: ``psycopg.conninfo`` cannot import."""
    with mock.patch.dict(sys.modules, {"psycopg.conninfo": None}):
        yield


def _escaped(password: str) -> str:
    """An unquoted key=value value: backslash before a backslash, a quote and white space."""
    return "".join("\\" + c if c in "\\'" or c in _SPACES else c for c in password)


def _quoted(password: str) -> str:
    return "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _raw_uri(password: str, extra: str) -> str:
    """Percent-encode only what libpq cannot read raw in that part of a URI."""
    return "".join(urllib.parse.quote(c, safe="") if c in extra or c in _SPACES else c
                   for c in password)


FORMS: dict[str, Callable[[str], str]] = {
    "keyword unquoted": lambda p: f"host=127.0.0.1 dbname=test user=app password={_escaped(p)}",
    "keyword first": lambda p: f"password={_escaped(p)} host=127.0.0.1 user=app",
    "keyword quoted": lambda p: f"host=h password = {_quoted(p)} user=app",
    "keyword quoted, no space after": lambda p: f"host=h password={_quoted(p)}user=app",
    "sslpassword": lambda p: f"host=h sslpassword={_quoted(p)} user=app",
    "oauth_client_secret": lambda p: f"host=h oauth_client_secret={_quoted(p)} user=app",
    "scram_client_key": lambda p: f"host=h scram_client_key={_escaped(p)} user=app",
    "scram_server_key": lambda p: f"scram_server_key={_quoted(p)} host=h",
    "uri userinfo": lambda p: f"postgresql://app:{urllib.parse.quote(p, safe='')}@h:5432/db",
    "uri userinfo raw": lambda p: f"postgres://app:{_raw_uri(p, '@/%')}@h/db?sslmode=require",
    "uri query": lambda p: (
        f"postgresql://app@h/db?sslmode=require&password={urllib.parse.quote(p, safe='')}"),
    "uri query raw": lambda p: (
        f"postgresql://app@h/db?password={_raw_uri(p, '&=%')}&application_name=x"),
    "uri query, encoded key": lambda p: (
        f"postgresql://h/db?%70assword={urllib.parse.quote(p, safe='')}"),
    "uri query, schema": lambda p: (
        f"postgresql://h/db?schema=fleet&password={urllib.parse.quote(p, safe='')}"),
}
"""Every way a user writes a password into a ledger location, each valid for libpq."""

MESSAGES: dict[str, Callable[[str], str]] = {
    "keyword in a message": lambda p: (
        f"cannot open host=h password={_escaped(p)} user=app: refused"),
    "quoted keyword in a message": lambda p: f"cannot open host=h password={_quoted(p)}: x",
    "uri in a message": lambda p: (
        f"cannot open postgresql://app:{urllib.parse.quote(p, safe='')}@h/db: refused"),
    "uri query in a message": lambda p: (
        f"cannot open postgresql://h/db?password={_raw_uri(p, '&=%')} now"),
}
"""A location inside a longer text (an error, a log line)."""

_PASSWORDS = st.text(
    alphabet=st.one_of(
        st.sampled_from("#&'\\ =?@/:%+;,\"\t$*"),
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    ),
    min_size=4, max_size=24,
)


def _assert_hidden(form: Callable[[str], str], password: str) -> None:
    """The form's redaction holds nothing of ``password`` and does not depend on it."""
    other = redact(form("Q9q9Q9"))
    assume(password not in other)  # a password that is a piece of the form's fixed text
    shown = redact(form(password))
    assert password not in shown
    assert shown == other


@pytest.mark.parametrize("psycopg", [True, False], ids=["psycopg", "no psycopg"])
@pytest.mark.parametrize("name", sorted(FORMS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(password=_PASSWORDS)
@example(password=f"hunter2#{TAIL}")
@example(password=f"hunter2&{TAIL}")
@example(password=f"hunter2 {TAIL}")
@example(password=f"hunter2' {TAIL}")
@example(password="pa?ss#wo@rd")
def test_no_form_of_a_location_shows_its_password(
    name: str, psycopg: bool, password: str
) -> None:
    form = FORMS[name]
    target = form(password)
    location = parse_location(target)
    assert location.kind == "postgres"
    parsed = conninfo_to_dict(location.target)
    secrets = [value for key, value in parsed.items() if key in (
        "password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key")]
    assert secrets == [password]  # a form libpq reads
    with contextlib.nullcontext() if psycopg else _without_psycopg():
        _assert_hidden(form, password)


@pytest.mark.parametrize("psycopg", [True, False], ids=["psycopg", "no psycopg"])
@pytest.mark.parametrize("name", sorted(MESSAGES))
@settings(max_examples=60, deadline=None)
@given(password=_PASSWORDS)
@example(password=f"hunter2#{TAIL}")
@example(password=f"hunter2&{TAIL}")
@example(password=f"hunter2 {TAIL}")
def test_no_message_shows_a_locations_password(name: str, psycopg: bool, password: str) -> None:
    with contextlib.nullcontext() if psycopg else _without_psycopg():
        assume(password not in redact(MESSAGES[name]("Q9q9Q9")))
        assert password not in redact(MESSAGES[name](password))


@pytest.mark.parametrize(("text", "shown"), [
    (f"host=127.0.0.1 dbname=test user=postgres password=hunter2#{TAIL}",
     "host=127.0.0.1 dbname=test user=postgres password=***"),
    (f"host=127.0.0.1 dbname=test user=postgres password=hunter2&{TAIL}",
     "host=127.0.0.1 dbname=test user=postgres password=***"),
    (f"host=127.0.0.1 dbname=test user=postgres password=hunter2\\ {TAIL}",
     "host=127.0.0.1 dbname=test user=postgres password=***"),
    (f"host=h password='hunter2\\' {TAIL}' user=u", "host=h password=*** user=u"),
    (f"postgresql://postgres@127.0.0.1:1/test?password=hunter2#{TAIL}",
     "postgresql://postgres@127.0.0.1:1/test?password=***"),
    (f"postgresql://u@h/db?password=hunter2#{TAIL}&sslmode=require",
     "postgresql://u@h/db?password=***&sslmode=require"),
    (f"postgresql://u:pa?ss#{TAIL}@h/db", "postgresql://u:***@h/db"),
    (f"postgresql://h/db?%70assword={TAIL}", "postgresql://h/db?%70assword=***"),
    ("postgresql://u@h/db?sslmode=require", "postgresql://u@h/db?sslmode=require"),
    ("host=h user=u", "host=h user=u"),
])
@pytest.mark.parametrize("psycopg", [True, False], ids=["psycopg", "no psycopg"])
def test_the_redaction_keeps_the_form_and_hides_the_whole_password(
    text: str, shown: str, psycopg: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    with contextlib.nullcontext() if psycopg else _without_psycopg():
        assert redact(text) == shown


def test_a_message_with_an_unterminated_quote_hides_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    assert TAIL not in redact(f"host=h password='hunter2 {TAIL}")


# -- config show ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ledger", [
    f"host=127.0.0.1 dbname=test user=postgres password=hunter2#{TAIL}",
    f"host=127.0.0.1 dbname=test user=postgres password=hunter2&{TAIL}",
    f"host=127.0.0.1 dbname=test user=postgres password=hunter2\\ {TAIL}",
    f"host=127.0.0.1 dbname=test user=postgres password='hunter2\\' {TAIL}'",
    f"postgresql://postgres@127.0.0.1:1/test?password=hunter2#{TAIL}",
    f"postgresql://postgres@127.0.0.1:1/test?password=hunter2%23{TAIL}",
])
def test_config_show_prints_no_part_of_the_password(
    ledger: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in __import__("os").environ if n.startswith(("RECALLBOUND_", "PG"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RECALLBOUND_LEDGER", ledger)
    monkeypatch.setenv("RECALLBOUND_STORE", "memory.db")
    for flags in ([], ["--json"]):
        out, err = io.StringIO(), io.StringIO()
        assert main(["config", "show", *flags], stdout=out, stderr=err) == 0, err.getvalue()
        assert TAIL not in out.getvalue() + err.getvalue()
        assert "***" in out.getvalue()
    out = io.StringIO()
    main(["config", "show", "--json"], stdout=out, stderr=io.StringIO())
    assert json.loads(out.getvalue())["settings"][0]["value"] == redact(ledger)


# -- repr of what holds a location -----------------------------------------------------------------

SECRET = "hunter2SECRET"
LOCATIONS = [
    f"postgresql://postgres:{SECRET}@127.0.0.1:5432/test",
    f"host=127.0.0.1 dbname=test user=postgres password='{SECRET} x'",
]


@pytest.mark.parametrize("ledger", LOCATIONS, ids=["uri", "keyword"])
def test_a_recall_configs_repr_hides_the_password(ledger: str, tmp_path: Path) -> None:
    config = RecallConfig(ledger_path=ledger, store_path=tmp_path / "s.db")
    assert config.ledger_path == ledger  # the value itself is kept
    for shown in (repr(config), str(config)):
        assert SECRET not in shown
        assert f"ledger_path={redact(ledger)!r}" in shown
    assert f"store_path=PosixPath({str(tmp_path / 's.db')!r})" in repr(config)


@pytest.mark.parametrize("ledger", LOCATIONS, ids=["uri", "keyword"])
def test_a_store_path_that_holds_a_password_is_refused_without_showing_it(
    ledger: str, tmp_path: Path
) -> None:
    # The store is a SQLite file: a connection string there is an error, which hides it.
    with pytest.raises(ConfigError, match="connection string") as refused:
        RecallConfig(ledger_path=tmp_path / "l.db", store_path=ledger)
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize("ledger", LOCATIONS, ids=["uri", "keyword"])
def test_a_loaded_configs_repr_hides_the_password(
    ledger: str, tmp_path: Path
) -> None:
    env = {"RECALLBOUND_LEDGER": ledger, "RECALLBOUND_STORE": str(tmp_path / "s.db")}
    loaded = load_config(env=env, cwd=tmp_path)
    assert loaded.values["ledger"] == ledger
    for shown in (repr(loaded), str(loaded)):
        assert SECRET not in shown and redact(ledger) in shown
    config = RecallConfig.from_sources(env=env)
    assert SECRET not in repr(config)


@pytest.mark.parametrize("ledger", LOCATIONS, ids=["uri", "keyword"])
def test_a_parsed_locations_repr_hides_the_password(ledger: str) -> None:
    location = parse_location(ledger)
    assert SECRET in location.target
    assert SECRET not in repr(location)
    assert SECRET not in repr(LedgerLocation(kind="postgres", target=ledger))
