"""The automatic recall round, as one piece: what preparation and the evaluator both run.

The round reserves ``automatic_slots``; the base search runs on one slot; the delta — a
People-to-belief read — runs on another only when the base discovered people (a need it left
unmet). Both attempts are opened here, not by the retriever (:mod:`plugin.memory.enforce`).
Beliefs join the ranking by their relevance to the query before the context caps apply
(:func:`~plugin.memory.ranking.with_beliefs`), so a belief read that was paid for is not
crowded out by the base's evidence.
"""

from __future__ import annotations

import attrs

from plugin.control import (
    AttemptKind,
    BudgetRefusal,
    RecallAllowance,
    RecallBudgetExceeded,
    RoundKind,
)

from .enforce import Bounded, beliefs_attempt, search_attempt
from .pipeline import ContextCaps, Rendered, Retriever, render
from .preparation import PreparedRecall
from .ranking import RankingPolicy, with_beliefs
from .store import Evidence


def _policy(retriever: Retriever) -> RankingPolicy:
    """The retriever's ranking policy when it has one (the reference retriever), else the
    default."""
    policy = getattr(retriever, "ranking", None)
    return policy if isinstance(policy, RankingPolicy) else RankingPolicy()


NOTHING_TO_SEARCH = (
    "nothing to search: the query has no searchable terms (slot reserved, not executed)"
)


@attrs.frozen(kw_only=True)
class AutomaticRecall:
    """What one automatic round found, or why it was bounded."""

    rendered: Rendered | None
    """Evidence rendered under the caps (None when nothing was found or the round refused)."""
    candidates: tuple[Evidence, ...] = ()
    """Everything ranked, before the caps (for evaluation: what the caps left out)."""
    slots: tuple[int, ...] = ()
    """Slots the round's attempts took (base, delta)."""
    people: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    refusal: BudgetRefusal | None = None
    """Why recall was bounded: the round was refused, or its delta found no slot."""
    bounded: tuple[Bounded, ...] = ()
    """Parts of the base search the allowance cut short (source reads), in bounded words."""

    @property
    def evidence(self) -> tuple[Evidence, ...]:
        return self.rendered.items if self.rendered is not None else ()


async def automatic_round(
    allowance: RecallAllowance,
    retriever: Retriever,
    prepared: PreparedRecall,
    *,
    run_id: str,
    caps: ContextCaps,
) -> AutomaticRecall:
    """Run the automatic round for ``prepared`` (planned once, by the caller).

    A refused round or delta is returned as ``refusal``, not raised; ledger and store failures
    propagate (no permit, nothing searched when the ledger cannot commit).
    """
    query = prepared.query
    principal, scope = query.principal, query.scope
    if principal is None or scope is None:
        raise ValueError("automatic recall needs the trusted principal and scope of the run")
    slots: list[int] = []
    notes: list[str] = []
    people: tuple[str, ...] = ()
    ranked: list[Evidence] = []
    refusal: BudgetRefusal | None = None
    bounded: tuple[Bounded, ...] = ()
    try:
        async with allowance.round(run_id, RoundKind.AUTOMATIC) as permit:
            if not retriever.searchable(prepared):
                notes.append(NOTHING_TO_SEARCH)
            else:
                base = await search_attempt(
                    permit, retriever, prepared, kind=AttemptKind.BASE, caps=caps,
                    nested_beliefs=False,
                )
                slots.append(base.slot)
                ranked = list(base.found.evidence)  # the whole ranking; capped when rendered
                notes.extend(base.found.notes)
                bounded = base.bounded
                people = base.found.people
                if people:
                    try:
                        slot, beliefs = await beliefs_attempt(
                            permit, retriever, people, kind=AttemptKind.DELTA,
                            principal=principal, scope=scope, caps=caps,
                        )
                    except RecallBudgetExceeded as exc:
                        refusal = exc.refusal
                        notes.append(f"delta refused: {exc.refusal.reason.value}")
                    else:
                        slots.append(slot)
                        ranked = with_beliefs(ranked, beliefs, query=query,
                                              policy=_policy(retriever))
    except RecallBudgetExceeded as exc:
        refusal = exc.refusal
    return AutomaticRecall(
        rendered=render(ranked, caps) if ranked else None,
        candidates=tuple(ranked),
        slots=tuple(slots),
        people=people,
        notes=tuple(notes),
        refusal=refusal,
        bounded=bounded,
    )
