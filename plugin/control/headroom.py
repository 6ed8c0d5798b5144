"""The allowance rule, written once: when a run may have another round, and how many slots.

A round of a run is granted while the run has a round left, a slot left, and its deadline has
not passed; it gets what it asked for, or the slots that are left. When a round is refused,
the reason named is the first that applies, in this order: ``rounds``, ``slots``,
``deadline``. :class:`Headroom` is that rule over a run's counts, for Python (the in-memory
ledger, and :meth:`~plugin.control.allowance.RecallAllowance.room`, what anyone asks the
allowance of what a run has left); :data:`ADMITS`, :data:`GRANT` and :data:`REFUSAL_REASON` are the
same rule as SQL, which both SQL ledgers' reserving statements are built from.
"""

from __future__ import annotations

import attrs

from .refusal import RefusalReason

ADMITS = ("{r}.rounds < {r}.max_rounds AND {r}.reserved < {r}.max_searches "
          "AND {now} < {r}.deadline_wall")
"""SQL: whether the run in row ``{r}`` of ``runs`` may have a round judged at ``{now}``."""

GRANT = "{least}({requested}, {r}.max_searches - {r}.reserved)"
"""SQL: the slots a round asking for ``{requested}`` gets from the run in row ``{r}``."""

REFUSAL_REASON = (
    "CASE WHEN u.rounds >= u.max_rounds THEN 'rounds' "
    "WHEN u.reserved >= u.max_searches THEN 'slots' ELSE 'deadline' END"
)
"""SQL: why a round of the run in row ``u`` of ``runs`` is refused, first reason first (its
rounds are used up, else its slots, else its deadline passed). Every SQL ledger records its
refusals through this one expression."""


def admits(row: str, now: str) -> str:
    """:data:`ADMITS` for the row alias ``row`` and the time expression ``now``."""
    return ADMITS.format(r=row, now=now)


def grant(row: str, requested: str, least: str) -> str:
    """:data:`GRANT` for the row alias ``row``, ``requested`` and the database's ``least``."""
    return GRANT.format(r=row, requested=requested, least=least)


@attrs.frozen(kw_only=True)
class Headroom:
    """What a run has left under the allowance rule (see the module). A run never seen has
    every round and slot of its policy and no deadline yet."""

    rounds: int
    max_rounds: int
    reserved: int
    max_searches: int
    deadline_wall: float | None = None

    def refusal(self, now_wall: float) -> RefusalReason | None:
        """Why a round judged at ``now_wall`` is refused (the first reason that applies), or
        None when it is granted."""
        if self.rounds >= self.max_rounds:
            return RefusalReason.ROUNDS
        if self.reserved >= self.max_searches:
            return RefusalReason.SLOTS
        if self.deadline_wall is not None and now_wall >= self.deadline_wall:
            return RefusalReason.DEADLINE
        return None

    @property
    def rounds_left(self) -> int:
        """Rounds the run may still have (its deadline aside)."""
        return max(0, self.max_rounds - self.rounds)

    @property
    def slots_left(self) -> int:
        """Slots a round could get (its deadline aside): 0 once the rounds are used up."""
        if self.rounds_left == 0:
            return 0
        return max(0, self.max_searches - self.reserved)

    def grant(self, requested: int) -> int:
        """The slots a granted round asking for ``requested`` gets."""
        return min(requested, self.max_searches - self.reserved)

    def slots(self, now_wall: float) -> int:
        """How many slots a round judged at ``now_wall`` could get (0 when it is refused)."""
        return 0 if self.refusal(now_wall) is not None else self.slots_left
