"""The preparation turn: what runs before the model is called, as one piece.

The preparation hook and the evaluator's ``hooks`` cell run this one code path, so what the
evaluator measures is what the model would see:

1. The query is planned under the preparation bound (:class:`~plugin.PreparationBound`, on the
   allowance's clock); when the run has no slot left, its semantic arm is withheld
   (``no_slot``) instead of embedded.
2. Current corrections are read and take at most half of the context caps
   (:func:`corrections_share`); corrections and evidence share one cap, so the round's
   evidence gets what is left.
3. The automatic round runs (:func:`~plugin.memory.recall.automatic_round`: the base search,
   and the People-to-belief delta when the base discovered people).

Binding the run's identity and turning the result into what the model reads are the caller's.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from plugin.control import RecallAllowance
from plugin.errors import RetrieverFailedError

from .enforce import admit, contained
from .preparation import PreparationBound, PreparedRecall, RecallPreparer, WithheldReason
from .protocol import ContextCaps, Retriever
from .recall import AutomaticRecall, automatic_round
from .rendering import evidence_line, line_bytes, render
from .state import WorkingState
from .store import Evidence

__all__ = [
    "PREPARATION_BUDGET_S",
    "CorrectionsShare",
    "PreparedTurn",
    "correction_line",
    "corrections_share",
    "prepare_turn",
]


PREPARATION_BUDGET_S = 2.0
"""The default preparation bound of one hook call, in seconds."""


def correction_line(correction: Evidence) -> str:
    """One current correction as one inert line."""
    return evidence_line(correction, label="correction")


@attrs.frozen(kw_only=True)
class CorrectionsShare:
    """Current corrections within their share of the context caps, and what is left."""

    shown: tuple[Evidence, ...]
    """Corrections shown, newest first (ties by id)."""
    omitted: int
    """Current corrections left out by their share of the caps."""
    caps_left: ContextCaps
    """The caps left for the round's evidence."""
    failure: str | None = None
    """How the retriever failed to give the corrections (then none are shown), or None."""

    @property
    def notes(self) -> tuple[str, ...]:
        """The failure as a note for traces and logs (empty when the read succeeded)."""
        if self.failure is None:
            return ()
        return (f"corrections unavailable: retriever failed: {self.failure}",)


async def corrections_share(
    retriever: Retriever, caps: ContextCaps, *, principal: str, scope: str, run_id: str
) -> CorrectionsShare:
    """Current corrections within at most half the context caps, newest first, and the caps
    left for the round's evidence (corrections and evidence share one cap).

    The read is contained like every retriever call: corrections of another principal or
    scope are dropped, and a failing retriever gives no corrections, the whole caps, and its
    ``failure`` reason (never raised).
    """
    try:
        found = await contained(lambda: retriever.corrections(principal=principal, scope=scope))
        admitted, _ = admit(found, principal=principal, scope=scope, run_id=run_id,
                            what="corrections", caps=caps)
    except RetrieverFailedError as exc:
        return CorrectionsShare(shown=(), omitted=0, caps_left=caps, failure=exc.reason)
    newest = sorted(admitted, key=lambda c: (-c.created_at, c.id))
    share = ContextCaps(max_items=max(1, caps.max_items // 2),
                        max_bytes=max(1, caps.max_bytes // 2))
    kept = render(newest, share).items
    used = sum(line_bytes(correction_line(c)) + 1 for c in kept)
    left = attrs.evolve(
        caps,
        max_items=max(1, caps.max_items - len(kept)),
        max_bytes=max(1, caps.max_bytes - used - 1),
    )
    return CorrectionsShare(shown=tuple(kept), omitted=len(newest) - len(kept), caps_left=left)


@attrs.frozen(kw_only=True)
class PreparedTurn:
    """One preparation turn: the prepared query, the corrections' share, the round."""

    prepared: PreparedRecall
    corrections: CorrectionsShare
    recall: AutomaticRecall


async def prepare_turn(
    allowance: RecallAllowance,
    preparer: RecallPreparer,
    retriever: Retriever,
    state: WorkingState,
    *,
    run_id: str,
    scope: str,
    principal: str,
    caps: ContextCaps,
    budget_s: float,
    on_corrections: Callable[[CorrectionsShare], None] | None = None,
) -> PreparedTurn:
    """Plan under the preparation bound, take the corrections' share, run the automatic round
    (see the module docstring). ``scope`` and ``principal`` are the caller's checked, trusted
    values; ``on_corrections`` sees the corrections' share before the round runs (logging).
    """
    bound = PreparationBound(budget_s, allowance.clock)
    withhold = None if await allowance.headroom(run_id) > 0 else WithheldReason.NO_SLOT

    async def plan(reason: WithheldReason | None) -> PreparedRecall:
        return await preparer.prepare(state, scope=scope, principal=principal, withhold=reason)

    prepared = await bound.prepare(plan, withhold)
    corrections = await corrections_share(retriever, caps, principal=principal, scope=scope,
                                          run_id=run_id)
    if on_corrections is not None:
        on_corrections(corrections)
    recall = await automatic_round(allowance, retriever, prepared, run_id=run_id,
                                   caps=corrections.caps_left)
    return PreparedTurn(prepared=prepared, corrections=corrections, recall=recall)
