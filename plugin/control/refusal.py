"""Refusals: what an exhausted allowance says, as data and as an exception."""

from __future__ import annotations

import enum

import attrs

from plugin.errors import RecallboundError

from .wording import bounded


class RefusalReason(enum.Enum):
    """Why recall was refused."""

    SLOTS = "slots"
    """Every search slot of the run (or of this round) is taken."""
    ROUNDS = "rounds"
    """The run already had its maximum number of rounds."""
    DEADLINE = "deadline"
    """The run's original deadline has passed."""
    CLOSED = "closed"
    """The permit's phase has ended; its permit can take no more slots."""
    SOURCE_READS = "source_reads"
    """An attempt used all of its source-read fallbacks."""
    RUN_RATE = "run_rate"
    """The caller opened as many runs as it may in the last hour; this would be another."""


_PLAIN_REASON = {
    RefusalReason.SLOTS: "every search slot of this run has been used",
    RefusalReason.ROUNDS: "this run has used all of its recall rounds",
    RefusalReason.DEADLINE: "this run's recall deadline has passed",
    RefusalReason.CLOSED: "the recall phase this search belonged to has ended",
    RefusalReason.SOURCE_READS: "this search used all of its source-read fallbacks",
    RefusalReason.RUN_RATE: "this caller has opened as many runs as it may in the last hour",
}

def _message(reason: RefusalReason, reserved: int, executed: int) -> str:
    return bounded(f"{_PLAIN_REASON[reason]} ({reserved} searches reserved, {executed} executed)")


@attrs.frozen(kw_only=True)
class _Bounded:
    """What a refusal and a notice both say: why recall was bounded, and the run's totals."""

    reason: RefusalReason
    run_id: str
    reserved: int
    executed: int
    message: str = attrs.field()

    @message.default
    def _default_message(self) -> str:
        return _message(self.reason, self.reserved, self.executed)


@attrs.frozen(kw_only=True)
class BudgetRefusal(_Bounded):
    """A typed refusal, returned to the model as a tool result.

    ``reserved`` and ``executed`` are the run's totals when the refusal was made: reserved slots
    (conservative: every slot a round took, used or not) and executed searches (observed).
    """

    def as_tool_result(self) -> dict[str, object]:
        """A JSON-ready form of the refusal for a tool-call result."""
        return {
            "status": "recall_bounded",
            "reason": self.reason.value,
            "reserved": self.reserved,
            "executed": self.executed,
            "message": self.message,
        }


@attrs.frozen(kw_only=True)
class BoundedRecallNotice(_Bounded):
    """What automatic context carries instead of evidence when recall was bounded."""

    @classmethod
    def from_refusal(cls, refusal: BudgetRefusal) -> BoundedRecallNotice:
        return cls(
            reason=refusal.reason,
            run_id=refusal.run_id,
            reserved=refusal.reserved,
            executed=refusal.executed,
        )


class RecallBudgetExceeded(RecallboundError):
    """Raised where a refused round or attempt cannot return its :class:`BudgetRefusal`."""

    def __init__(self, refusal: BudgetRefusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal

    @property
    def reason(self) -> RefusalReason:
        return self.refusal.reason

    def __reduce__(self) -> tuple[type[RecallBudgetExceeded], tuple[BudgetRefusal]]:
        return (type(self), (self.refusal,))
