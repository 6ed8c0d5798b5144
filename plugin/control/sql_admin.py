"""The one :class:`~plugin.control.ledger_admin.LedgerAdmin` of the SQL ledgers.

It runs on the ledger's own statements and transactions (what
:class:`~plugin.control.sql_schema.SqlStorage` names of a ledger): a prune never interleaves
with a reservation of this process, and the database's locks keep other processes out while
it runs.

- **Prune** is one transaction that chooses the runs and removes every trace of them but a
  tombstone: the run's own ``runs`` row, marked ``pruned`` and spent (its rounds and slots
  all used). A later reservation of a pruned run id meets that row and is refused, whatever
  the worker's clock says (the times that kept a slow clock from reopening the run are pruned
  with it): a pruned run id never opens a fresh allowance. Its identity binding stays with its
  tombstone. A run is removed only once its deadline has passed by the operator's
  ``now_wall`` *and* by the ledger's own clock: the database server's clock for a PostgreSQL
  ledger judged by it, else the newest time the ledger itself recorded (a run opened, a round
  reserved, an attempt started, a refusal). A run that is live by the times its own workers
  wrote is therefore never removed, whatever the operator's clock says. On PostgreSQL the
  chosen ``runs`` rows are locked (``FOR UPDATE``) first: a worker reserving a round of one of
  them waits for the prune, then meets the tombstone.
- **Check** reads one consistent snapshot and reports, besides what only the database has
  (file integrity, schema identity and version), every broken invariant of the ledger itself:
  each run's rounds and slots add up; neither rounds nor slots exceed the run's limits; no
  run or round executed more attempts than it reserved slots; no slot is used twice in a
  run; every stored time is finite; no trace belongs to an unknown run.
"""

from __future__ import annotations

import attrs

from plugin.errors import InvalidArgumentError, LedgerCorruptError

from .ledger import CALL_STATUSES, PENDING
from .ledger_admin import PRUNED_TABLES, LedgerCheck, PruneReport, RunSummary, check_limit
from .sql_rows import call_record
from .sql_schema import EXECUTED, Session, SqlStorage

_SUMMARY = (
    "SELECT u.run_id, u.opened_wall, u.deadline_wall, u.rounds, u.max_rounds, u.reserved, "
    "u.max_searches, " + EXECUTED + ", "
    "(SELECT count(*) FROM {q}refusals f WHERE f.run_id = u.run_id) FROM {q}runs u "
    "WHERE u.pruned = false"
)

_CALL_ROWS = ("SELECT run_id, call_id, digest, status, slot, reason, evidence, more, reserved, "
              "executed FROM {q}calls ORDER BY run_id, call_id")

_PRUNABLE = (
    "SELECT run_id FROM {q}runs WHERE deadline_wall < :before AND deadline_wall <= :now "
    "AND pruned = false ORDER BY deadline_wall, run_id"
)

_FINITE = "BETWEEN -1e308 AND 1e308"
"""True of a finite stored time (false for an infinity or NaN, unknown for NULL)."""

TIMES = (
    ("runs", "opened_wall"), ("runs", "deadline_wall"), ("rounds", "reserved_wall"),
    ("attempts", "started_wall"), ("attempts", "elapsed_s"), ("refusals", "at_wall"),
)
"""Every stored time, as (table, column)."""

_NEWEST = "SELECT max(t) FROM (" + " UNION ALL ".join(
    f"SELECT max({column}) AS t FROM {{q}}{table} WHERE {column} {_FINITE}"
    for table, column in TIMES if column not in ("deadline_wall", "elapsed_s")
) + ") AS recorded"
"""The newest time the ledger recorded: the ledger's own clock when the database has none."""

CALL_INVARIANTS: tuple[tuple[str, str, str], ...] = (
    ("every recorded call outcome matches an executed or refused attempt",
     "run {0}: call {1} is recorded on slot {2}, which no executed attempt of the run holds",
     "SELECT c.run_id, c.call_id, c.slot FROM {q}calls c WHERE c.slot IS NOT NULL AND NOT "
     "EXISTS (SELECT 1 FROM {q}attempts a WHERE a.run_id = c.run_id AND a.slot = c.slot "
     "AND a.legacy = false)"),
    ("every recorded call outcome matches an executed or refused attempt",
     "run {0}: call {1} is recorded as {2} without a slot",
     "SELECT c.run_id, c.call_id, c.status FROM {q}calls c "
     f"WHERE c.slot IS NULL AND c.status NOT IN ('refused', '{PENDING}')"),
    ("every recorded call outcome matches an executed or refused attempt",
     "run {0}: call {1} is recorded as {2}, but the run has no refusal",
     "SELECT c.run_id, c.call_id, c.status FROM {q}calls c WHERE c.status = 'refused' "
     "AND c.slot IS NULL AND NOT EXISTS (SELECT 1 FROM {q}refusals f "
     "WHERE f.run_id = c.run_id)"),
    ("every recorded call outcome matches an executed or refused attempt",
     "run {0}: call {1} has the unknown status {2}",
     "SELECT run_id, call_id, status FROM {q}calls "
     f"WHERE status NOT IN ({', '.join(repr(status) for status in CALL_STATUSES)})"),
    ("no call record without a run",
     "run {0}: call {1} is recorded but the run is not",
     f"SELECT run_id, call_id FROM {{q}}calls WHERE status != '{PENDING}' AND run_id NOT IN "
     "(SELECT run_id FROM {q}runs)"),
)
"""What a check verifies of the recorded call outcomes. A claim (``pending``: searching, or
interrupted before its outcome was written) has no slot, and may come before its run's first
round (its process died between the two). A call sent to a pruned run is recorded against
its tombstone (its refusal)."""

INVARIANTS: tuple[tuple[str, str, str], ...] = (
    ("each run's rounds add up to its round count",
     "run {0}: {1} rounds recorded but the run counts {2}",
     "SELECT u.run_id, (SELECT count(*) FROM {q}rounds r WHERE r.run_id = u.run_id), u.rounds "
     "FROM {q}runs u WHERE u.pruned = false "
     "AND u.rounds != (SELECT count(*) FROM {q}rounds r WHERE r.run_id = u.run_id)"),
    ("each run's rounds' slots add up to its reserved count",
     "run {0}: its rounds granted {1} slots but the run counts {2} reserved",
     "SELECT run_id, granted, reserved FROM (SELECT u.run_id, u.reserved, "
     "(SELECT CAST(coalesce(sum(slots), 0) AS bigint) FROM {q}rounds r "
     "WHERE r.run_id = u.run_id) AS granted FROM {q}runs u WHERE u.pruned = false) AS g "
     "WHERE granted != reserved"),
    ("no run reserved more slots than its limit",
     "run {0}: {1} slots reserved, over its limit of {2}",
     "SELECT run_id, reserved, max_searches FROM {q}runs WHERE reserved > max_searches"),
    ("no run had more rounds than its limit",
     "run {0}: {1} rounds, over its limit of {2}",
     "SELECT run_id, rounds, max_rounds FROM {q}runs WHERE rounds > max_rounds"),
    ("no run executed more attempts than it reserved slots",
     "run {0}: {1} attempts executed, over its {2} reserved slots",
     "SELECT u.run_id, " + EXECUTED + ", u.reserved FROM {q}runs u "
     "WHERE " + EXECUTED + " > u.reserved"),
    ("no round executed more attempts than its slots",
     "run {0}: round {1} executed {2} attempts, over its {3} slots",
     "SELECT r.run_id, r.round_index, count(*), r.slots FROM {q}rounds r "
     "JOIN {q}attempts a ON a.run_id = r.run_id AND a.round_index = r.round_index "
     "WHERE a.legacy = false GROUP BY r.run_id, r.round_index, r.slots "
     "HAVING count(*) > r.slots"),
    ("no slot used twice in a run",
     "run {0}: slot {1} used by {2} attempts",
     "SELECT run_id, slot, count(*) FROM {q}attempts WHERE legacy = false "
     "GROUP BY run_id, slot HAVING count(*) > 1"),
    ("every attempt holds a slot its run reserved",
     "run {0}: attempt {1} holds slot {2}, which the run never reserved",
     "SELECT a.run_id, a.attempt_id, a.slot FROM {q}attempts a "
     "LEFT JOIN {q}runs u ON u.run_id = a.run_id "
     "WHERE a.legacy = false AND (u.run_id IS NULL OR a.slot < 1 OR a.slot > u.reserved)"),
    *(
        ("every stored time is finite", "run {0}: {1} is {2}, not a finite time",
         f"SELECT run_id, '{table}.{column}', {column} FROM {{q}}{table} "
         f"WHERE NOT ({column} {_FINITE})")
        for table, column in TIMES
    ),
    ("no round rows without a run",
     "run {0}: {1} round rows but no run",
     "SELECT run_id, count(*) FROM {q}rounds "
     "WHERE run_id NOT IN (SELECT run_id FROM {q}runs) GROUP BY run_id"),
    ("no retained evidence without a run",
     "run {0}: {1} retained evidence rows but no run",
     "SELECT run_id, count(*) FROM {q}retained "
     "WHERE run_id NOT IN (SELECT run_id FROM {q}runs) GROUP BY run_id"),
    ("no validation count without a run",
     "run {0}: a validation count ({1}) but no run",
     "SELECT run_id, used FROM {q}validations "
     "WHERE run_id NOT IN (SELECT run_id FROM {q}runs)"),
    *CALL_INVARIANTS,
)
"""Each invariant of a ledger: what it says, a message template for a row that breaks it,
and the query of those rows."""


_INVARIANTS_CHECKED = "the ledger's invariants ({})".format(
    ", ".join(dict.fromkeys(what for what, _, _ in INVARIANTS)))
"""What a check says it verified of the ledger itself (one item, the invariants listed)."""


@attrs.define(eq=False)
class SqlAdmin:
    """Admin queries over an opened :class:`~plugin.control.sql_ledger.SqlLedger`."""

    ledger: SqlStorage

    async def runs(self, *, limit: int) -> list[RunSummary]:
        check_limit(limit)
        order = " ORDER BY u.opened_wall DESC, u.run_id" + self.ledger._dialect.binary_order
        rows = await self.ledger._read(_SUMMARY + order + " LIMIT :limit", {"limit": limit},
                                       "listing runs")
        return [RunSummary.from_row(row) for row in rows]

    async def run(self, run_id: str) -> RunSummary | None:
        if not isinstance(run_id, str):
            raise InvalidArgumentError(f"run_id must be a str, got {type(run_id).__name__}")
        rows = await self.ledger._read(_SUMMARY + " AND u.run_id = :run_id",
                                       {"run_id": run_id}, f"reading run {run_id!r}")
        return RunSummary.from_row(rows[0]) if rows else None

    async def _ledger_now(self, s: Session) -> float:
        """The ledger's own clock (see the module): the database's, else its newest record."""
        clock = self.ledger._dialect.clock
        ((now,),) = await s.fetchall(
            self.ledger._sql(_NEWEST if clock is None else f"SELECT {clock}"), {})
        return -float("inf") if now is None else float(now)

    async def prune(self, *, before_wall: float, now_wall: float, dry_run: bool) -> PruneReport:
        before, now = float(before_wall), float(now_wall)
        dialect, sql = self.ledger._dialect, self.ledger._sql

        async def write(s: Session) -> tuple[tuple[str, ...], dict[str, int]]:
            params = {"before": before, "now": min(now, await self._ledger_now(s))}
            chosen = _PRUNABLE + dialect.binary_order + ("" if dry_run else dialect.for_update)
            run_ids = tuple(row[0] for row in await s.fetchall(sql(chosen), params))
            ids = {"ids": dialect.ids(run_ids)}
            rows: dict[str, int] = {}
            rows["runs"] = len(run_ids)
            if run_ids and not dry_run:  # each run's row stays, as its spent tombstone
                await s.fetchall(sql(
                    "UPDATE {q}runs SET pruned = true, rounds = max_rounds, "
                    f"reserved = max_searches WHERE run_id {dialect.in_ids('ids')}"), ids)
            for table in PRUNED_TABLES[1:]:  # and what was sent to a pruned run since
                where = (f"FROM {{q}}{table} WHERE run_id {dialect.in_ids('ids')} OR run_id IN "
                         f"(SELECT run_id FROM {{q}}runs WHERE pruned = true)")
                ((rows[table],),) = await s.fetchall(sql(f"SELECT count(*) {where}"), ids)
                if not dry_run and rows[table]:
                    await s.fetchall(sql(f"DELETE {where}"), ids)
            return run_ids, rows

        verb = "counting" if dry_run else "pruning"
        run_ids, rows = await self.ledger._transact(write, f"{verb} finished runs",
                                                    read_only=dry_run)
        return PruneReport(before_wall=before, now_wall=now, dry_run=dry_run, run_ids=run_ids,
                           rows=rows)

    async def check(self) -> LedgerCheck:
        problems: list[str] = []

        async def inspect(s: Session) -> int:
            version, readable = await self.ledger._inspect_storage(s, problems)
            if readable:
                for _, template, query in INVARIANTS:
                    for row in await s.fetchall(self.ledger._sql(query + " ORDER BY 1, 2"), {}):
                        problems.append(template.format(*row))
                for run_id, *call in await s.fetchall(self.ledger._sql(_CALL_ROWS), {}):
                    try:  # read back as a replay reads it
                        call_record(str(run_id), tuple(call))
                    except (ValueError, TypeError) as exc:
                        problems.append(f"run {run_id!r}: call {call[0]!r} is damaged: {exc}")
            return version

        try:
            version = await self.ledger._transact(inspect, "checking the ledger", read_only=True)
        except LedgerCorruptError as exc:  # damaged pages, or a table or column gone
            problems.append(f"unreadable: {exc}")
            version = -1
        return LedgerCheck(
            backend=self.ledger.backend, location=self.ledger.location,
            schema_version=version, expected_version=self.ledger.schema_version,
            problems=tuple(problems),
            checked=(*self.ledger.storage_checks, "the schema version",
                     "every call's recorded outcome", _INVARIANTS_CHECKED),
        )
