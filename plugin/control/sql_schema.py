"""The SQL both durable ledgers share, below the ledger itself: the dialect and the tables.

A :class:`Dialect` holds what differs between the SQL of two databases and nothing else; every
statement is written once, with named ``:name`` parameters and ``{q}`` before each table name,
and the dialect turns it into what the driver expects. :data:`TABLES` is the schema, written
once for every database (:func:`create_table`). :class:`SqlStorage` is what the admin
(:mod:`plugin.control.sql_admin`) needs of a ledger, so that it never imports the ledger.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeAlias, TypeVar

import attrs

from .ledger import WallTime
from .policy import AllowancePolicy, RoundKind

T = TypeVar("T")
Row: TypeAlias = "tuple[Any, ...]"
Rows: TypeAlias = "list[tuple[str, Sequence[Mapping[str, Any]]]]"
"""Statements to run once per row of theirs, in one transaction."""

_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


class Session(Protocol):
    """A connection held for one read or one transaction."""

    async def fetchall(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        """Execute one statement and return its rows (none for a statement without rows)."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Execute one statement once per parameter set."""
        ...


@functools.lru_cache(maxsize=512)
def _render(template: str, prefix: str, pyformat: bool) -> str:
    sql = template.replace("{q}", prefix)
    return _NAMED.sub(r"%(\1)s", sql) if pyformat else sql


@attrs.frozen(kw_only=True)
class Dialect:
    """What differs between the SQL of two databases, and nothing else."""

    name: Literal["sqlite", "postgresql"]
    prefix: str = ""
    """Put before every table name: ``""`` or a quoted schema and a dot."""
    pyformat: bool = False
    """Parameters as ``%(name)s`` (psycopg) instead of ``:name`` (sqlite3)."""
    id_list: str = "IN (SELECT value FROM json_each(:{name}))"
    """Membership in a list parameter called ``name``."""
    lock_run: str | None = None
    """A statement taking the per-run lock on ``:run_id`` for the transaction, if the database
    has one (SQLite's write lock already covers the whole file)."""
    for_update: str = ""
    """Appended to a ``SELECT`` of ``runs`` rows to lock them for the transaction."""
    id_rows: str = "json_each(:{name}) AS j"
    """The list parameter ``name`` as a table ``j`` of ``(value, key)``, ``key`` its order."""
    greatest: str = "max"
    """The larger-of-several function."""
    binary_order: str = ""
    """Appended to an ``ORDER BY`` of run ids so that they sort byte-wise."""
    clock: str | None = None
    """An SQL expression of the database's own clock (epoch seconds), when it judges by it."""

    def sql(self, template: str) -> str:
        """``template`` for this database: ``{q}`` and ``:name`` placeholders rendered."""
        return _render(template, self.prefix, self.pyformat)

    def in_ids(self, name: str) -> str:
        """``IN``-list membership in the list parameter ``name`` (see :meth:`ids`)."""
        return self.id_list.format(name=name)

    def ids(self, values: Sequence[str]) -> Any:
        """The parameter value of an id list."""
        return list(values) if self.pyformat else json.dumps(list(values))


@attrs.frozen
class ReserveRequest:
    """One call of ``reserve``, waiting for its batch."""

    run_id: str
    kind: RoundKind
    requested: int
    policy: AllowancePolicy
    now: WallTime
    floor: WallTime


CALLS_SINCE = 7
"""The PostgreSQL schema version that added call records and tombstones (SQLite's is 6)."""


@attrs.frozen
class Table:
    """One table of a ledger, written once for every database (see :func:`create_table`)."""

    name: str
    columns: tuple[str, ...]
    """Column and constraint definitions; ``{text}``, ``{real}``, ``{int}``, ``{bool}`` and
    ``{serial}`` (an auto-numbered primary key) stand for the database's types."""
    since: int
    """The schema version that added it."""
    indexes: tuple[tuple[str, str], ...] = ()
    """(name, column list) of its indexes."""


SPEND_TOMBSTONES = (
    "UPDATE {q}runs SET rounds = max_rounds, reserved = max_searches "
    "WHERE pruned AND (rounds < max_rounds OR reserved < max_searches)")
"""Spends the tombstones an older release wrote only marked ``pruned`` (a prune now spends its
run's rounds and slots too), so a clock behind the run's deadline cannot reopen such a run."""


TABLES = (
    Table("runs", (
        "run_id {text} PRIMARY KEY", "opened_wall {real} NOT NULL",
        "deadline_wall {real} NOT NULL", "max_searches {int} NOT NULL",
        "max_rounds {int} NOT NULL", "rounds {int} NOT NULL", "reserved {int} NOT NULL",
        "last_grant {int} NOT NULL", "pruned {bool} NOT NULL DEFAULT false"), since=1),
    Table("rounds", (
        "run_id {text} NOT NULL", "round_index {int} NOT NULL", "kind {text} NOT NULL",
        "requested {int} NOT NULL", "first_slot {int} NOT NULL", "slots {int} NOT NULL",
        "executed {int} NOT NULL", "reserved_wall {real} NOT NULL",
        "PRIMARY KEY (run_id, round_index)"), since=1),
    Table("attempts", (
        "attempt_id {text} PRIMARY KEY", "run_id {text} NOT NULL",
        "round_index {int} NOT NULL", "slot {int} NOT NULL", "kind {text} NOT NULL",
        "strategy {text}", "fingerprint {text}", "outcome {text} NOT NULL",
        "started_wall {real} NOT NULL", "elapsed_s {real}", "legacy {bool} NOT NULL",
        "dropped {int} NOT NULL DEFAULT 0"),
        since=1, indexes=(("attempts_by_run", "run_id, legacy"),)),
    Table("refusals", (
        "id {serial}", "run_id {text} NOT NULL", "round_index {int}", "what {text} NOT NULL",
        "kind {text} NOT NULL", "reason {text} NOT NULL", "at_wall {real} NOT NULL",
        "refusal_key {text}"),
        since=1, indexes=(("refusals_by_run", "run_id"),)),
    Table("retained", (
        "run_id {text} NOT NULL", "evidence_id {text} NOT NULL",
        "PRIMARY KEY (run_id, evidence_id)"), since=2),
    Table("validations", ("run_id {text} PRIMARY KEY", "used {int} NOT NULL"), since=2),
    Table("run_identity", (
        "run_id {text} PRIMARY KEY", "principal {text} NOT NULL", "scope {text} NOT NULL"),
        since=3),
    Table("run_opens", (
        "principal {text} NOT NULL", "scope {text} NOT NULL", "run_id {text} NOT NULL",
        "opened_wall {real} NOT NULL", "PRIMARY KEY (principal, scope, run_id)"),
        since=6),
    Table("calls", (
        "run_id {text} NOT NULL", "call_id {text} NOT NULL", "digest {text} NOT NULL",
        "status {text} NOT NULL", "slot {int}", "reason {text}", "evidence {text} NOT NULL",
        "more {int} NOT NULL", "reserved {int} NOT NULL", "executed {int} NOT NULL",
        "PRIMARY KEY (run_id, call_id, digest)"), since=CALLS_SINCE),
)
"""Every table of a ledger, the same on every database (``since``: PostgreSQL's version). A
run's ``pruned`` flag marks its ``runs`` row as the tombstone a prune leaves (see
:mod:`plugin.control.sql_admin`); a refusal's key, added later, is unique
(:data:`REFUSAL_KEYS`)."""

REFUSAL_KEYS = (
    "CREATE UNIQUE INDEX IF NOT EXISTS refusals_by_key ON {q}refusals (refusal_key)")
"""The index that keeps an attempt's refusal written twice one row (keys of rounds' refusals
are null; nulls never conflict)."""


def create_table(table: Table, types: Mapping[str, str], *, prefix: str = "",
                 if_not_exists: bool = False, suffix: str = "") -> list[str]:
    """The statements creating ``table`` (and its indexes) with the database's ``types``."""
    exists = " IF NOT EXISTS" if if_not_exists else ""
    columns = ",\n    ".join(column.format(**types) for column in table.columns)
    return [
        f"CREATE TABLE{exists} {prefix}{table.name} (\n    {columns}){suffix}",
        *(f"CREATE INDEX{exists} {name} ON {prefix}{table.name} ({keys})"
          for name, keys in table.indexes),
    ]


EXECUTED = "(SELECT count(*) FROM {q}attempts a WHERE a.run_id = u.run_id AND a.legacy = false)"
"""A run's executed attempts (legacy ones excluded), for a row ``u`` of ``runs``."""



class SqlStorage(Protocol):
    """What the SQL admin needs of a ledger (:class:`~plugin.control.sql_ledger.SqlLedger`)."""

    _dialect: Dialect
    schema_version: int
    backend: str
    storage_checks: tuple[str, ...]

    @property
    def location(self) -> str: ...

    def _sql(self, template: str) -> str: ...

    async def _read(self, template: str, params: Mapping[str, Any], where: str) -> list[Row]: ...

    async def _transact(
        self, fn: Callable[[Session], Awaitable[T]], where: str, *, read_only: bool = False
    ) -> T: ...

    async def _inspect_storage(
        self, session: Session, problems: list[str]
    ) -> tuple[int, bool]: ...
