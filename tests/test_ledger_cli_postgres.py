"""``recallbound ledger runs|show|prune|check`` on a PostgreSQL ledger, end to end.

The ledger is the one tests/test_ledger_cli.py writes into SQLite (``fill_ledger``), written into
a schema of its own on the test server (tests/_pg.py; dropped afterwards; no skip) and named by
the DSN's ``schema`` parameter. The CLI opens it as an operator does: judged by the server's
clock, never creating a schema. Its own clock is a ManualClock (``NOW``), behind the server's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest

from plugin import PostgresLedger
from plugin.control.postgres_ledger import SCHEMA_VERSION

from . import _pg
from .test_ledger_cli import NOW, cli, fill_ledger


@pytest.fixture
def schema() -> Iterator[str]:
    with _pg.fresh_schema("cli") as name:
        yield name


@pytest.fixture
def location(schema: str) -> str:
    """The populated ledger's location, as an operator writes it."""

    async def fill() -> None:
        async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
            await fill_ledger(ledger)

    anyio.run(fill)
    return f"{_pg.DSN}?schema={schema}"


def _sql(statement: str, *params: object) -> list[tuple[object, ...]]:
    with _pg.connect() as conn:
        cur = conn.execute(statement.encode(), params or None)
        return cur.fetchall() if cur.description else []


def _with_password(dsn: str, password: str) -> str:
    scheme, _, rest = dsn.partition("://")
    user, at, host = rest.rpartition("@")
    return f"{scheme}://{user.split(':')[0] if at else 'root'}:{password}@{host}"


# -- runs ----------------------------------------------------------------------------------


def test_runs_table(location: str) -> None:
    code, out, err = cli("ledger", "--ledger", location, "runs")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "OPENED", "(UTC)", "ROUNDS", "RESERVED", "EXECUTED",
                                "REFUSED", "DEADLINE", "(UTC)", "STATUS"]
    assert lines[1].split()[0] == "live" and lines[1].split()[-1] == "open"
    old = lines[2].split()
    assert old[0] == "old"
    assert old[3:7] == ["2/2", "4/4", "3", "1"]
    assert old[-3:] == ["2023-11-14", "22:13:30", "finished"]


def test_runs_json(location: str) -> None:
    code, out, _ = cli("ledger", "--ledger", location, "runs", "--json", "--limit", "1")
    assert code == 0
    document = json.loads(out)
    assert document["ledger"] == location
    (live,) = document["runs"]
    assert (live["run_id"], live["status"], live["reserved"], live["executed"],
            live["deadline_wall"]) == ("live", "open", 2, 1, NOW - 60 + 3600)


# -- show ----------------------------------------------------------------------------------


def test_show_prints_the_timeline(location: str) -> None:
    code, out, err = cli("ledger", "--ledger", location, "show", "old")
    assert (code, err) == (0, "")
    assert "run old: finished" in out
    assert "rounds 2/2, reserved 4/4, executed 3, refused 1" in out
    timeline = [line.split(None, 1)[1] for line in out.splitlines() if line.startswith("  ")
                and line.strip()[0] == "+"]
    assert timeline == [
        "round 1 automatic: requested 2, granted 2 (slots 1-2)",
        "attempt slot 1 (round 1, base): ok in 0.500s strategy=task_context query=abababababab",
        "round 2 deliberate: requested 3, granted 2 (slots 3-4)",
        "attempt slot 3 (round 2, deliberate): ok in 0.125s",
        "attempt slot 4 (round 2, deliberate): ok in 0.125s",
        "refused attempt (deliberate) in round 2: slots",
    ]


def test_show_json(location: str) -> None:
    code, out, _ = cli("ledger", "--ledger", location, "show", "old", "--json")
    assert code == 0
    document = json.loads(out)
    assert document["run"]["executed"] == 3
    events = [(e["event"], e.get("slot"), e["offset_s"]) for e in document["timeline"]]
    assert events == [("round", None, 0.0), ("attempt", 1, 0.25), ("round", None, 0.75),
                      ("attempt", 3, 0.75), ("attempt", 4, 0.875), ("refusal", None, 1.0)]


def test_show_an_unknown_run(location: str) -> None:
    code, out, err = cli("ledger", "--ledger", location, "show", "nope")
    assert (code, out) == (1, "")
    assert err == f"recallbound: no run 'nope' in {location}\n"


# -- prune ---------------------------------------------------------------------------------


def test_prune_dry_run_then_prune(location: str, schema: str) -> None:
    code, out, _ = cli("ledger", "--ledger", location, "prune", "--older-than", "30d",
                       "--dry-run")
    assert code == 0
    assert out.startswith("would remove 1 finished run(s) whose deadline passed before "
                          "2023-11-24 22:13:20 UTC (runs 1, rounds 2, attempts 3, refusals 1, "
                          "retained 1, validations 0, calls 0)\n  old\n")
    assert "old" in cli("ledger", "--ledger", location, "runs")[1]
    code, out, _ = cli("ledger", "--ledger", location, "prune", "--older-than", "30d", "--json")
    assert code == 0
    document = json.loads(out)
    assert (document["dry_run"], document["run_ids"], document["rows"]) == (
        False, ["old"], {"runs": 1, "rounds": 2, "attempts": 3, "refusals": 1, "retained": 1,
                         "validations": 0, "calls": 0})
    assert cli("ledger", "--ledger", location, "show", "old")[0] == 1
    assert _sql(f'SELECT count(*) FROM "{schema}".attempts WHERE run_id = %s', "old") == [(0,)]


def test_prune_keeps_a_run_whose_deadline_has_not_passed(location: str) -> None:
    code, out, _ = cli("ledger", "--ledger", location, "prune", "--older-than", "0s", "--json")
    assert code == 0 and json.loads(out)["run_ids"] == ["old"]
    assert "live" in cli("ledger", "--ledger", location, "runs")[1]


# -- check ---------------------------------------------------------------------------------


def test_check_ok(location: str) -> None:
    code, out, _ = cli("ledger", "--ledger", location, "check")
    version = SCHEMA_VERSION
    first, checked = out.splitlines()
    assert (code, first) == (
        0, f"{location} (postgresql): schema version {version} (expected {version}): ok")
    assert checked.startswith("  checked: ") and "the ledger's invariants" in checked
    document = json.loads(cli("ledger", "--ledger", location, "check", "--json")[1])
    assert (document["backend"], document["ok"], document["schema_version"],
            document["problems"]) == ("postgresql", True, version, [])


def test_check_reports_broken_invariants(location: str, schema: str) -> None:
    _sql(f"UPDATE \"{schema}\".runs SET reserved = 9 WHERE run_id = 'old'")
    _sql(f"DELETE FROM \"{schema}\".runs WHERE run_id = 'live'")
    code, out, _ = cli("ledger", "--ledger", location, "check", "--json")
    assert code == 1
    problems = json.loads(out)["problems"]
    assert "run old: its rounds granted 4 slots but the run counts 9 reserved" in problems
    assert "run old: 9 slots reserved, over its limit of 4" in problems
    assert any(p.startswith("run live: attempt ") and "never reserved" in p for p in problems)
    assert "run live: 1 round rows but no run" in problems
    text = cli("ledger", "--ledger", location, "check")[1]
    assert text.splitlines()[0].endswith(": 4 problem(s)")


# -- where the ledger is, and bad input ----------------------------------------------------


def test_a_missing_schema_is_an_error_and_is_not_created(schema: str) -> None:
    code, out, err = cli("ledger", "--ledger", f"{_pg.DSN}?schema={schema}", "check")
    assert (code, out) == (1, "")
    assert err == (f"recallbound: no recallbound ledger in schema '{schema}' of this "
                   "database\n")
    assert _sql("SELECT count(*) FROM pg_namespace WHERE nspname = %s", schema) == [(0,)]


def test_a_foreign_schema(schema: str) -> None:
    _sql(f'CREATE SCHEMA "{schema}"')
    _sql(f'CREATE TABLE "{schema}".users (id int)')
    code, _, err = cli("ledger", "--ledger", f"{_pg.DSN}?schema={schema}", "runs")
    assert code == 1
    assert err == (f"recallbound: schema '{schema}' holds other tables and is not a "
                   "recallbound ledger\n")


@pytest.mark.parametrize("query", ["?schema=a&schema=b", "?schema=", "?schema=Bad-Name"])
def test_a_bad_schema_parameter(query: str) -> None:
    code, out, err = cli("ledger", "--ledger", _pg.DSN + query, "runs")
    assert (code, out) == (1, "")
    assert err.startswith("recallbound: ") and "schema" in err and err.count("\n") == 1


def test_the_password_is_never_printed(location: str, schema: str) -> None:
    dsn = _with_password(_pg.DSN, "hunter2") + f"?schema={schema}"  # trust auth ignores it
    for command in (["runs", "--json"], ["show", "old", "--json"], ["check"],
                    ["check", "--json"], ["show", "nope"],
                    ["prune", "--older-than", "90d", "--json"]):
        _, out, err = cli("ledger", "--ledger", dsn, *command)
        assert "hunter2" not in out + err, command
        assert ":***@" in out + err, command  # each names the ledger, redacted


@pytest.mark.parametrize(
    "ledger",
    ["postgresql://u:s3cr3t@127.0.0.1:1/test?schema=x",  # nothing listens on port 1
     "{dsn}?schema={schema}&password=s3cr3t",  # reachable; no such schema
     "{dsn_pw}?schema={schema}&dbname=no_such_database"],
)
@pytest.mark.parametrize("command", [["show", "r1"], ["prune", "--older-than", "30d"]])
def test_the_installed_command_fails_in_one_line(ledger: str, command: list[str],
                                                 schema: str) -> None:
    location = ledger.format(dsn=_pg.DSN, schema=schema,
                             dsn_pw=_with_password(_pg.DSN, "s3cr3t"))
    result = subprocess.run(
        [sys.executable, "-m", "runtime_hooks", "ledger", "--ledger", location, *command],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert (result.returncode, result.stdout) == (1, "")
    (line,) = result.stderr.splitlines()
    assert line.startswith("recallbound: ") and "s3cr3t" not in result.stderr
    assert _sql("SELECT count(*) FROM pg_namespace WHERE nspname = %s", schema) == [(0,)]
