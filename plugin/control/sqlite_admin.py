"""The :class:`~plugin.control.ledger_admin.LedgerAdmin` of :class:`SqliteLedger`.

It runs on the ledger's own connection and transaction helpers (one lock, one shielded
``BEGIN IMMEDIATE``), so a prune never interleaves with a reservation of this process, and the
write lock keeps other processes out while it runs.
"""

from __future__ import annotations

import sqlite3

import attrs

from plugin.errors import InvalidRunIdError, LedgerError

from . import _sqlite
from .ledger_admin import PRUNED_TABLES, LedgerCheck, PruneReport, RunSummary, check_limit
from .sqlite_ledger import APPLICATION_ID, SCHEMA_VERSION, SqliteLedger

_SUMMARY = """
SELECT run_id, opened_wall, deadline_wall, rounds, max_rounds, reserved, max_searches,
       (SELECT count(*) FROM attempts a WHERE a.run_id = runs.run_id AND a.legacy = 0),
       (SELECT count(*) FROM refusals f WHERE f.run_id = runs.run_id)
FROM runs
"""

_PRUNABLE = "SELECT run_id FROM runs WHERE deadline_wall < :before AND deadline_wall <= :now"

_INVARIANTS = (
    ("run {0}: {1} rounds recorded but the run counts {2}",
     "SELECT u.run_id, (SELECT count(*) FROM rounds r WHERE r.run_id = u.run_id), u.rounds "
     "FROM runs u "
     "WHERE u.rounds != (SELECT count(*) FROM rounds r WHERE r.run_id = u.run_id)"),
    ("run {0}: its rounds granted {1} slots but the run counts {2} reserved",
     "SELECT run_id, granted, reserved FROM (SELECT u.run_id, u.reserved, "
     "(SELECT coalesce(sum(slots), 0) FROM rounds r WHERE r.run_id = u.run_id) AS granted "
     "FROM runs u) WHERE granted != reserved"),
    ("run {0}: {1} slots reserved, over its limit of {2}",
     "SELECT run_id, reserved, max_searches FROM runs WHERE reserved > max_searches"),
    ("run {0}: {1} rounds, over its limit of {2}",
     "SELECT run_id, rounds, max_rounds FROM runs WHERE rounds > max_rounds"),
    ("run {0}: attempt {1} holds slot {2}, which the run never reserved",
     "SELECT a.run_id, a.attempt_id, a.slot FROM attempts a LEFT JOIN runs u USING (run_id) "
     "WHERE a.legacy = 0 AND (u.run_id IS NULL OR a.slot < 1 OR a.slot > u.reserved)"),
    ("run {0}: {1} round rows but no run",
     "SELECT run_id, count(*), 0 FROM rounds WHERE run_id NOT IN (SELECT run_id FROM runs) "
     "GROUP BY run_id"),
    ("run {0}: {1} retained evidence rows but no run",
     "SELECT run_id, count(*), 0 FROM retained WHERE run_id NOT IN (SELECT run_id FROM runs) "
     "GROUP BY run_id"),
    ("run {0}: a validation count ({1}) but no run",
     "SELECT run_id, used, 0 FROM validations WHERE run_id NOT IN (SELECT run_id FROM runs)"),
)
"""Each invariant: a message template and a query returning (run, a, b) rows that break it."""


@attrs.define(eq=False)
class SqliteAdmin:
    """Admin queries over an opened :class:`SqliteLedger`."""

    ledger: SqliteLedger

    async def runs(self, *, limit: int) -> list[RunSummary]:
        check_limit(limit)
        rows = await self.ledger._read(lambda conn: conn.fetchall(
            _SUMMARY + " ORDER BY opened_wall DESC, run_id LIMIT ?", (limit,)))
        return [RunSummary.from_row(row) for row in rows]

    async def run(self, run_id: str) -> RunSummary | None:
        if not isinstance(run_id, str):
            raise InvalidRunIdError(f"run_id must be a str, got {type(run_id).__name__}")
        rows = await self.ledger._read(
            lambda conn: conn.fetchall(_SUMMARY + " WHERE run_id = ?", (run_id,)))
        return RunSummary.from_row(rows[0]) if rows else None

    async def prune(self, *, before_wall: float, now_wall: float, dry_run: bool) -> PruneReport:
        params = {"before": float(before_wall), "now": float(now_wall)}
        async with self.ledger._write() as conn:
            # Chosen and removed under one write lock: no round can be reserved in between.
            run_ids = tuple(row[0] for row in await conn.fetchall(
                _PRUNABLE + " ORDER BY deadline_wall, run_id", params))
            rows: dict[str, int] = {}
            # `runs` last: the other deletions select their rows through it.
            for table in sorted(PRUNED_TABLES, key=lambda name: name == "runs"):
                where = f"FROM {table} WHERE run_id IN ({_PRUNABLE})"
                (rows[table],) = (await conn.fetchall(f"SELECT count(*) {where}", params))[0]
                if not dry_run:
                    await conn.fetchall(f"DELETE {where}", params)
        return PruneReport(before_wall=params["before"], now_wall=params["now"],
                           dry_run=dry_run, run_ids=run_ids,
                           rows={table: rows[table] for table in PRUNED_TABLES})

    async def check(self) -> LedgerCheck:
        problems: list[str] = []

        async def inspect(conn: _sqlite.Connection) -> int:
            app_id, version = (await conn.fetchall(
                "SELECT (SELECT application_id FROM pragma_application_id()), "
                "(SELECT user_version FROM pragma_user_version())"))[0]
            if app_id != APPLICATION_ID:
                problems.append(f"application id {app_id:#x} is not a recallbound ledger's")
            for (verdict,) in await conn.fetchall("PRAGMA integrity_check"):
                if verdict != "ok":
                    problems.append(f"integrity: {verdict}")
            (mode,) = (await conn.fetchall("PRAGMA journal_mode"))[0]
            if str(mode).lower() not in ("wal", "memory"):
                problems.append(f"journal mode is {mode!r}, not WAL")
            for template, sql in _INVARIANTS:
                for row in await conn.fetchall(sql):
                    problems.append(template.format(*row))
            return int(version)

        try:
            version = await self.ledger._read(inspect)
        except LedgerError as exc:
            if isinstance(exc.__cause__, sqlite3.DatabaseError):
                problems.append(f"unreadable: {exc.__cause__}")
                version = -1
            else:
                raise
        return LedgerCheck(
            backend="sqlite", location=self.ledger.path, schema_version=version,
            expected_version=SCHEMA_VERSION, problems=tuple(problems),
        )
