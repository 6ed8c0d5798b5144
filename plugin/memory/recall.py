"""The two recall rounds, as pieces the hooks and the evaluator both run.

**Automatic** (:func:`automatic_round`): the round reserves ``automatic_slots``; the base
search runs on one slot; the delta — a People-to-belief read — runs on another only when the
base discovered people (a need it left unmet). Beliefs join the ranking before the context caps
apply, by their relevance to the query (:func:`~plugin.memory.ranking.with_beliefs`), so a
belief read that was paid for is not crowded out by the base's evidence.

**Deliberate** (:func:`deliberate_round`): one slot per search call plus one per call whose
query names known People (its nested belief read); the calls take their slots in order, before
any nested read; a call without a slot gets the round's refusal.

Every attempt is opened here, not by the retriever (:mod:`plugin.memory.enforce`), and the
retriever runs where no permit is bound: a retriever's failure is its own call's typed result,
a search that outlived the deadline is a ``deadline`` refusal, and foreign evidence is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
import attrs

from plugin.control import (
    AttemptKind,
    BudgetRefusal,
    RecallAllowance,
    RecallBudgetExceeded,
    RoundKind,
)
from plugin.control.ledger import CallRecord
from plugin.control.policy import MAX_COUNT
from plugin.errors import RetrieverFailedError

from .enforce import STOPS, beliefs_read, contained_sync, search_attempt
from .pipeline import MemoryRetriever
from .preparation import PreparedRecall
from .protocol import Bounded, ContextCaps, Retriever
from .ranking import RankingPolicy, with_beliefs
from .rendering import Rendered, render
from .store import Evidence


def _policy(retriever: Retriever) -> RankingPolicy:
    """The reference retriever's own ranking policy, else the default.

    Only a :class:`~plugin.memory.pipeline.MemoryRetriever` itself (not a subclass) is asked,
    and only a :class:`RankingPolicy` itself is taken: any other retriever's ``ranking`` is its
    code, and this runs in the round, outside the retriever's slot, with the permit bound."""
    if type(retriever) is MemoryRetriever and type(retriever.ranking) is RankingPolicy:
        return retriever.ranking
    return RankingPolicy()


NOTHING_TO_SEARCH = (
    "nothing to search: the query has no searchable terms (slot reserved, not executed)"
)


@attrs.frozen(kw_only=True)
class AutomaticRecall:
    """What one automatic round found, or why it was bounded or failed."""

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
    failure: str | None = None
    """How the retriever failed (a :class:`~plugin.errors.RetrieverFailedError` reason)."""
    dropped: int = 0
    """Evidence items dropped for naming another principal or scope."""

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

    A refused round or delta is returned as ``refusal``, a failing retriever as ``failure``,
    neither raised; ledger failures propagate (no permit, nothing searched when the ledger
    cannot commit).
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
    failure: str | None = None
    dropped = 0
    unexamined = 0
    try:
        async with allowance.round(run_id, RoundKind.AUTOMATIC) as permit:
            try:
                searchable = contained_sync(lambda: retriever.searchable(prepared)) is True
                if not searchable:
                    notes.append(NOTHING_TO_SEARCH)
                else:
                    base = await search_attempt(
                        permit, retriever, prepared, kind=AttemptKind.BASE, caps=caps,
                        nested_beliefs=False,
                    )
                    slots.append(base.slot)
                    ranked = list(base.found.evidence)  # the whole ranking; capped when shown
                    notes.extend(base.found.notes)
                    bounded, dropped = base.bounded, base.dropped
                    unexamined = base.unexamined
                    people = base.found.people
                    if people:
                        try:
                            slot, beliefs, foreign, cut = await beliefs_read(
                                permit, retriever, people, kind=AttemptKind.DELTA,
                                principal=principal, scope=scope, caps=caps,
                            )
                        except RecallBudgetExceeded as exc:
                            refusal = exc.refusal
                            notes.append(f"delta refused: {exc.refusal.reason.value}")
                        else:
                            slots.append(slot)
                            dropped += foreign
                            bounded = (*bounded, *cut)  # the delta's own cut-short parts
                            ranked = with_beliefs(ranked, beliefs, query=query,
                                                  policy=_policy(retriever))
            except RetrieverFailedError as exc:
                failure = exc.reason
                notes.append(f"retriever failed: {exc.reason}")
    except RecallBudgetExceeded as exc:
        refusal = exc.refusal
    return AutomaticRecall(
        rendered=render(ranked, caps, unexamined=unexamined) if ranked or unexamined else None,
        candidates=tuple(ranked),
        slots=tuple(slots),
        people=people,
        notes=tuple(notes),
        refusal=refusal,
        bounded=bounded,
        failure=failure,
        dropped=dropped,
    )


@attrs.frozen(kw_only=True)
class DeliberateSearch:
    """One search call of a deliberate round: what it found, or why it has no evidence."""

    slot: int | None = None
    rendered: Rendered | None = None
    """Its evidence under the caps (None when refused or failed)."""
    refusal: BudgetRefusal | None = None
    failure: str | None = None
    """How the retriever failed (a :class:`~plugin.errors.RetrieverFailedError` reason)."""
    bounded: tuple[Bounded, ...] = ()
    notes: tuple[str, ...] = ()
    dropped: int = 0

    @property
    def evidence(self) -> tuple[Evidence, ...]:
        return self.rendered.items if self.rendered is not None else ()


@attrs.frozen(kw_only=True)
class DeliberateRecall:
    """What one deliberate round gave each of its searches, in order."""

    searches: tuple[DeliberateSearch, ...]
    refusal: BudgetRefusal | None = None
    """Set when the round itself was refused (then every search carries this refusal)."""


async def deliberate_round(
    allowance: RecallAllowance,
    retriever: Retriever,
    searches: Sequence[PreparedRecall],
    *,
    run_id: str,
    caps: ContextCaps,
    nested: int = 0,
    settle: Callable[[Sequence[DeliberateSearch]], Sequence[CallRecord]] | None = None,
    retain_limit: int = 0,
    granted: Callable[[], object] | None = None,
) -> DeliberateRecall:
    """Run one deliberate round for ``searches`` (prepared by the caller); one result each,
    in order.

    The round reserves one slot per search plus ``nested`` (the calls that name People). A
    refused round refuses every search; a failing retriever fails only its own search. Ledger
    failures propagate. ``settle``, when given, turns the searches' outcomes into call records
    inside a granted round: they are written in the same commit as the round's traces, with
    the evidence of the ``ok`` calls retained within ``retain_limit``. ``granted``, when
    given, is called once the round's permit is issued, before anything searches.
    """
    if not searches:
        return DeliberateRecall(searches=())
    refusal: BudgetRefusal | None = None
    results: list[DeliberateSearch | None] = [None] * len(searches)
    try:
        async with allowance.round(
            run_id, RoundKind.DELIBERATE, slots=min(len(searches) + nested, MAX_COUNT)
        ) as permit:
            if granted is not None:
                granted()
            # Calls take their slots one after another, in order, and every nested read
            # waits until all calls have theirs: a nested read never takes a call's slot,
            # and the calls that get a slot are the same on every event loop.
            turns = [anyio.Event() for _ in searches]
            placed = turns[-1]
            # The nested reads of the calls that named People come first: another call's read
            # takes only a slot left once those searches ended, on every event loop.
            naming = [bool(search.people) for search in searches]
            later = anyio.Event()

            def release_later() -> None:
                if placed.is_set() and not any(naming):
                    later.set()

            stopped: list[BaseException] = []

            async def search_one(position: int) -> None:
                try:
                    await attempt_one(position)
                except STOPS as exc:  # raised by a child task, it would stop asyncio's loop
                    stopped.append(exc)
                    tg.cancel_scope.cancel()
                except Exception as exc:  # not a call's own outcome (a clock's bad reading,
                    # the ledger): the round's error, raised as itself, not in a task group's
                    stopped.append(exc)
                    tg.cancel_scope.cancel()

            async def attempt_one(position: int) -> None:
                if position:
                    await turns[position - 1].wait()
                taken: list[int] = []

                def on_slot(slot: int) -> None:
                    taken.append(slot)
                    turns[position].set()
                    release_later()

                try:
                    attempted = await search_attempt(
                        permit, retriever, searches[position], kind=AttemptKind.DELIBERATE,
                        caps=caps, nested_beliefs=True, on_slot=on_slot,
                        nested_after=placed if naming[position] else later,
                    )
                except RecallBudgetExceeded as exc:
                    results[position] = DeliberateSearch(slot=taken[0] if taken else None,
                                                         refusal=exc.refusal)
                except RetrieverFailedError as exc:
                    results[position] = DeliberateSearch(slot=taken[0] if taken else None,
                                                         failure=exc.reason)
                else:
                    results[position] = DeliberateSearch(
                        slot=attempted.slot,
                        rendered=render(attempted.found.evidence, caps,
                                        unexamined=attempted.unexamined),
                        bounded=attempted.bounded, notes=attempted.found.notes,
                        dropped=attempted.dropped,
                    )
                finally:
                    turns[position].set()
                    naming[position] = False
                    release_later()

            async with anyio.create_task_group() as tg:
                for position in range(len(searches)):
                    tg.start_soon(search_one, position)
            if stopped:
                raise stopped[0]  # in the caller's task, as itself
            if settle is not None:
                permit.record_calls(settle(_settled(results)), retain_limit=retain_limit)
    except RecallBudgetExceeded as exc:
        refusal = exc.refusal
        for position, result in enumerate(results):
            if result is None:
                results[position] = DeliberateSearch(refusal=exc.refusal)
    # A search left with no outcome ended without one (on Python 3.10 a retriever's own
    # CancelledError cannot be told from a real cancel, and the task group swallows it): it is
    # that call's failure, never a missing result.
    return DeliberateRecall(searches=_settled(results), refusal=refusal)


def _settled(results: Sequence[DeliberateSearch | None]) -> tuple[DeliberateSearch, ...]:
    return tuple(result if result is not None else DeliberateSearch(failure="raised")
                 for result in results)
