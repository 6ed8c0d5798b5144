"""The two turns, side by side: what runs before the model is called, and what runs for the
model's search calls. The hooks and the evaluator run these same functions, so what the
evaluator measures is what the model would see.

**The automatic turn** (:func:`prepare_turn`):

1. The query is planned under the preparation bound
   (:class:`~plugin.memory.PreparationBound`, on the allowance's clock); when the run has no
   slot left, its semantic arm is withheld (``no_slot``) instead of embedded.
2. Current corrections are read and take at most half of the context caps
   (:func:`corrections_share`); corrections and evidence share one cap, so the round's
   evidence gets what is left. The read has the preparation budget's length of its own: one
   that never returns is cancelled then, and the round runs without corrections.
3. The automatic round runs (:func:`~plugin.memory.recall.automatic_round`: the base search,
   and the People-to-belief delta when the base discovered people).

**The deliberate turn** (:func:`deliberate_turn`, one turn's search calls, already validated):

1. Each call's query is formed under the same preparation bound; only the calls that can still
   get a slot (:meth:`~plugin.RecallAllowance.slots_estimate`) are embedded, and only those look up
   the People their query names (once: the search reuses the names,
   :attr:`~plugin.memory.preparation.PreparedRecall.people`). A call that names People gets a
   second slot for its nested belief read.
2. The deliberate round runs (:func:`~plugin.memory.recall.deliberate_round`): one result per
   call, in order, each rendered once.

Binding the run's identity and turning the result into what the model reads are the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
import attrs

from plugin.control import RecallAllowance
from plugin.control.ledger import CallRecord
from plugin.errors import RetrieverFailedError

from .enforce import admit, contained_apart, contained_within
from .preparation import PreparationBound, PreparedRecall, RecallPreparer, WithheldReason
from .protocol import CORRECTIONS_EXAMINED, ContextCaps, Retriever
from .recall import (
    AutomaticRecall,
    DeliberateRecall,
    DeliberateSearch,
    automatic_round,
    deliberate_round,
)
from .rendering import evidence_line, fit, line_bytes
from .state import WorkingState
from .store import Evidence

__all__ = [
    "PREPARATION_BUDGET_S",
    "CorrectionsShare",
    "DeliberateTurn",
    "PreparedTurn",
    "correction_line",
    "corrections_share",
    "deliberate_turn",
    "prepare_turn",
]


PREPARATION_BUDGET_S = 2.0
"""The default preparation bound of one hook call, in seconds."""


CORRECTION_LABEL = "correction"
"""What a current correction's line says in place of its kind."""


def correction_line(correction: Evidence) -> str:
    """One current correction as one inert line."""
    return evidence_line(correction, label=CORRECTION_LABEL)


@attrs.frozen(kw_only=True)
class CorrectionsShare:
    """Current corrections within their share of the context caps, and what is left."""

    shown: tuple[Evidence, ...]
    """Corrections shown, newest first (ties by id)."""
    omitted: int
    """Current corrections left out by their share of the caps."""
    caps_left: ContextCaps
    """The caps left for the round's evidence."""
    dropped: int = 0
    """Corrections dropped for naming another principal or scope, or for a bad id."""
    failure: str | None = None
    """How the retriever failed to give the corrections (then none are shown), or None."""

    @property
    def notes(self) -> tuple[str, ...]:
        """The failure as a note for traces and logs (empty when the read succeeded)."""
        if self.failure is None:
            return ()
        return (f"corrections unavailable: retriever failed: {self.failure}",)


async def corrections_share(
    retriever: Retriever,
    caps: ContextCaps,
    *,
    principal: str,
    scope: str,
    run_id: str,
    within_s: float | None = None,
) -> CorrectionsShare:
    """Current corrections within at most half the context caps, newest first, and the caps
    left for the round's evidence (corrections and evidence share one cap).

    The read is contained like every retriever call: corrections of another principal or
    scope are dropped, and a failing retriever gives no corrections, the whole caps, and its
    ``failure`` reason (never raised). With ``within_s``, a read still running after that many
    seconds is cancelled and fails the same way (reason ``deadline``).
    """
    try:
        found = await contained_within(
            lambda: retriever.corrections(principal=principal, scope=scope), within_s)
        admitted, dropped = admit(found, principal=principal, scope=scope, run_id=run_id,
                                  what="corrections", caps=caps, examined=CORRECTIONS_EXAMINED)
    except RetrieverFailedError as exc:
        return CorrectionsShare(shown=(), omitted=0, caps_left=caps, failure=exc.reason)
    unexamined = max(0, len(found) - CORRECTIONS_EXAMINED)  # admit took a list or a tuple
    newest = sorted(admitted, key=lambda c: (-c.created_at, c.id))
    # At most half of each cap, rounded down: the evidence always keeps an item of its own,
    # so a cap of one item shows no correction (it is counted as left out, and said).
    half_items, half_bytes = caps.max_items // 2, caps.max_bytes // 2
    kept: tuple[Evidence, ...] = ()
    if half_items and half_bytes:
        kept = fit(newest, ContextCaps(max_items=half_items, max_bytes=half_bytes),
                   label=CORRECTION_LABEL)
    used = sum(line_bytes(correction_line(c)) + 1 for c in kept)
    left = attrs.evolve(
        caps,
        max_items=caps.max_items - len(kept),
        max_bytes=max(1, caps.max_bytes - used - 1),
    )
    return CorrectionsShare(shown=tuple(kept), omitted=len(newest) - len(kept) + unexamined,
                            caps_left=left, dropped=dropped)


@attrs.frozen(kw_only=True)
class PreparedTurn:
    """One preparation turn: the prepared query, the corrections' share, the round."""

    prepared: PreparedRecall
    corrections: CorrectionsShare
    recall: AutomaticRecall


async def plan_with_corrections(
    preparer: RecallPreparer,
    retriever: Retriever,
    state: WorkingState,
    *,
    bound: PreparationBound,
    run_id: str,
    scope: str,
    principal: str,
    caps: ContextCaps,
    withhold: WithheldReason | None,
) -> tuple[PreparedRecall, CorrectionsShare]:
    """Plan the query within what is left of ``bound`` (``withhold``: the semantic arm is not
    prepared, for that reason), then take the current corrections' share of ``caps`` (their
    read bounded by the bound's budget)."""
    async def plan(reason: WithheldReason | None) -> PreparedRecall:
        return await preparer.prepare(state, scope=scope, principal=principal, withhold=reason)

    prepared = await bound.prepare(plan, withhold)
    corrections = await corrections_share(retriever, caps, principal=principal, scope=scope,
                                          run_id=run_id, within_s=bound.budget_s)
    return prepared, corrections


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
    withhold = None if await allowance.slots_estimate(run_id) > 0 else WithheldReason.NO_SLOT
    prepared, corrections = await plan_with_corrections(
        preparer, retriever, state, bound=bound, run_id=run_id, scope=scope,
        principal=principal, caps=caps, withhold=withhold)
    if on_corrections is not None:
        on_corrections(corrections)
    recall = await automatic_round(allowance, retriever, prepared, run_id=run_id,
                                   caps=corrections.caps_left)
    return PreparedTurn(prepared=prepared, corrections=corrections, recall=recall)


@attrs.frozen(kw_only=True)
class DeliberateTurn:
    """One deliberate turn: each call's prepared query, and the round's result per call."""

    prepared: tuple[PreparedRecall, ...]
    recall: DeliberateRecall


async def _named_people(retriever: Retriever, prepared: PreparedRecall) -> tuple[str, ...] | None:
    """The People the query names (None when the retriever failed: its search says so)."""
    try:
        people = await contained_apart(lambda: retriever.named_people(prepared))
    except RetrieverFailedError:
        return None
    if type(people) not in (tuple, list) or not all(type(n) is str for n in people):
        return None  # junk: the search looks them up itself
    return tuple(people)


async def deliberate_turn(
    allowance: RecallAllowance,
    preparer: RecallPreparer,
    retriever: Retriever,
    queries: Sequence[str],
    *,
    run_id: str,
    scope: str,
    principal: str,
    caps: ContextCaps,
    budget_s: float,
    settle: Callable[[Sequence[DeliberateSearch]], Sequence[CallRecord]] | None = None,
    retain_limit: int = 0,
    granted: Callable[[], object] | None = None,
) -> DeliberateTurn:
    """Prepare every call's query, then run one deliberate round for them (see the module
    docstring). ``queries`` are the validated calls' texts, in order; ``scope`` and
    ``principal`` are the caller's checked, trusted values. Ledger failures propagate.
    ``settle``, ``retain_limit`` and ``granted``: as
    :func:`~plugin.memory.recall.deliberate_round`'s (the calls' outcomes recorded in the
    round's own commit; told when the round is granted).
    """
    bound = PreparationBound(budget_s, allowance.clock)
    left = await allowance.slots_estimate(run_id)
    prepared: list[PreparedRecall] = []
    naming = 0
    for position, text in enumerate(queries):

        async def prepare_one(reason: WithheldReason | None, text: str = text) -> PreparedRecall:
            return await preparer.prepare_search(text, scope=scope, principal=principal,
                                                 withhold=reason)

        withhold = None if position < left else WithheldReason.NO_SLOT
        one = await bound.prepare(prepare_one, withhold)
        if position < left and bound.left() > 0:
            with anyio.move_on_after(bound.left()):
                people = await _named_people(retriever, one)
                if people is not None:
                    one = attrs.evolve(one, people=people)
                    naming += bool(people)
        prepared.append(one)
    recall = await deliberate_round(allowance, retriever, prepared, run_id=run_id, caps=caps,
                                    nested=naming, settle=settle, retain_limit=retain_limit,
                                    granted=granted)
    return DeliberateTurn(prepared=tuple(prepared), recall=recall)
