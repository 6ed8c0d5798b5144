"""Operating a ledger: list its runs, prune finished ones, check it. The admin protocol.

:class:`~plugin.control.ledger.Ledger` is what the allowance needs; :class:`LedgerAdmin` is what
an operator needs beside it (``recallbound ledger …``). A run's timeline (``ledger show``) needs
nothing new: it is read through the ``Ledger`` protocol (reservations, attempts, refusals).
Every ledger offers its admin as ``ledger.admin()`` (the SQL ledgers share one,
:class:`~plugin.control.sql_admin.SqlAdmin`), which passes
``tests/test_ledger_admin_contract.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from plugin.errors import InvalidArgumentError, LedgerCorruptError

PRUNED_TABLES = ("runs", "rounds", "attempts", "refusals", "retained", "validations", "calls")
"""What a run leaves in a ledger, by the name a :class:`PruneReport` counts it under. A pruned
run's ``runs`` row stays as its tombstone (counted under ``runs``): a pruned run id never opens
a fresh allowance."""


class RunStatus(enum.Enum):
    """Where a run stands at a given time."""

    OPEN = "open"
    """Its deadline has not passed and it may still reserve a round."""
    EXHAUSTED = "exhausted"
    """Its deadline has not passed, but it has no round or no slot left."""
    FINISHED = "finished"
    """Its deadline has passed: nothing more can be reserved; it may be pruned."""


def check_limit(limit: object) -> int:
    """A ``runs(limit=)`` argument: a positive int (``InvalidArgumentError`` otherwise)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgumentError(f"limit must be a positive int, got {limit!r}")
    return limit


@attrs.frozen(kw_only=True)
class RunSummary:
    """One run's totals and limits as the ledger holds them."""

    run_id: str
    opened_wall: float
    deadline_wall: float
    rounds: int
    max_rounds: int
    reserved: int
    max_searches: int
    executed: int
    refused: int

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> RunSummary:
        """From the admin queries' row: run id, opened, deadline, rounds, max rounds, reserved,
        max searches, executed, refused (every ledger selects these columns in this order).

        A value of the wrong kind (a damaged page can read back as NULLs where the schema
        allows none) raises :class:`~plugin.errors.LedgerCorruptError`; a time that is no time
        (an infinity an older worker's broken clock stored) is kept, for the caller to say.
        """
        run_id, opened, deadline, *counts = row
        walls = (opened, deadline)
        if (type(run_id) is not str or len(counts) != 6
                or not all(type(wall) in (int, float) for wall in walls)
                or not all(type(count) is int for count in counts)):
            named = repr(run_id)[:80] if type(run_id) is str else "a run"
            raise LedgerCorruptError(f"the ledger's record of {named} is damaged: run "
                                     "`recallbound ledger check`")
        rounds, max_rounds, reserved, max_searches, executed, refused = counts
        return cls(
            run_id=run_id, opened_wall=float(opened), deadline_wall=float(deadline),
            rounds=rounds, max_rounds=max_rounds, reserved=reserved, max_searches=max_searches,
            executed=executed, refused=refused,
        )

    def status(self, now_wall: float) -> RunStatus:
        """The run's status at ``now_wall`` (a round at or past the deadline is refused)."""
        if now_wall >= self.deadline_wall:
            return RunStatus.FINISHED
        if self.rounds >= self.max_rounds or self.reserved >= self.max_searches:
            return RunStatus.EXHAUSTED
        return RunStatus.OPEN


@attrs.frozen(kw_only=True)
class PruneReport:
    """What a prune removed (or, when ``dry_run``, would remove)."""

    before_wall: float
    now_wall: float
    dry_run: bool
    run_ids: tuple[str, ...]
    rows: Mapping[str, int]
    """Rows per table (every name of :data:`PRUNED_TABLES`)."""


@attrs.frozen(kw_only=True)
class LedgerCheck:
    """The result of :meth:`LedgerAdmin.check`. ``problems`` is empty for a sound ledger."""

    backend: str
    location: str
    schema_version: int
    expected_version: int
    problems: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()
    """What the check covered, one item each (storage, identity, version, each invariant)."""

    @property
    def ok(self) -> bool:
        return not self.problems and self.schema_version == self.expected_version


class LedgerAdmin(Protocol):
    """What ``recallbound ledger runs|show|prune|check`` needs beyond the Ledger protocol.

    Every method works on an opened ledger and raises a :class:`~plugin.errors.LedgerError`
    on failure.
    """

    async def runs(self, *, limit: int) -> list[RunSummary]:
        """At most ``limit`` (>= 1) runs, the most recently opened first."""
        ...

    async def run(self, run_id: str) -> RunSummary | None:
        """One run's summary; ``None`` when the ledger never opened it."""
        ...

    async def prune(self, *, before_wall: float, now_wall: float, dry_run: bool) -> PruneReport:
        """Remove every trace of the runs whose deadline is before ``before_wall`` and has
        passed at ``now_wall``, in one transaction; with ``dry_run``, only count them.

        A run whose deadline has not passed, at ``now_wall`` or at the ledger's own clock, is
        never removed, whatever ``before_wall`` says. The ledger's own clock is its database's
        when it judges rounds by it, else the newest time the ledger recorded (a run opened, a
        round reserved, an attempt started, a refusal): the workers' times, which an
        operator's clock cannot overrule. Removes the run's rows of every table in
        :data:`PRUNED_TABLES`.
        """
        ...

    async def check(self) -> LedgerCheck:
        """Verify storage integrity, the schema version and the ledger's own invariants
        (each run's rounds and slots add up and stay within its limits; no run or round
        executed more attempts than it reserved slots; no slot used twice in a run; every
        stored time finite; no trace belongs to an unknown run)."""
        ...
