"""The :class:`~plugin.control.ledger_admin.LedgerAdmin` of :class:`PostgresLedger`.

The semantics are :class:`~plugin.control.sqlite_admin.SqliteAdmin`'s (the admin contract suite
runs both); what differs is how PostgreSQL keeps a prune apart from the fleet's reservations:

- A prune is one transaction. It first locks the ``runs`` rows of the runs it chose
  (``SELECT … FOR UPDATE``): a worker reserving a round of one of them waits for the prune on
  that row, then (the row gone) opens the run afresh, as after any prune. A run's traces are
  then deleted by the chosen ids, table by table, in :data:`PRUNED_TABLES` order.
- A ledger judged by the server's clock (``time_source="server"``) has a clock of its own: a
  run is pruned only once its deadline has passed by that clock too, so an operator whose
  clock runs ahead of the server's cannot remove a run a worker may still reserve in.
- A dry run and a check each read one consistent snapshot (``REPEATABLE READ, READ ONLY``).

The ledger runs every statement (its pool, its shielded transactions, its typed errors): this
module needs no driver of its own.
"""

from __future__ import annotations

import attrs

from plugin.errors import InvalidRunIdError, LedgerCorruptError

from . import _postgres
from .ledger_admin import PRUNED_TABLES, LedgerCheck, PruneReport, RunSummary, check_limit
from .postgres_ledger import APPLICATION, SCHEMA_VERSION, PostgresLedger

# Run ids are ordered byte-wise (COLLATE "C"), as SQLite orders them, whatever the database's
# collation.
_SUMMARY = """
SELECT u.run_id, u.opened_wall, u.deadline_wall, u.rounds, u.max_rounds, u.reserved,
       u.max_searches,
       (SELECT count(*) FROM {s}.attempts a WHERE a.run_id = u.run_id AND NOT a.legacy),
       (SELECT count(*) FROM {s}.refusals f WHERE f.run_id = u.run_id)
FROM {s}.runs u
"""

_SERVER_NOW = "SELECT extract(epoch FROM clock_timestamp())::float8"

_PRUNABLE = """
SELECT run_id FROM {s}.runs WHERE deadline_wall < %(before)s AND deadline_wall <= %(now)s
ORDER BY deadline_wall, run_id COLLATE "C"
"""

_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

_INVARIANTS = (
    ("run {0}: {1} rounds recorded but the run counts {2}",
     "SELECT u.run_id, (SELECT count(*) FROM {s}.rounds r WHERE r.run_id = u.run_id), u.rounds "
     "FROM {s}.runs u "
     "WHERE u.rounds != (SELECT count(*) FROM {s}.rounds r WHERE r.run_id = u.run_id)"),
    ("run {0}: its rounds granted {1} slots but the run counts {2} reserved",
     "SELECT run_id, granted, reserved FROM (SELECT u.run_id, u.reserved, "
     "(SELECT coalesce(sum(slots), 0)::bigint FROM {s}.rounds r WHERE r.run_id = u.run_id) "
     "AS granted FROM {s}.runs u) AS g WHERE granted != reserved"),
    ("run {0}: {1} slots reserved, over its limit of {2}",
     "SELECT run_id, reserved, max_searches FROM {s}.runs WHERE reserved > max_searches"),
    ("run {0}: {1} rounds, over its limit of {2}",
     "SELECT run_id, rounds, max_rounds FROM {s}.runs WHERE rounds > max_rounds"),
    ("run {0}: attempt {1} holds slot {2}, which the run never reserved",
     "SELECT a.run_id, a.attempt_id, a.slot FROM {s}.attempts a "
     "LEFT JOIN {s}.runs u ON u.run_id = a.run_id "
     "WHERE NOT a.legacy AND (u.run_id IS NULL OR a.slot < 1 OR a.slot > u.reserved)"),
    ("run {0}: {1} round rows but no run",
     "SELECT run_id, count(*), 0 FROM {s}.rounds "
     "WHERE run_id NOT IN (SELECT run_id FROM {s}.runs) GROUP BY run_id"),
    ("run {0}: {1} retained evidence rows but no run",
     "SELECT run_id, count(*), 0 FROM {s}.retained "
     "WHERE run_id NOT IN (SELECT run_id FROM {s}.runs) GROUP BY run_id"),
    ("run {0}: a validation count ({1}) but no run",
     "SELECT run_id, used, 0 FROM {s}.validations "
     "WHERE run_id NOT IN (SELECT run_id FROM {s}.runs)"),
)
"""Each invariant (SQLite's, in PostgreSQL): a message and a query of (run, a, b) rows."""

_TABLES = ("recallbound_meta", *PRUNED_TABLES)
"""Every table of a ledger schema."""


@attrs.define(eq=False)
class PostgresAdmin:
    """Admin queries over an opened :class:`PostgresLedger` (``ledger.admin()``)."""

    ledger: PostgresLedger

    def _sql(self, template: str) -> str:
        return template.format(s=self.ledger._q)

    async def runs(self, *, limit: int) -> list[RunSummary]:
        check_limit(limit)
        rows = await self.ledger._read(
            self._sql(_SUMMARY) + ' ORDER BY u.opened_wall DESC, u.run_id COLLATE "C" '
            "LIMIT %(limit)s", {"limit": limit}, "listing runs")
        return [RunSummary.from_row(row) for row in rows]

    async def run(self, run_id: str) -> RunSummary | None:
        if not isinstance(run_id, str):
            raise InvalidRunIdError(f"run_id must be a str, got {type(run_id).__name__}")
        rows = await self.ledger._read(
            self._sql(_SUMMARY) + " WHERE u.run_id = %(r)s", {"r": run_id},
            f"reading run {run_id!r}")
        return RunSummary.from_row(rows[0]) if rows else None

    async def prune(self, *, before_wall: float, now_wall: float, dry_run: bool) -> PruneReport:
        before, now = float(before_wall), float(now_wall)
        server_clock = self.ledger.time_source == "server"

        async def write(s: _postgres.Session) -> tuple[tuple[str, ...], dict[str, int]]:
            if dry_run:
                await s.fetchall(_SNAPSHOT)
            judged = now
            if server_clock:
                ((server_now,),) = await s.fetchall(_SERVER_NOW)
                judged = min(now, float(server_now))
            lock = "" if dry_run else " FOR UPDATE"
            run_ids = tuple(row[0] for row in await s.fetchall(
                self._sql(_PRUNABLE) + lock, {"before": before, "now": judged}))
            rows: dict[str, int] = {}
            for table in PRUNED_TABLES:
                where = f"FROM {self.ledger._q}.{table} WHERE run_id = ANY(%(ids)s)"
                sql = (f"SELECT count(*) {where}" if dry_run else
                       f"WITH gone AS (DELETE {where} RETURNING 1) SELECT count(*) FROM gone")
                ((rows[table],),) = await s.fetchall(sql, {"ids": list(run_ids)})
            return run_ids, rows

        verb = "counting" if dry_run else "pruning"
        run_ids, rows = await self.ledger._write(write, f"{verb} finished runs")
        return PruneReport(before_wall=before, now_wall=now, dry_run=dry_run, run_ids=run_ids,
                           rows=rows)

    async def check(self) -> LedgerCheck:
        problems: list[str] = []
        found = {"version": -1}

        async def inspect(s: _postgres.Session) -> None:
            await s.fetchall(_SNAPSHOT)
            q = self.ledger._q
            ((*present,),) = await s.fetchall(
                "SELECT " + ", ".join(f"to_regclass('{q}.{t}') IS NOT NULL" for t in _TABLES))
            missing = [table for table, there in zip(_TABLES, present, strict=True) if not there]
            if missing:
                problems.append(f"missing table(s): {', '.join(missing)}")
            if "recallbound_meta" not in missing:
                meta = await s.fetchall(f"SELECT application, version FROM {q}.recallbound_meta")
                if len(meta) != 1:
                    problems.append(f"the schema's meta table holds {len(meta)} rows, not 1")
                else:
                    ((application, version),) = meta
                    found["version"] = int(version)
                    if application != APPLICATION:
                        problems.append(f"application {application!r} is not a recallbound "
                                        "ledger's")
            if missing:
                return  # the invariants read every table
            for template, sql in _INVARIANTS:
                for row in await s.fetchall(self._sql(sql) + " ORDER BY 1, 2"):
                    problems.append(template.format(*row))

        try:
            await self.ledger._write(inspect, "checking the ledger")
        except LedgerCorruptError as exc:  # a table or column gone mid-read
            problems.append(f"unreadable: {exc}")
        return LedgerCheck(
            backend="postgresql", location=self.ledger.location,
            schema_version=found["version"], expected_version=SCHEMA_VERSION,
            problems=tuple(problems),
        )
