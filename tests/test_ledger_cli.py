"""``recallbound ledger runs|show|prune|check``: output, JSON, and bad input without tracebacks."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from plugin.control import (
    AllowancePolicy,
    AttemptKind,
    Ledger,
    ManualClock,
    RecallAllowance,
    RecallBudgetExceeded,
    RoundKind,
    SqliteLedger,
)
from runtime_hooks.__main__ import main

WALL = 1_700_000_000.0
NOW = WALL + 40 * 86_400.0  # the CLI's clock: 40 days later
FINGERPRINT = "ab" * 32


def _populate(path: Path) -> None:
    """"old": finished at WALL+10, with a refused attempt; "live": deadline after NOW."""

    async def fill() -> None:
        async with SqliteLedger(path) as ledger:
            await fill_ledger(ledger)

    anyio.run(fill)


async def fill_ledger(ledger: Ledger) -> None:
    """What ``_populate`` writes, into any opened ledger judged by the caller's times."""
    clock = ManualClock(wall=WALL, monotonic=1.0)
    allowance = RecallAllowance(ledger, clock=clock)
    async with allowance.round("old", RoundKind.AUTOMATIC) as permit:
        clock.advance(0.25)
        async with permit.attempt(AttemptKind.BASE, strategy="task_context",
                                  fingerprint=FINGERPRINT):
            clock.advance(0.5)
    async with allowance.round("old", RoundKind.DELIBERATE, slots=3) as permit:
        for _ in range(3):
            try:
                async with permit.attempt():
                    clock.advance(0.125)
            except RecallBudgetExceeded:
                pass
    await ledger.retain("old", ["m1"], limit=4)
    live = RecallAllowance(
        ledger, policy=AllowancePolicy(deadline_s=3600.0),
        clock=ManualClock(wall=NOW - 60, monotonic=1.0))
    async with live.round("live", RoundKind.AUTOMATIC) as permit:
        async with permit.attempt(AttemptKind.BASE):
            pass


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    _populate(path)
    return path


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), clock=ManualClock(wall=NOW, monotonic=0.0), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


# -- runs --------------------------------------------------------------------------------------


def test_runs_table(ledger_file: Path) -> None:
    code, out, err = cli("ledger", "--ledger", str(ledger_file), "runs")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "OPENED", "(UTC)", "ROUNDS", "RESERVED", "EXECUTED",
                                "REFUSED", "DEADLINE", "(UTC)", "STATUS"]
    assert lines[1].split()[0] == "live" and lines[1].split()[-1] == "open"
    old = lines[2].split()
    assert old[0] == "old"
    assert old[3:7] == ["2/2", "4/4", "3", "1"]
    assert old[-3:] == ["2023-11-14", "22:13:30", "finished"]


def test_runs_json(ledger_file: Path) -> None:
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "runs", "--json", "--limit", "1")
    assert code == 0
    document = json.loads(out)
    assert [r["run_id"] for r in document["runs"]] == ["live"]
    (live,) = document["runs"]
    assert (live["status"], live["reserved"], live["executed"], live["deadline_wall"]) == (
        "open", 2, 1, NOW - 60 + 3600)


# -- show --------------------------------------------------------------------------------------


def test_show_prints_the_timeline(ledger_file: Path) -> None:
    code, out, err = cli("ledger", "--ledger", str(ledger_file), "show", "old")
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
    assert "    +0.250s  attempt slot 1" in out  # offsets from the run's opening


def test_show_json(ledger_file: Path) -> None:
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "show", "old", "--json")
    assert code == 0
    document = json.loads(out)
    assert document["run"]["executed"] == 3
    events = [(e["event"], e.get("slot"), e["offset_s"]) for e in document["timeline"]]
    assert events == [("round", None, 0.0), ("attempt", 1, 0.25), ("round", None, 0.75),
                      ("attempt", 3, 0.75), ("attempt", 4, 0.875), ("refusal", None, 1.0)]
    assert "text" not in json.dumps(document).lower().replace("task_context", "")


def test_show_unknown_run(ledger_file: Path) -> None:
    code, out, err = cli("ledger", "--ledger", str(ledger_file), "show", "nope")
    assert (code, out) == (1, "")
    assert err == f"recallbound: no run 'nope' in {ledger_file}\n"


@pytest.mark.parametrize("run_id", ["", "   ", "a\x00b", "\udcff"])
def test_show_a_run_id_no_ledger_can_hold_is_a_usage_error(
    ledger_file: Path, run_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "show", run_id)
    usage = capsys.readouterr().err  # argparse's usage line
    assert (code, out) == (2, "") and "RUN_ID" in usage and "does not know" not in usage


@pytest.mark.parametrize("limit", ["99999999999999999999999", "9223372036854775808", "0"])
def test_runs_limit_past_a_64_bit_integer_is_a_usage_error(
    ledger_file: Path, limit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "runs", "--limit", limit)
    usage = capsys.readouterr().err
    assert (code, out) == (2, "") and "positive integer" in usage and "Traceback" not in usage


# -- prune -------------------------------------------------------------------------------------


def test_prune_dry_run_then_prune(ledger_file: Path) -> None:
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "prune", "--older-than", "30d",
                       "--dry-run")
    assert code == 0
    assert out.startswith("would remove 1 finished run(s) whose deadline passed before "
                          "2023-11-24 22:13:20 UTC (runs 1, rounds 2, attempts 3, refusals 1, "
                          "retained 1, validations 0, calls 0)\n  old\n")
    assert "old" in cli("ledger", "--ledger", str(ledger_file), "runs")[1]
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "prune", "--older-than", "30d",
                       "--json")
    assert code == 0
    document = json.loads(out)
    assert (document["dry_run"], document["run_ids"], document["rows"]["attempts"]) == (
        False, ["old"], 3)
    assert cli("ledger", "--ledger", str(ledger_file), "show", "old")[0] == 1


def test_a_pruned_run_refused_again_is_shown_pruned_not_legacy(ledger_file: Path) -> None:
    assert cli("ledger", "--ledger", str(ledger_file), "prune", "--older-than", "30d")[0] == 0

    async def round_again() -> None:
        async with SqliteLedger(ledger_file) as ledger:
            allowance = RecallAllowance(ledger, clock=ManualClock(wall=NOW, monotonic=1.0))
            with pytest.raises(RecallBudgetExceeded):
                async with allowance.round("old", RoundKind.AUTOMATIC):
                    pass

    anyio.run(round_again)
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "show", "old")
    assert code == 0 and out.startswith("run old: pruned") and "legacy" not in out
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "show", "old", "--json")
    assert json.loads(out)["pruned"] is True


def test_prune_keeps_a_run_whose_deadline_has_not_passed(ledger_file: Path) -> None:
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "prune", "--older-than", "0s",
                       "--json")
    assert code == 0 and json.loads(out)["run_ids"] == ["old"]
    assert "live" in cli("ledger", "--ledger", str(ledger_file), "runs")[1]


@pytest.mark.parametrize("duration", ["30", "30x", "-1d", "d", "1e400d", "thirty days", "",
                                      "99999999999999999w", "60000y", "3000000000000s"])
def test_prune_rejects_a_bad_duration(ledger_file: Path, duration: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "prune", "--older-than", duration)
    assert (code, out) == (2, "")
    err = capsys.readouterr().err
    assert "invalid duration" in err or "expected one argument" in err
    assert "Traceback" not in err


def test_prune_needs_older_than(ledger_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("ledger", "--ledger", str(ledger_file), "prune")[0] == 2
    assert "--older-than" in capsys.readouterr().err


# -- check -------------------------------------------------------------------------------------


def test_check_ok(ledger_file: Path) -> None:
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "check")
    assert code == 0
    first, checked = out.splitlines()
    version = SqliteLedger.schema_version
    assert first == f"{ledger_file} (sqlite): schema version {version} (expected {version}): ok"
    assert checked.startswith("  checked: storage integrity (PRAGMA integrity_check); ")
    assert "the ledger's invariants" in checked
    document = json.loads(cli("ledger", "--ledger", str(ledger_file), "check", "--json")[1])
    assert (document["ok"], document["schema_version"], document["problems"]) == (True, version, [])
    assert document["checked"] == checked.removeprefix("  checked: ").split("; ")


def test_check_reports_broken_invariants(ledger_file: Path) -> None:
    with contextlib.closing(sqlite3.connect(ledger_file)) as raw, raw:
        raw.execute("UPDATE runs SET reserved = 9 WHERE run_id = 'old'")
        raw.execute("DELETE FROM runs WHERE run_id = 'live'")
    code, out, _ = cli("ledger", "--ledger", str(ledger_file), "check", "--json")
    assert code == 1
    problems = json.loads(out)["problems"]
    assert "run old: its rounds granted 4 slots but the run counts 9 reserved" in problems
    assert "run old: 9 slots reserved, over its limit of 4" in problems
    assert any(p.startswith("run live: attempt ") and "never reserved" in p for p in problems)
    assert "run live: 1 round rows but no run" in problems
    text = cli("ledger", "--ledger", str(ledger_file), "check")[1]
    assert ": 4 problem(s)\n" in text.splitlines()[0] + "\n"


# -- bad input ---------------------------------------------------------------------------------


def test_missing_file_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    code, out, err = cli("ledger", "--ledger", str(missing), "runs")
    assert (code, out) == (1, "")
    assert err == f"recallbound: no ledger file at {str(missing)!r}\n"
    assert not missing.exists()


def test_foreign_sqlite_database(tmp_path: Path) -> None:
    foreign = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(foreign)) as raw, raw:
        raw.execute("CREATE TABLE users (id INTEGER)")
    code, _, err = cli("ledger", "--ledger", str(foreign), "check")
    assert code == 1
    assert err == (f"recallbound: {str(foreign)!r} is an SQLite database but not a "
                   "recallbound ledger\n")


def test_not_a_database(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("hello " * 1000)
    code, _, err = cli("ledger", "--ledger", str(junk), "runs")
    assert code == 1 and err.startswith("recallbound: ledger ") and "not a" in err


def test_a_folder(tmp_path: Path) -> None:
    code, _, err = cli("ledger", "--ledger", str(tmp_path), "runs")
    assert (code, err) == (1, f"recallbound: {str(tmp_path)!r} is a directory, not a ledger "
                              f"file\n")


def test_a_device_or_a_pipe_is_not_a_ledger_file(tmp_path: Path) -> None:
    import os

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for where in ("/dev/zero", str(pipe)):
        code, out, err = cli("ledger", "--ledger", where, "runs")
        assert (code, out) == (1, "")
        assert err == f"recallbound: {where!r} is not a regular file, not a ledger file\n"


@pytest.mark.parametrize("argv", [["runs"], ["check"], ["prune", "--older-than", "1d",
                                                        "--dry-run"], ["show", "r"]])
def test_no_command_turns_an_empty_file_into_a_ledger(tmp_path: Path, argv: list[str]) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    code, out, err = cli("ledger", "--ledger", str(empty), *argv)
    assert (code, out) == (1, "")
    assert err == (f"recallbound: {str(empty)!r} is empty (0 bytes), not a recallbound ledger; "
                   f"no command creates a ledger\n")
    assert empty.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]  # no -wal, no -shm


@pytest.mark.parametrize("argv", [["runs"], ["check"], ["show", "r"]])
def test_no_command_turns_an_empty_sqlite_database_into_a_ledger(
    tmp_path: Path, argv: list[str]
) -> None:
    empty = tmp_path / "empty.db"
    with contextlib.closing(sqlite3.connect(empty)) as raw:
        raw.execute("PRAGMA user_version = 0")
        raw.execute("VACUUM")  # a database file with no table
    before = empty.read_bytes()
    code, out, err = cli("ledger", "--ledger", str(empty), *argv)
    assert (code, out) == (1, "") and "a SQLite database with no tables" in err
    assert empty.read_bytes() == before


@pytest.mark.parametrize("location", [":memory:", "file:x?mode=memory"])
@pytest.mark.parametrize("argv", [["runs"], ["check"], ["prune", "--older-than", "1d"]])
def test_a_ledger_in_memory_is_refused(location: str, argv: list[str]) -> None:
    code, out, err = cli("ledger", "--ledger", location, *argv)
    assert (code, out) == (1, "") and "in memory" in err and err.count("\n") == 1


def test_a_file_uri_ledger_is_the_file_it_names(ledger_file: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ledger_file.parent)
    for location in (f"file:{ledger_file.name}", f"file://{ledger_file}",
                     f"file:{ledger_file}?mode=rw"):
        code, out, err = cli("ledger", "--ledger", location, "runs")
        assert (code, err) == (0, "") and "old" in out, location
    code, _, err = cli("ledger", "--ledger", "file:missing.db", "runs")
    assert code == 1 and "no ledger file at 'file:missing.db'" in err


def test_runs_on_a_hand_edited_time_is_one_line(ledger_file: Path) -> None:
    with contextlib.closing(sqlite3.connect(ledger_file)) as raw, raw:
        raw.executescript(
            "CREATE TABLE runs2 (run_id TEXT PRIMARY KEY, opened_wall, deadline_wall, "
            "max_searches, max_rounds, rounds, reserved, last_grant, pruned DEFAULT 0);"
            "INSERT INTO runs2 SELECT * FROM runs;"
            "UPDATE runs2 SET opened_wall = 'yesterday' WHERE run_id = 'old';"
            "DROP TABLE runs; ALTER TABLE runs2 RENAME TO runs;")
    code, out, err = cli("ledger", "--ledger", str(ledger_file), "runs")
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert "holds data this version of recallbound cannot read" in err


# -- what is printed is escaped -----------------------------------------------------------------

FORGED = "evil\nold     2023-11-14 22:13:20  2/2  4/4  forged\x1b[2J\x9b31m\u202e\x7f"


def _ledger_with(path: Path, run_id: str, wall: float = WALL) -> None:
    async def fill() -> None:
        async with SqliteLedger(path) as ledger:
            allowance = RecallAllowance(ledger, clock=ManualClock(wall=wall, monotonic=1))
            async with allowance.round(run_id, RoundKind.AUTOMATIC) as permit:
                async with permit.attempt(AttemptKind.BASE, strategy="x\ny\x1b"):
                    pass

    anyio.run(fill)


def _raw_controls(text: str) -> list[str]:
    import unicodedata

    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf")]


def test_a_run_id_cannot_forge_rows_or_reach_the_terminal(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _ledger_with(path, FORGED)
    code, out, _ = cli("ledger", "--ledger", str(path), "runs")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2  # the header and one run: no forged row
    assert lines[1].startswith("evil\\nold     2023-11-14 22:13:20  2/2  4/4  "
                               "forged\\x1b[2J\\x9b31m\\u202e\\x7f ")
    assert _raw_controls(out) == []
    code, out, _ = cli("ledger", "--ledger", str(path), "show", FORGED)
    assert code == 0 and _raw_controls(out) == []
    assert out.splitlines()[0].startswith("run evil\\nold ")
    assert "strategy=x\\ny\\x1b" in out
    for command in (["runs", "--json"], ["show", FORGED, "--json"],
                    ["prune", "--older-than", "0s", "--json", "--dry-run"]):
        code, out, _ = cli("ledger", "--ledger", str(path), *command)
        assert code == 0 and _raw_controls(out) == [] and "\u202e" not in out
        assert FORGED in out.replace("\\u009b", "\x9b").replace("\\u202e", "\u202e") \
            .replace("\\u001b", "\x1b").replace("\\u007f", "\x7f").replace("\\n", "\n") \
            or command[0] == "prune"
    # Prune judges a run by the ledger's own newest record too: a later run makes it finished.
    _ledger_with(path, "later", wall=WALL + 3600)
    code, out, _ = cli("ledger", "--ledger", str(path), "prune", "--older-than", "0s")
    assert code == 0 and _raw_controls(out) == [] and len(out.splitlines()) == 2


def test_an_error_naming_a_run_is_escaped(ledger_file: Path) -> None:
    code, out, err = cli("ledger", "--ledger", str(ledger_file), "show", "no\nsuch\x1b[31m")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and _raw_controls(err) == []


def test_show_on_an_outcome_it_does_not_know_is_one_line(ledger_file: Path) -> None:
    with contextlib.closing(sqlite3.connect(ledger_file)) as raw, raw:
        raw.execute("UPDATE attempts SET outcome = 'teleported' WHERE run_id = 'old'")
    code, out, err = cli("ledger", "--ledger", str(ledger_file), "show", "old")
    assert (code, out) == (1, "")
    assert err.startswith("recallbound: run 'old' in ") and "'teleported'" in err
    assert err.count("\n") == 1
    assert cli("ledger", "--ledger", str(ledger_file), "show", "live")[0] == 0


# -- --version and the demo --------------------------------------------------------------------


def test_version() -> None:
    import importlib.metadata

    code, out, err = cli("--version")
    assert (code, out, err) == (0, f"recallbound {importlib.metadata.version('recallbound')}\n",
                                "")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_demo_runs_twice_on_one_folder(tmp_path: Path, backend: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--backend", backend, "--semantic", "hashing", "--data-dir", str(tmp_path)]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    second = capsys.readouterr().out
    assert "seeded by an earlier run" in second and "seeded by an earlier run" not in first
    assert "attempt traces of run 'parallel':" in first
    assert "attempt traces of run 'parallel-2':" in second
    # The second run got the same allowance as the first: four searches, then refusals.
    assert first.count("refused (") == second.count("refused (") > 0


def test_no_ledger_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("ledger", "runs")
    assert code == 1 and "no ledger given" in err


def test_the_ledger_comes_from_the_configuration(
    ledger_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "recallbound.toml").write_text(f'ledger = "{ledger_file.name}"\n'
                                             'store = "store.db"\n')
    ledger_file.rename(folder / ledger_file.name)
    monkeypatch.chdir(folder)
    code, out, _ = cli("ledger", "runs", "--json")
    assert code == 0 and [r["run_id"] for r in json.loads(out)["runs"]] == ["live", "old"]
    monkeypatch.setenv("RECALLBOUND_LEDGER", str(tmp_path / "elsewhere.db"))
    code, _, err = cli("ledger", "runs")
    assert code == 1 and "elsewhere.db" in err


def test_an_unreachable_postgres_ledger_is_a_clear_error() -> None:
    code, _, err = cli("ledger", "--ledger", "postgresql://u:secret@127.0.0.1:1/x", "runs")
    assert code == 1 and err.startswith("recallbound: "), err
    assert "Traceback" not in err
    assert "secret" not in err


@pytest.mark.parametrize(
    "argv",
    [["ledger", "--ledger", "{missing}", "runs"],
     ["ledger", "--ledger", "{foreign}", "show", "x"],
     ["ledger", "--ledger", "{ledger}", "show", "unknown"],
     ["ledger", "--ledger", "{ledger}", "prune", "--older-than", "soon"]],
)
def test_the_installed_command_never_prints_a_traceback(
    ledger_file: Path, tmp_path: Path, argv: list[str]
) -> None:
    foreign = tmp_path / "foreign.db"
    with contextlib.closing(sqlite3.connect(foreign)) as raw, raw:
        raw.execute("CREATE TABLE t (x)")
    paths = {"missing": str(tmp_path / "missing.db"), "foreign": str(foreign),
             "ledger": str(ledger_file)}
    result = subprocess.run(
        [sys.executable, "-m", "runtime_hooks", *(a.format(**paths) for a in argv)],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode in (1, 2)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(("recallbound: ",
                                                              "recallbound ledger prune: "))


def test_show_a_legacy_only_run(tmp_path: Path) -> None:
    path = tmp_path / "legacy.db"

    async def fill() -> None:
        async with SqliteLedger(path) as ledger:
            allowance = RecallAllowance.legacy(ledger, clock=ManualClock(wall=WALL, monotonic=1))
            async with allowance.round("old-style", RoundKind.AUTOMATIC) as permit:
                async with permit.attempt(AttemptKind.BASE):
                    pass

    anyio.run(fill)
    code, out, _ = cli("ledger", "--ledger", str(path), "show", "old-style")
    assert code == 0
    assert out.splitlines()[0] == "run old-style: legacy only (no reservation; not enforced)"
    assert "attempt slot 1 (round 0, base): ok in 0.000s legacy" in out
    assert cli("ledger", "--ledger", str(path), "runs")[1] == f"no runs in {path}\n"


@pytest.mark.parametrize("value", ["9e999", "-9e999", "1e300"])
def test_a_stored_time_that_is_no_time_is_printed_not_a_traceback(ledger_file: Path,
                                                                  value: str) -> None:
    # as an older worker with a broken clock stored
    with contextlib.closing(sqlite3.connect(ledger_file)) as raw, raw:
        raw.execute(f"UPDATE runs SET deadline_wall = {value} WHERE run_id = 'old'")
    code, out, err = cli("ledger", "--ledger", str(ledger_file), "runs")
    assert (code, err) == (0, "")
    assert "(not a time: " in out
    code, out, err = cli("ledger", "--ledger", str(ledger_file), "show", "old")
    assert (code, err) == (0, "")
    assert "deadline (not a time: " in out
    for command in (["runs", "--json"], ["show", "old", "--json"]):
        code, out, err = cli("ledger", "--ledger", str(ledger_file), *command)
        assert (code, err) == (0, "")
        document = json.loads(out, parse_constant=pytest.fail)  # strict JSON: no Infinity
        run = document["runs"][-1] if command[0] == "runs" else document["run"]
        assert run["deadline"] is None


@pytest.mark.parametrize("argv", [["demo", "--data-dir", ""], ["demo", "--data-dir", "  "]])
def test_an_empty_folder_argument_is_a_usage_error(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # an empty path would be the working folder
    code, out, err = cli(*argv)
    assert (code, out) == (2, "") and "must not be empty" in err + capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_folder_given_as_the_configuration_file_is_named_as_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli("config", "show", "--config", str(tmp_path))
    assert code != 0 and "is a folder, not a file" in err + capsys.readouterr().err
