"""Ledger locations: every form a PostgreSQL user writes, and no password in any output.

A libpq key=value string is a PostgreSQL DSN (never a SQLite file name); a value that looks like
a connection string and cannot be used is a ConfigError; a sentinel password goes through
``config show``, the ledger CLI, the logs and every error message and never comes out. The
PostgreSQL tests run on asyncio and trio against the test server (tests/_pg.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import secrets
import sys
import traceback
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugin.control import RecallAllowance, RoundKind, SqliteLedger
from plugin.control.dsn import parse_location, redact, shown_location
from plugin.errors import (
    ConfigError,
    LedgerConfigError,
    LedgerPathError,
    LedgerUnavailableError,
)
from runtime_hooks.__main__ import main
from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.config import load_config
from runtime_hooks.ledgers import open_ledger

from . import _pg

SECRET = "Sentinel-Pw-7f3a"


def _keyword_dsn(password: str | None = SECRET, dbname: str | None = None) -> str:
    """The test server's DSN written as libpq keywords (trust auth ignores the password)."""
    url = urllib.parse.urlsplit(_pg.DSN)
    parts = [f"host={url.hostname}", f"port={url.port or 5432}",
             f"dbname={dbname or url.path.lstrip('/')}", f"user={url.username or 'root'}"]
    if password is not None:
        parts.append(f"password={password}")
    return " ".join(parts)


@contextlib.contextmanager
def _fresh_database() -> Iterator[str]:
    """A database of its own (a key=value DSN names no schema: the ledger uses the default
    one, which must not be another test's or another version's)."""
    name = f"rb_kv_{secrets.token_hex(6)}"
    with _pg.connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        yield name
    finally:
        with _pg.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def _uri_with_password() -> str:
    scheme, _, rest = _pg.DSN.partition("://")
    user, at, host = rest.rpartition("@")
    return f"{scheme}://{user.split(':')[0] if at else 'root'}:{SECRET}@{host}"


# -- which database a location names ---------------------------------------------------------


@pytest.mark.parametrize("location", [
    "host=127.0.0.1 dbname=fleet user=app",
    "  host=db.internal port=5433 dbname=fleet password='a b'",
    "dbname=fleet",
    "postgresql://db.internal/fleet",
    "postgres://u:pw@db.internal:5433/fleet?sslmode=require",
])
def test_every_postgres_form_is_a_postgres_ledger(location: str) -> None:
    assert parse_location(location).kind == "postgres"


def test_the_uri_schema_parameter_is_recallbounds_own() -> None:
    parsed = parse_location("postgresql://h/db?schema=fleet&sslmode=require")
    assert (parsed.target, parsed.schema) == ("postgresql://h/db?sslmode=require", "fleet")


@pytest.mark.parametrize("password", ["Pw?", "a?b&", "x?&y", "'p?x&&y'", "Pw?schema=tail"])
def test_a_keyword_dsns_question_mark_belongs_to_its_value(password: str) -> None:
    """A key=value string has no query: a ``?`` in a password is the password's, never a
    ``?schema=`` (which would rewrite the password, and show a piece of it as the schema)."""
    from psycopg.conninfo import conninfo_to_dict

    from plugin.control import PostgresLedger

    dsn = f"host=127.0.0.1 dbname=x user=u password={password}"
    parsed = parse_location(dsn)
    assert (parsed.target, parsed.schema) == (dsn, None)
    ledger = PostgresLedger(dsn)
    assert ledger.schema == "recallbound" and "tail" not in ledger.location
    assert conninfo_to_dict(ledger._dsn)["password"] == conninfo_to_dict(dsn)["password"]


@pytest.mark.parametrize("schema", ["Recall", "bad-name", "1st", "x" * 64])
def test_an_invalid_uri_schema_is_refused_when_the_configuration_is_read(
    tmp_path: Path, schema: str
) -> None:
    with pytest.raises(LedgerConfigError, match="lowercase identifier"):
        parse_location(f"postgresql://h/db?schema={schema}")
    with pytest.raises(ConfigError):
        load_config(env={"RECALLBOUND_LEDGER": f"postgresql://h/db?schema={schema}"},
                    cwd=tmp_path)


@pytest.mark.parametrize("location", [
    "ledger.db", "./host=x.db", "/var/lib/recall/ledger.db", ":memory:", "file:ledger.db",
    "file:///tmp/ledger.db?mode=rwc", "C:\\ledgers\\fleet.db", "'notes'.db", "\"x=1\".db",
])
def test_everything_else_is_a_sqlite_file(location: str) -> None:
    parsed = parse_location(location)
    assert (parsed.kind, parsed.target) == ("sqlite", location)


@pytest.mark.parametrize("location", [
    "host=127.0.0.1 dbname",  # a keyword with no value
    "host=127.0.0.1 bogus_option=1",  # libpq knows no such keyword
    f"host='unterminated password={SECRET}",
    "mysql://u@h/db",
    "POSTGRESQL://h/db",  # libpq accepts only the lower-case schemes
    "postgresql+psycopg://h/db",
    f"postgresql:{SECRET}@h/db",  # no //
    "postgresql://h/db?schema=a&schema=b",
    # quotes an env file left on, or an invisible character pasted before it: never a file
    f"'host=127.0.0.1 dbname=test password={SECRET}'",
    '"host=127.0.0.1 dbname=test"',
    f"\ufeffpostgresql://u:{SECRET}@h/db",
    "\u200bhost=127.0.0.1 dbname=test",
    f"`postgres://u:{SECRET}@h/db`",
    f"'sslmode=require host=db dbname=fleet password={SECRET}'",  # any keyword first
    '"connect_timeout=5 host=db"',
    "\u200bsslmode=require host=db",
    f"'POSTGRES://app:{SECRET}@db/fleet'",
    f'"postgresql+psycopg://app:{SECRET}@db/fleet"',
    "\u200ehost=127.0.0.1 dbname=test",  # a direction mark, a soft hyphen, a format char
    f"\u00adpostgresql://u:{SECRET}@h/db",
    "\u2061host=127.0.0.1 dbname=test",
    "\u201chost=127.0.0.1 dbname=test\u201d",  # typographic quotes
    f"\u2018postgresql://u:{SECRET}@h/db\u2019",
    '"host=127.0.0.1 dbname=test',  # an opening quote alone
    # look-alikes from other drivers
    "jdbc:postgresql:fleet",
    "jdbc:postgresql://db/fleet",
    "pgsql:host=db;dbname=fleet",
])
def test_a_connection_string_that_cannot_be_used_is_a_config_error(location: str) -> None:
    with pytest.raises(LedgerConfigError) as caught:
        parse_location(location)
    assert isinstance(caught.value, ConfigError)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize("location", [
    f"postgresql://root:Sentinel\x00{SECRET}@127.0.0.1:5432/test",  # libpq would read host=root
    f"postgresql://root:{SECRET}@127.0.0.1:5432/test\x00",
    f"host=127.0.0.1 dbname=test\x00 password={SECRET}",
    f"\x00host=127.0.0.1 dbname=test password={SECRET}",
])
def test_a_connection_string_holding_a_nul_is_a_config_error_never_shown(location: str) -> None:
    """libpq reads a connection string up to its first NUL: the rest (the host, the database,
    the password) would silently be another one, and a part of the password could be read
    as a host. It is refused, with neither the value nor any part of it shown."""
    with pytest.raises(LedgerConfigError, match="NUL") as caught:
        RecallConfig(ledger_path=location)
    assert SECRET not in str(caught.value) and "Sentinel" not in str(caught.value)


def test_without_psycopg_a_keyword_dsn_names_the_postgres_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg.conninfo", None)  # the import now fails
    with pytest.raises(LedgerConfigError, match=r"postgres extra") as caught:
        parse_location(f"host=db.internal dbname=fleet password={SECRET}")
    assert SECRET not in str(caught.value)


def test_a_keyword_dsn_in_a_file_is_not_taken_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "recallbound.toml").write_text(
        'ledger = "host=127.0.0.1 dbname=fleet"\nstore = "memory.db"\n')
    loaded = load_config(tmp_path / "recallbound.toml", env={})
    assert loaded.values["ledger"] == "host=127.0.0.1 dbname=fleet"
    assert loaded.values["store"] == str(tmp_path / "memory.db")


@pytest.mark.parametrize("source", ["file", "env", "code"])
def test_a_bad_dsn_is_refused_at_configuration(tmp_path: Path, source: str) -> None:
    bad = f"host=db port=5432 dbname password={SECRET}"
    (tmp_path / "r.toml").write_text(f'ledger = "{bad}"\nstore = "m.db"\n')
    build = {
        "file": lambda: load_config(tmp_path / "r.toml", env={}),
        "env": lambda: load_config(env={"RECALLBOUND_LEDGER": bad}, cwd=tmp_path),
        "code": lambda: RecallConfig(ledger_path=bad, store_path=tmp_path / "m.db"),
    }[source]
    with pytest.raises(ConfigError) as caught:
        build()
    assert "ledger" in str(caught.value) and SECRET not in str(caught.value)
    assert not list(tmp_path.glob("host=*"))  # no SQLite file was made of it


# -- one redaction -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    f"postgresql://app:{SECRET}@db/fleet",
    f"postgres://app:{urllib.parse.quote(SECRET + '@/:')}@db/fleet?sslmode=require",
    f"postgresql://db/fleet?sslmode=require&password={SECRET}",
    f"host=db password={SECRET} user=app",
    f"host=db password = '{SECRET} with spaces' user=app",
    f"connection failed: FATAL: password authentication failed; tried {SECRET}",
])
def test_redact_hides_every_form(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", SECRET)
    shown = redact(text)
    assert SECRET not in shown and urllib.parse.quote(SECRET) not in shown
    assert "***" in shown


@pytest.mark.parametrize(("text", "shown"), [
    (f"user=postgres:{SECRET}@127.0.0.1 dbname=test", "user=postgres:***@127.0.0.1 dbname=test"),
    (f"host=h user = 'app:{SECRET}@db' dbname=d", "host=h user = 'app:***@db' dbname=d"),
    (f"host=h user=app:{SECRET}@x@y", "host=h user=app:***@y"),
])
def test_redact_hides_a_uri_pasted_whole_as_the_user_name(text: str, shown: str) -> None:
    # libpq takes it all for a role name; what follows its first ':' is a password
    assert redact(text) == shown


def test_redact_hides_a_uri_password_holding_a_slash() -> None:
    shown = redact(f"postgresql://app:pa/ss-{SECRET}@db/fleet")
    assert SECRET not in shown and shown.startswith("postgresql://app:***")


def test_redact_leaves_a_dsn_without_a_password_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    assert redact("postgresql://u@h/db?sslmode=require") == "postgresql://u@h/db?sslmode=require"
    assert redact("host=h user=u") == "host=h user=u"


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("form", ["keyword", "uri", "pgpassword", "pasted"])
def test_config_show_never_prints_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in __import__("os").environ if n.startswith("RECALLBOUND_")]:
        monkeypatch.delenv(name)
    ledger = {"keyword": _keyword_dsn(), "uri": _uri_with_password(),
              "pgpassword": _keyword_dsn(password=None),
              "pasted": f"user=app:{SECRET}@127.0.0.1 dbname=test"}[form]
    if form == "pgpassword":
        monkeypatch.setenv("PGPASSWORD", SECRET)
    monkeypatch.setenv("RECALLBOUND_LEDGER", ledger)
    monkeypatch.setenv("RECALLBOUND_STORE", "memory.db")
    for json_flag in ([], ["--json"]):
        code, out, err = _cli("config", "show", *json_flag)
        assert code == 0, err
        assert SECRET not in out + err
    shown = json.loads(_cli("config", "show", "--json")[1])["settings"][0]
    assert shown["key"] == "ledger" and shown["value"].startswith(ledger.split("password")[0][:8])


# -- PostgreSQL: the keyword form reaches the fleet's database, on both loops --------------------


@pytest.mark.anyio
async def test_a_keyword_dsn_shares_the_fleets_allowance(
    anyio_backend: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run = f"run-{uuid.uuid4()}"
    with _fresh_database() as database:
        await _share(_keyword_dsn(dbname=database),
                     _pg.DSN.rsplit("/", 1)[0] + f"/{database}", run)
    assert list(tmp_path.iterdir()) == []  # no SQLite file in the working folder


async def _share(by_keywords_dsn: str, uri: str, run: str) -> None:
    async with open_ledger(by_keywords_dsn) as by_keywords, open_ledger(uri) as by_uri:
        assert type(by_keywords).__name__ == "PostgresLedger"
        first = RecallAllowance(by_keywords)
        async with first.round(run, RoundKind.AUTOMATIC):
            pass
        usage = await RecallAllowance(by_uri).usage(run)
        assert usage.rounds == 1 and usage.reserved == first.policy.automatic_slots
        assert SECRET not in by_keywords.location  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_an_unreachable_keyword_dsn_fails_without_the_password(
    anyio_backend: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(LedgerUnavailableError) as caught:
        async with open_ledger(f"host=127.0.0.1 port=1 dbname=test user=u password={SECRET} "
                               f"connect_timeout=2"):
            pass  # pragma: no cover
    assert SECRET not in str(caught.value) and "\n" not in str(caught.value)
    assert SECRET not in caplog.text
    # nor in the chain: a driver error keeps its connection (pgconn), options and password
    assert [type(e).__name__ for e in _everything_in(caught.value)] == [
        "LedgerUnavailableError"]
    assert SECRET not in "".join(traceback.format_exception(caught.value))


def _everything_in(error: BaseException) -> list[BaseException]:
    """``error`` and every exception its causes and contexts reach."""
    seen: list[BaseException] = []
    waiting: list[BaseException | None] = [error]
    while waiting:
        found = waiting.pop()
        if found is not None and all(found is not e for e in seen):
            seen.append(found)
            waiting += [found.__cause__, found.__context__]
    return seen


def test_the_ledger_cli_never_prints_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    for ledger in (_keyword_dsn(), f"host=127.0.0.1 port=1 password={SECRET} connect_timeout=2",
                   f"host=127.0.0.1 dbname password={SECRET}"):
        for command in (["runs"], ["runs", "--json"], ["check"], ["show", "nope"]):
            code, out, err = _cli("ledger", "--ledger", ledger, *command)
            assert SECRET not in out + err, (ledger, command)
            if "port=1" in ledger or "dbname password" in ledger:
                assert code == 1 and err.startswith("recallbound: ") and err.count("\n") == 1


def test_a_postgres_ledger_on_an_unparseable_dsn_is_a_config_error_hiding_its_password() -> None:
    from plugin.control import PostgresLedger

    with pytest.raises(LedgerConfigError) as given_bytes:
        PostgresLedger(f"postgresql://app:{SECRET}@db/x".encode())  # type: ignore[arg-type]
    assert SECRET not in str(given_bytes.value)

    with pytest.raises(LedgerConfigError) as caught:
        PostgresLedger(f"postgresql://app:{SECRET}@[::1:5432/fleet")  # a missing "]"
    assert SECRET not in "".join(traceback.format_exception(caught.value))


@pytest.mark.anyio
async def test_a_sqlite_ledger_error_never_shows_a_password_in_its_path() -> None:
    with pytest.raises(LedgerPathError) as caught:  # a DSN handed to SqliteLedger itself
        async with SqliteLedger(f"'POSTGRES://app:{SECRET}@db/fleet'"):
            pass
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize("path", [
    f"host=127.0.0.1 dbname=test password={SECRET}", f"dbname=x port=notanumber password={SECRET}",
    "host=", f"postgres:{SECRET}@127.0.0.1/test",
])
@pytest.mark.parametrize("as_path", [False, True])
def test_a_sqlite_ledger_refuses_a_connection_string_and_creates_no_file(
    path: str, as_path: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SqliteLedger itself, not only the ``ledger`` setting: a connection string is never a
    file name (that file's name would hold the password), and the error does not echo it."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LedgerPathError) as caught:
        SqliteLedger(Path(path) if as_path else path)
    assert "connection string" in str(caught.value) and SECRET not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_a_sqlite_ledger_still_opens_files_whose_names_hold_an_equals_sign(
    tmp_path: Path,
) -> None:
    for name in (str(tmp_path / "host=x dbname=y"), "./a b=c", ":memory:", "ledger.db"):
        SqliteLedger(name)  # constructed, not opened: no file yet


@pytest.mark.parametrize("argv", [
    ["ledger", "runs", "--ledger", f"postgresql://app:{SECRET}@127.0.0.1/db"],
    ["ledger", "check", "--ledger", f"host=127.0.0.1 dbname=db user=app password={SECRET}"],
    ["--ledger", f"postgresql://app:{SECRET}@127.0.0.1/db", "ledger", "runs"],
    ["config", "show", f"postgresql://app:{SECRET}@127.0.0.1/db"],
], ids=["after the subcommand", "a keyword dsn", "before the command", "as a positional"])
def test_a_usage_error_never_prints_the_password(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse quotes the command line it could not read: the password is redacted there too."""
    assert main(argv) == 2
    printed = capsys.readouterr()
    assert "error:" in printed.err and SECRET not in printed.out + printed.err


@pytest.mark.parametrize("text", ["host=127.0.0.1 dbname=fleet user=app",
                                  "postgresql://app@127.0.0.1/fleet"])
def test_a_path_that_reads_as_a_connection_string_is_refused(text: str, tmp_path: Path) -> None:
    """Given as a str the same text opens PostgreSQL: as a path it is neither (one value, one
    ledger), and no SQLite file is made of it."""
    with pytest.raises(LedgerConfigError, match=r"connection string|PostgreSQL DSN"):
        parse_location(Path(text))
    with pytest.raises(ConfigError):
        RecallConfig(ledger_path=Path(text), store_path=tmp_path / "m.db")
    assert parse_location(tmp_path / "host=x.db").kind == "sqlite"  # an absolute path is a file


@pytest.mark.parametrize("text", ["ledger-2024-06-01T10:30.db", "run:2.db", "ledger.db",
                                  "'host=db dbname=fleet password=pw'", "\ufeffhost=db dbname=x",
                                  "\u200bpostgresql://app@db/fleet"])
def test_a_path_names_the_ledger_its_text_names(text: str) -> None:
    """Refused as a path exactly when refused as a str; a file otherwise, of the same name."""
    try:
        as_text = parse_location(text)
    except LedgerConfigError:
        with pytest.raises(LedgerConfigError):
            parse_location(Path(text))
        return
    assert as_text.kind == "sqlite"
    assert parse_location(Path(text)).target == str(Path(text))


def test_an_unparseable_dsns_error_holds_no_password_in_its_chain() -> None:
    with pytest.raises(LedgerConfigError) as caught:
        parse_location(f"host=127.0.0.1 dbname=x password=Open {SECRET}")
    chain, seen = [], caught.value
    while seen is not None:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    assert SECRET not in " ".join(str(error) for error in chain)


@pytest.mark.parametrize("argv", [
    ["evaluate", "--scenarios", "s.jsonl", "--out", "o", "--ledger",
     f"postgresql://app:{SECRET}@db/x"],
    ["evaluate", "--semantic", f"postgresql://app:{SECRET}@db/x"],
    ["evaluate", "--k", f"host=db password={SECRET}"],
], ids=["an unknown option", "a bad choice", "a bad value"])
def test_the_evaluators_usage_errors_never_print_the_password(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from plugin.evaluation.command import cli

    assert main(argv) == 2
    assert cli(argv[1:]) == 2
    printed = capsys.readouterr()
    assert printed.err.count("recallbound:") == 2 and SECRET not in printed.out + printed.err


@pytest.mark.parametrize("argv", [
    ["memory", "import", f"postgresql://u:{SECRET}@h/d"],
    ["evaluate", "--scenarios", f"postgresql://u:{SECRET}@h/d", "--out", "out"],
    ["config", "show", "--config", f"postgresql://u:{SECRET}@h/d"],
], ids=["memory import", "evaluate", "config show"])
def test_a_connection_string_given_for_a_file_is_shown_without_its_password(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Taken for a file name (a path keeps one slash of ``postgresql://``), its password is
    still hidden in the one-line error."""
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(*argv)
    printed = capsys.readouterr()
    assert code in (1, 2) and SECRET not in out + err + printed.out + printed.err
    assert "***" in err + printed.err


def test_redact_hides_a_uri_password_after_one_slash() -> None:
    assert redact(f"cannot use postgresql:/u:{SECRET}@h/d") == "cannot use postgresql:/u:***@h/d"


# -- a mistyped connection string is an error, never a file, and never shows its password --------


def _chain(error: BaseException) -> str:
    """The error's text, its repr and those of its whole cause/context chain."""
    seen: list[str] = []
    current: BaseException | None = error
    while current is not None and len(seen) < 20:
        seen += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return " ".join(seen)


TYPO_DSNS = [
    "host 127.0.0.1 dbname=test user=root",  # no "=" after the first keyword
    "psql host=127.0.0.1 dbname=test user=root",  # the command pasted with it
    "dbname test host=127.0.0.1",
    "host:127.0.0.1 dbname=test user=root",
    "host 127.0.0.1 dbname = test",
    "127.0.0.1 sslmode=require",
    "servi\u00adce=prod",  # a soft hyphen inside a keyword
    "\u3164dbname=test",  # a Hangul filler before it
    "\u2800host=h",  # a blank braille cell
    "host\u034f=h",  # a combining grapheme joiner
    "\u200epostgresql://h/db",  # a direction mark before a URI
    "postgre\ufe0fsql://h/db",  # a variation selector inside the scheme
]


@pytest.mark.parametrize("password", ["", f" password={SECRET}", f" password=my\\ {SECRET}",
                                      f" password='it\\'s {SECRET}'"],
                         ids=["none", "plain", "escaped", "quoted"])
@pytest.mark.parametrize("typo", TYPO_DSNS)
def test_a_keyword_string_with_a_typo_anywhere_is_an_error_never_a_file(
    typo: str, password: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    text = typo + password
    (tmp_path / "r.toml").write_text(f'ledger = {json.dumps(text)}\nstore = "m.db"\n')
    attempts = [
        lambda: parse_location(text),
        lambda: RecallConfig(ledger_path=text, store_path=tmp_path / "m.db"),
        lambda: load_config(env={"RECALLBOUND_LEDGER": text, "RECALLBOUND_STORE": "m.db"},
                            cwd=tmp_path),
        lambda: load_config(tmp_path / "r.toml", env={}),
    ]
    for attempt in attempts:
        with pytest.raises(ConfigError) as caught:
            attempt()
        assert isinstance(caught.value, LedgerConfigError) or "ledger" in str(caught.value)
        assert SECRET not in _chain(caught.value)
    code, out, err = _cli("ledger", "--ledger", text, "runs")
    assert code == 1 and SECRET not in out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.toml"]  # no SQLite file made


@pytest.mark.parametrize("location", [
    "./psql host=x.db", "/var/lib/recall/psql host=x.db", "notes v2=final.db", "data/x=1.db",
    "a b.db", "host.db", "./dbname=x.db",
])
def test_a_path_without_a_keyword_token_is_still_a_sqlite_file(location: str) -> None:
    parsed = parse_location(location)
    assert (parsed.kind, parsed.target) == ("sqlite", location)


AT_PASSWORDS = [
    "postgresql://root:Zq9x@SECRETtail@127.0.0.1:5432/test",
    "postgres://root:Zq9x@SECRETtail@localhost/test",
    "postgresql://root:Zq9x@SECRETtail@127.0.0.1",
    "postgresql://root:Zq9x@SECRETtail@127.0.0.1?sslmode=disable",
    "postgresql://root@SECRETtail:pw@127.0.0.1/test",
]


@pytest.mark.parametrize("dsn", AT_PASSWORDS)
def test_a_uri_with_a_raw_at_sign_in_its_userinfo_is_refused_without_showing_it(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq ends the userinfo at the first ``@``: the password's tail would be the host, shown
    in every message that names it."""
    from plugin.control import PostgresLedger

    monkeypatch.chdir(tmp_path)
    for attempt in (
        lambda: parse_location(dsn),
        lambda: PostgresLedger(dsn),
        lambda: RecallConfig(ledger_path=dsn, store_path=tmp_path / "m.db"),
        lambda: load_config(env={"RECALLBOUND_LEDGER": dsn, "RECALLBOUND_STORE": "m.db"}),
    ):
        with pytest.raises(ConfigError, match="%40") as caught:
            attempt()
        assert "SECRETtail" not in _chain(caught.value)
    assert "SECRETtail" not in redact(dsn) and "SECRETtail" not in redact(f"cannot open {dsn}")
    monkeypatch.setenv("RECALLBOUND_LEDGER", dsn)
    monkeypatch.setenv("RECALLBOUND_STORE", "m.db")
    for argv in (["config", "show"], ["config", "show", "--json"], ["ledger", "runs"],
                 ["ledger", "--ledger", dsn, "runs"]):
        code, out, err = _cli(*argv)
        assert code == 1 and "SECRETtail" not in out + err, argv


@pytest.mark.parametrize("dsn", [
    "postgresql://127.0.0.1?sslmode=disable&password=SECRETtail&user=root@x",
    "postgresql://db?user=alice@corp&password=SECRETtail",
    "postgresql://db:5432?user=alice@corp&password=SECRETtail",
])
def test_a_uri_whose_query_libpq_reads_as_its_user_or_host_is_refused_without_showing_it(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no path, libpq reads up to the first ``@`` as the userinfo, ``?`` and all: the
    query's password would be read (and shown) as part of the host or the user name."""
    monkeypatch.chdir(tmp_path)
    for attempt in (
        lambda: parse_location(dsn),
        lambda: RecallConfig(ledger_path=dsn, store_path=tmp_path / "m.db"),
        lambda: load_config(env={"RECALLBOUND_LEDGER": dsn, "RECALLBOUND_STORE": "m.db"}),
    ):
        with pytest.raises(ConfigError) as caught:
            attempt()
        assert "SECRETtail" not in _chain(caught.value)
    monkeypatch.setenv("RECALLBOUND_LEDGER", dsn)
    monkeypatch.setenv("RECALLBOUND_STORE", "m.db")
    for argv in (["config", "show"], ["config", "show", "--json"], ["ledger", "runs"]):
        code, out, err = _cli(*argv)
        assert code == 1 and "SECRETtail" not in out + err, argv


def test_an_at_sign_in_a_uri_query_keeps_the_host_and_database_in_view() -> None:
    dsn = "postgresql://root:SECRETtail@db.internal:5432/fleet?application_name=ops@team"
    shown = "postgresql://root:***@db.internal:5432/fleet?application_name=ops@team"
    assert redact(dsn) == shown == shown_location(dsn)
    assert redact(f"cannot open {dsn} now") == f"cannot open {shown} now"


@pytest.mark.parametrize("dsn", [
    "postgresql://root:Zq9x%40tail@127.0.0.1/test",
    "postgresql://127.0.0.1/test?options=-c%20a%3Db&application_name=a@b",
    "postgresql://app:pw@127.0.0.1?application_name=a@b",
    "postgresql://root@127.0.0.1/test",
])
def test_a_uri_with_its_at_signs_encoded_or_after_the_host_is_a_postgres_ledger(dsn: str) -> None:
    assert parse_location(dsn).kind == "postgres"


CONFIG_FILE_DSNS = [
    f"postgresql://root:{SECRET}@127.0.0.1/test",
    f"host=127.0.0.1 password={SECRET}",
    f"host=127.0.0.1 password=my\\ {SECRET}",
    f"host=127.0.0.1 password='it\\'s {SECRET}'",
    f"psql host=127.0.0.1 password={SECRET}",
]


@pytest.mark.parametrize("dsn", CONFIG_FILE_DSNS)
def test_a_connection_string_named_as_the_configuration_file_is_never_shown(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RECALLBOUND_CONFIG (or ``--config``) given the ledger's DSN: the missing file's error
    hides the password, as given or escaped."""
    monkeypatch.chdir(tmp_path)
    for name in [n for n in __import__("os").environ if n.startswith("RECALLBOUND_")]:
        monkeypatch.delenv(name)
    for attempt in (lambda: RecallConfig.from_sources(env={"RECALLBOUND_CONFIG": dsn}),
                    lambda: RecallConfig.from_sources(dsn, env={}),
                    lambda: load_config(Path(dsn), env={})):
        with pytest.raises(ConfigError, match="configuration file") as caught:
            attempt()
        assert SECRET not in _chain(caught.value)
    for argv in (["config", "show", "--config", dsn], ["ledger", "--config", dsn, "runs"]):
        code, out, err = _cli(*argv)
        assert code == 1 and SECRET not in out + err, argv
    monkeypatch.setenv("RECALLBOUND_CONFIG", dsn)
    code, out, err = _cli("config", "show")
    assert code == 1 and "configuration file" in err and SECRET not in out + err


@pytest.mark.parametrize("dsn", CONFIG_FILE_DSNS)
@pytest.mark.parametrize("argv", [
    ["ledger", "{dsn}", "runs"],  # --ledger forgotten: an invalid choice, quoted with repr
    ["evaluate", "--k", "{dsn}"],
    ["demo", "--backend", "{dsn}"],
    ["ledger", "runs", "{dsn}"],
])
def test_a_usage_error_quoting_an_escaped_password_never_prints_it(
    argv: list[str], dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([dsn if part == "{dsn}" else part for part in argv]) == 2
    printed = capsys.readouterr()
    assert printed.err.startswith(("usage", "recallbound"))
    assert SECRET not in printed.out + printed.err


@pytest.mark.parametrize("dsn", [
    f"postgresql://app:{SECRET}@x@db/fleet",  # a raw "@" in the password
    f"postgresql://app:{SECRET}%zz@db/fleet",  # bad percent-encoding
    f"postgresql://app:{SECRET}@db/fleet?no_such_option=1",
])
def test_a_whole_postgresql_uri_that_cannot_be_used_is_named_by_its_scheme(dsn: str) -> None:
    """Its scheme is there: the error says so (not "a URI without its scheme"), and hides the
    password."""
    with pytest.raises(LedgerConfigError) as caught:
        parse_location(dsn)
    assert "(a postgresql: URI)" in str(caught.value) and SECRET not in str(caught.value)
