"""``recallbound ledger runs|show|prune|check``: what the allowance did, and keeping it small.

Works on any ledger with a :class:`~plugin.control.ledger_admin.LedgerAdmin` (SQLite and
PostgreSQL). Each command prints a readable report, or JSON with ``--json``. The ledger is
``--ledger LOCATION`` or the configured ``ledger``: a SQLite file, or a ``postgresql://`` DSN
whose ``schema`` query parameter names the ledger's schema (default ``recallbound``). A missing
file or schema, a folder, or an empty file is an error, never a new empty ledger; a DSN's
password is never printed. Stored text is printed escaped (:func:`safe`): a run id cannot forge
a row or send an escape sequence to the terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import time
import unicodedata
from collections.abc import Callable, Coroutine, Iterator
from datetime import datetime, timezone
from typing import Any, TextIO

import anyio

from plugin.control import Clock, Ledger, validate
from plugin.control.ledger_admin import LedgerAdmin, LedgerCheck, RunSummary
from plugin.errors import LedgerCorruptError, RecallboundError

from .ledgers import admin_for, open_ledger, redact_location

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")


class UnknownRunError(RecallboundError, LookupError):
    """``ledger show`` was given a run id the ledger has no trace of."""


_UNSAFE = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"))
"""Unicode categories never printed as they are: controls (a newline, ESC), format characters
(bidi overrides), line and paragraph separators, surrogates, private use, unassigned."""


def _escape_char(char: str) -> str:
    code = ord(char)
    if char in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char]
    return f"\\x{code:02x}" if code < 0x100 else (
        f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


def safe(text: object) -> str:
    """``text`` for a terminal: every control, format or separator character escaped
    (``\\n``, ``\\x1b``, ``\\u202e``), so stored text can neither forge a line nor send an
    escape sequence."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(_escape_char(char) if unicodedata.category(char) in _UNSAFE else char
                   for char in value)


def safe_json(text: str) -> str:
    """JSON text with the characters :func:`safe` escapes written as ``\\uXXXX`` (outside
    strings there is only the indentation's newline; inside, JSON allows the escape)."""
    return "".join(
        char if char == "\n" or unicodedata.category(char) not in _UNSAFE
        else "".join(f"\\u{unit:04x}" for unit in _utf16(char)) for char in text)


def _utf16(char: str) -> list[int]:
    data = char.encode("utf-16-be", "surrogatepass")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


def parse_duration(text: str) -> float:
    """``"30d"`` -> seconds. Units: s, m, h, d, w; a non-negative number before them."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number and a unit, e.g. 30d, 12h, 90m, 45s, 2w")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds > time.time():
        raise argparse.ArgumentTypeError(
            f"invalid duration {text[:40]!r}: longer than the time since 1970")
    return seconds


MAX_LIMIT = 2**63 - 1
"""The largest ``--limit`` (what a 64-bit integer column compares with)."""


def _positive(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,19}", text) or not 1 <= int(text) <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer of at most {MAX_LIMIT}, got {text[:40]!r}")
    return int(text)


def _run_id(text: str) -> str:
    """A run id as typed: what the ledger could hold (never blank, valid Unicode, no NUL)."""
    try:
        return validate.run_id(text, field="RUN_ID")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_commands(commands: Any) -> None:
    """Register ``ledger`` and its subcommands on the top-level subparsers."""
    ledger = commands.add_parser(
        "ledger", help="inspect, prune and check the durable ledger",
        description="Inspect, prune and check the durable ledger (SQLite or PostgreSQL).",
        epilog="A PostgreSQL ledger is a DSN; its schema is the DSN's `schema` parameter "
               "(default recallbound), e.g. postgresql://user@db.internal/app?schema=fleet. "
               "The password is never printed; prefer PGPASSWORD or ~/.pgpass to putting it "
               "in the DSN.")
    ledger.add_argument("--ledger", metavar="LOCATION", default=None,
                        help="SQLite file, or postgresql:// DSN with an optional "
                             "?schema=NAME (default: the configured ledger)")
    ledger.add_argument("--config", metavar="FILE", default=None,
                        help="configuration file (default: $RECALLBOUND_CONFIG, then "
                             "recallbound.toml if present)")
    sub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="COMMAND")

    runs = sub.add_parser("runs", help="recent runs and their totals")
    runs.add_argument("--limit", type=_positive, default=20, help="most runs listed (20)")
    show = sub.add_parser("show", help="one run's timeline of rounds, attempts and refusals")
    show.add_argument("run_id", metavar="RUN_ID", type=_run_id)
    prune = sub.add_parser("prune", help="remove the traces of finished runs")
    prune.add_argument("--older-than", type=parse_duration, required=True, metavar="DURATION",
                       help="remove runs whose deadline passed at least this long ago (30d)")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed")
    sub.add_parser("check", help="verify integrity and the schema version")
    for parser in (runs, show, prune, sub.choices["check"]):
        parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace, out: TextIO, clock: Clock) -> int:
    """Run the parsed ``ledger`` command; return the exit status."""
    location = args.ledger
    if location is None:
        from .config import load_config

        location = load_config(args.config).values["ledger"]
        if location is None:
            raise RecallboundError(
                "no ledger given: pass --ledger LOCATION, or set `ledger` in recallbound.toml "
                "or RECALLBOUND_LEDGER")
    command: Callable[..., Coroutine[Any, Any, int]] = {
        "runs": _runs, "show": _show, "prune": _prune, "check": _check,
    }[args.ledger_command]
    async def main() -> int:
        async with open_ledger(location, must_exist=True) as ledger:
            return await command(args, ledger, admin_for(ledger), out, clock.wall(),
                                 redact_location(location))

    return anyio.run(main)


# -- formatting --------------------------------------------------------------------------------


def _moment(wall: float) -> datetime | None:
    """The UTC moment of a stored wall time; None when it is none (inf, nan, out of range)."""
    try:
        return datetime.fromtimestamp(wall, tz=timezone.utc)
    except (OverflowError, ValueError, OSError):
        return None


def _stamp(wall: float, *, ms: bool = False) -> str:
    moment = _moment(wall)
    if moment is None:
        return f"{f'(not a time: {wall!r})':<{23 if ms else 19}}"
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if ms else moment.strftime(
        "%Y-%m-%d %H:%M:%S")


def _iso(wall: float) -> str | None:
    moment = _moment(wall)
    return None if moment is None else moment.isoformat()


def _plain(value: object) -> object:
    """``value`` with every non-finite float as None: JSON has no Infinity or NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _summary_json(summary: RunSummary, now: float) -> dict[str, Any]:
    return {
        "run_id": summary.run_id, "status": summary.status(now).value,
        "rounds": summary.rounds, "max_rounds": summary.max_rounds,
        "reserved": summary.reserved, "max_searches": summary.max_searches,
        "executed": summary.executed, "refused": summary.refused,
        "opened_wall": summary.opened_wall, "opened": _iso(summary.opened_wall),
        "deadline_wall": summary.deadline_wall, "deadline": _iso(summary.deadline_wall),
    }


def _dump(out: TextIO, document: object) -> None:
    out.write(safe_json(json.dumps(_plain(document), indent=2, ensure_ascii=False,
                                   allow_nan=False)) + "\n")


# -- commands ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _known_values(what: str) -> Iterator[None]:
    """A stored value this version cannot read (the file damaged, a hand edit, a value a newer
    version wrote), read in the block, is one :class:`~plugin.errors.LedgerCorruptError` line
    naming ``what``, and the reason the driver gave."""
    try:
        yield
    except (ValueError, LedgerCorruptError) as exc:
        raise LedgerCorruptError(f"{what} holds data this version of recallbound cannot read "
                                 f"(a damaged file, a hand edit, or a value a newer version "
                                 f"wrote): {exc}") from None


async def _runs(args: argparse.Namespace, ledger: Ledger, admin: LedgerAdmin, out: TextIO,
                now: float, location: str) -> int:
    with _known_values(location):
        runs = await admin.runs(limit=args.limit)
    if args.json:
        _dump(out, {"ledger": location, "now": now,
                    "runs": [_summary_json(r, now) for r in runs]})
        return 0
    if not runs:
        out.write(f"no runs in {safe(location)}\n")
        return 0
    width = max(6, *(len(safe(r.run_id)) for r in runs))
    out.write(f"{'RUN':<{width}}  {'OPENED (UTC)':<19}  ROUNDS  RESERVED  EXECUTED  REFUSED  "
              f"{'DEADLINE (UTC)':<19}  STATUS\n")
    for r in runs:
        out.write(
            f"{safe(r.run_id):<{width}}  {_stamp(r.opened_wall)}  "
            f"{f'{r.rounds}/{r.max_rounds}':>6}  {f'{r.reserved}/{r.max_searches}':>8}  "
            f"{r.executed:>8}  {r.refused:>7}  {_stamp(r.deadline_wall)}  "
            f"{r.status(now).value}\n")
    return 0


async def _show(args: argparse.Namespace, ledger: Ledger, admin: LedgerAdmin, out: TextIO,
                now: float, location: str) -> int:
    run_id = args.run_id
    with _known_values(f"run {run_id!r} in {location}"):
        summary = await admin.run(run_id)
        rounds = await ledger.reservations(run_id)
        attempts = await ledger.attempts(run_id)
        refusals = await ledger.refusals(run_id)
    if summary is None and not attempts and not refusals:
        raise UnknownRunError(f"no run {run_id!r} in {location}")
    origin = summary.opened_wall if summary is not None else min(
        [a.started_wall for a in attempts] + [f.at_wall for f in refusals])
    events: list[dict[str, Any]] = []
    for r in rounds:
        events.append({
            "at_wall": r.reserved_wall, "event": "round", "round": r.round_index,
            "kind": r.kind.value, "requested": r.requested, "slots": r.slots,
            "first_slot": r.first_slot, "executed_before": r.executed})
    for a in attempts:
        events.append({
            "at_wall": a.started_wall, "event": "attempt", "round": a.round_index,
            "slot": a.slot, "kind": a.kind, "outcome": a.outcome.value,
            "elapsed_s": a.elapsed_s, "strategy": a.strategy, "fingerprint": a.fingerprint,
            "legacy": a.legacy, "dropped": a.dropped})
    for f in refusals:
        events.append({
            "at_wall": f.at_wall, "event": "refusal", "what": f.what, "round": f.round_index,
            "kind": f.kind, "reason": f.reason.value})
    order = {"round": 0, "attempt": 1, "refusal": 2}
    events.sort(key=lambda e: (e["at_wall"], order[e["event"]], e.get("slot") or 0))
    for event in events:
        event["offset_s"] = event["at_wall"] - origin
    # No run of its own: legacy attempts only, or a pruned run (its tombstone refuses rounds)
    pruned = summary is None and not any(a.legacy for a in attempts)
    if args.json:
        _dump(out, {"ledger": location, "now": now, "run_id": run_id,
                    "run": None if summary is None else _summary_json(summary, now),
                    "pruned": pruned, "timeline": events})
        return 0
    if pruned:
        out.write(f"run {safe(run_id)}: pruned (its records were removed; the run id stays "
                  f"spent: every round is refused)\n")
    elif summary is None:
        out.write(f"run {safe(run_id)}: legacy only (no reservation; not enforced)\n")
    else:
        out.write(
            f"run {safe(run_id)}: {summary.status(now).value}\n"
            f"  opened   {_stamp(summary.opened_wall, ms=True)} UTC\n"
            f"  deadline {_stamp(summary.deadline_wall, ms=True)} UTC "
            f"(+{summary.deadline_wall - summary.opened_wall:.3f}s)\n"
            f"  rounds {summary.rounds}/{summary.max_rounds}, reserved "
            f"{summary.reserved}/{summary.max_searches}, executed {summary.executed}, "
            f"refused {summary.refused}\n")
    since = "the first event" if summary is None else "the run opened"
    out.write(f"timeline (seconds since {since}):\n")
    for e in events:
        out.write(f"  {e['offset_s']:+10.3f}s  {safe(_describe(e))}\n")
    return 0


def _describe(e: dict[str, Any]) -> str:
    if e["event"] == "round":
        last = e["first_slot"] + e["slots"] - 1
        return (f"round {e['round']} {e['kind']}: requested {e['requested']}, "
                f"granted {e['slots']} (slots {e['first_slot']}-{last})")
    if e["event"] == "attempt":
        took = "still running" if e["elapsed_s"] is None else f"{e['elapsed_s']:.3f}s"
        extra = "".join([
            f" strategy={e['strategy']}" if e["strategy"] else "",
            f" query={e['fingerprint'][:12]}" if e["fingerprint"] else "",
            " legacy" if e["legacy"] else "",
            f" dropped={e['dropped']} (another principal's or scope's)" if e["dropped"] else ""])
        return (f"attempt slot {e['slot']} (round {e['round']}, {e['kind']}): "
                f"{e['outcome']} in {took}{extra}")
    where = "" if e["round"] is None else f" in round {e['round']}"
    return f"refused {e['what']} ({e['kind']}){where}: {e['reason']}"


async def _prune(args: argparse.Namespace, ledger: Ledger, admin: LedgerAdmin, out: TextIO,
                 now: float, location: str) -> int:
    before = now - args.older_than
    report = await admin.prune(before_wall=before, now_wall=now, dry_run=args.dry_run)
    if args.json:
        _dump(out, {"ledger": location, "dry_run": report.dry_run, "now": now,
                    "before_wall": report.before_wall, "before": _iso(report.before_wall),
                    "run_ids": list(report.run_ids), "rows": dict(report.rows)})
        return 0
    verb = "would remove" if report.dry_run else "removed"
    rows = ", ".join(f"{table} {count}" for table, count in report.rows.items())
    out.write(f"{verb} {len(report.run_ids)} finished run(s) whose deadline passed before "
              f"{_stamp(report.before_wall)} UTC ({rows})\n")
    shown = report.run_ids[:20]
    for run_id in shown:
        out.write(f"  {safe(run_id)}\n")
    if len(report.run_ids) > len(shown):
        out.write(f"  ... and {len(report.run_ids) - len(shown)} more (--json lists all)\n")
    return 0


_CHECKED = {
    "sqlite": ("storage integrity (PRAGMA integrity_check)", "the ledger's identity",
               "the schema version", "WAL mode",
               "the ledger's invariants (each run's rounds and slots add up and stay within "
               "its limits, no attempt holds a slot its run never reserved, no rows without "
               "a run)"),
    "postgresql": ("the schema's tables and identity", "the schema version",
                   "the ledger's invariants (each run's rounds and slots add up and stay "
                   "within its limits, no attempt holds a slot its run never reserved, no rows "
                   "without a run)"),
}


def _checked(result: LedgerCheck) -> list[str]:
    """What the check covered: as the check reports it, else what its backend checks."""
    reported = getattr(result, "checked", None)
    if reported:
        return [str(item) for item in reported]
    return list(_CHECKED.get(result.backend, ("the schema version",)))


async def _check(args: argparse.Namespace, ledger: Ledger, admin: LedgerAdmin, out: TextIO,
                 now: float, location: str) -> int:
    result = await admin.check()
    if args.json:
        _dump(out, {"ledger": location, "backend": result.backend, "ok": result.ok,
                    "checked": _checked(result), "schema_version": result.schema_version,
                    "expected_version": result.expected_version,
                    "problems": list(result.problems)})
    else:
        verdict = "ok" if result.ok else f"{len(result.problems)} problem(s)"
        out.write(f"{safe(location)} ({result.backend}): schema version "
                  f"{result.schema_version} (expected {result.expected_version}): {verdict}\n")
        out.write(f"  checked: {'; '.join(_checked(result))}\n")
        for problem in result.problems:
            out.write(f"  - {safe(problem)}\n")
    return 0 if result.ok else 1
