"""The deliberate round of one turn's valid search calls: results, ledger records, replays.

:meth:`RecallHooks.dispatch <runtime_hooks.hooks.RecallHooks.dispatch>` validates the calls;
this module answers a call the ledger already recorded from its record
(:func:`replay_recorded`), claims the rest and runs those it claimed in one round
(:func:`run_once`, :func:`run_calls`) and writes what each call came to (:func:`call_records`).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Container, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

import anyio
import attrs

from plugin.control.ledger import CallRecord, bound_evidence
from plugin.control.logs import log_event
from plugin.control.shield import finish
from plugin.errors import LedgerError
from plugin.memory.turn import deliberate_turn

from .calls import SearchCall
from .replay import cut_short, replay_call
from .results import ToolResult, failure_message, in_flight, preparation_bounded, search_content

if TYPE_CHECKING:
    from plugin.memory.recall import DeliberateSearch

    from .hooks import RecallHooks

_log = logging.getLogger("recallbound.hooks")

_Key = tuple[str, str, str]
_ROUND_CALLS: contextvars.ContextVar[Mapping[_Key, anyio.Event]] = contextvars.ContextVar(
    "recallbound_round_calls", default=MappingProxyType({}))
"""The calls (run, call id, digest) whose round the current task runs inside, each with the
event its round sets when it ends: what a retriever re-entering the hooks from that round
sends again can never be waited for (the round waits for the retriever), so it is answered
``in_flight`` at once. A task started inside the round keeps this mark after the round
ended; the round's event, no longer the running one, tells it the call is over."""


def call_records(
    run_id: str,
    valid: Sequence[tuple[int, SearchCall]],
    digests: Mapping[int, str],
    searches: Sequence[DeliberateSearch],
) -> list[CallRecord]:
    """Each dispatched call's outcome as the ledger records it (its identity, slot, status,
    refusal or failure reason, and the evidence ids the model was shown, bounded)."""
    records = []
    for (index, call), search in zip(valid, searches, strict=True):
        reason: str | None
        if search.refusal is not None:
            status, reason = "refused", search.refusal.reason.value
        elif search.failure is not None:
            status, reason = "failed", search.failure
        else:  # what the allowance cut short is kept too: a replay says it again
            status, reason = "ok", cut_short(search.bounded)
        ids, more = bound_evidence([item.id for item in search.evidence])
        records.append(CallRecord(
            run_id=run_id, call_id=call.call_id, digest=digests[index], status=status,
            slot=search.slot, reason=reason, evidence_ids=ids, more=more,
            reserved=search.refusal.reserved if search.refusal is not None else 0,
            executed=search.refusal.executed if search.refusal is not None else 0,
        ))
    return records


@attrs.frozen
class Turn:
    """One dispatch's calls: whose they are, their digests by index, and the results list
    the answers go into (one per call, by index)."""

    hooks: RecallHooks
    run_id: str
    scope: str
    principal: str
    digests: Mapping[int, str]
    results: list[ToolResult | None]

    async def answer_from(self, index: int, record: CallRecord) -> None:
        """Answer the call at ``index`` from its record (never a search)."""
        log_event(_log, logging.INFO, "search_call.replayed", run_id=self.run_id,
                  call_id=record.call_id, status=record.status)
        self.results[index] = await replay_call(self.hooks, record, scope=self.scope,
                                                principal=self.principal)


async def replay_recorded(
    turn: Turn, valid: list[tuple[int, SearchCall]]
) -> list[tuple[int, SearchCall]]:
    """Answer each call the ledger already recorded (same id, same arguments) from its
    record (a claim without an outcome as ``in_flight``); return the calls left to run."""
    asked = [call.call_id for _, call in valid]
    if not asked:
        return valid
    recorded = {
        (record.call_id, record.digest): record
        for record in await turn.hooks.allowance.ledger.recorded_calls(turn.run_id, asked)
    }
    fresh: list[tuple[int, SearchCall]] = []
    for index, call in valid:
        record = recorded.get((call.call_id, turn.digests[index]))
        if record is None:
            fresh.append((index, call))
        else:
            await turn.answer_from(index, record)
    return fresh


async def run_once(turn: Turn, valid: list[tuple[int, SearchCall]],
                   unclaimed: Container[int] = ()) -> None:
    """Run the calls nobody else is running, each once; answer the rest from their records.

    A call is claimed in the ledger before it searches (its id made up by the host or not;
    ``unclaimed`` are one-off calls no one can send again, which need none): a call already
    recorded is answered from its record (:func:`replay_call`), the same call
    sent again while these hooks run it waits for its outcome (sent from inside its own
    round, by a retriever re-entering the hooks, it is ``in_flight`` at once: that wait could
    never end), and one that another process claimed, or that was claimed and then
    interrupted (cancelled, or its process died), is answered as ``in_flight`` and never
    searched again.
    """
    hooks, digests = turn.hooks, turn.digests
    mine: list[tuple[int, SearchCall]] = []
    waiting: list[tuple[int, SearchCall]] = []
    events: list[anyio.Event] = []
    keys: list[_Key] = []
    inside = _ROUND_CALLS.get()
    for index, call in valid:
        key = (turn.run_id, call.call_id, digests[index])
        event = hooks._running.get(key)
        if event is not None and inside.get(key) is event:  # its own round, still running
            turn.results[index] = in_flight(call.call_id)
        elif event is not None:
            waiting.append((index, call))
            events.append(event)
        else:
            hooks._running[key] = anyio.Event()
            keys.append(key)
            mine.append((index, call))
    try:
        claims = [(call.call_id, digests[index]) for index, call in mine
                  if index not in unclaimed]
        held = await hooks.allowance.ledger.claim_calls(turn.run_id, claims) if claims else {}
        ours: list[tuple[int, SearchCall]] = []
        theirs: list[tuple[int, CallRecord]] = []
        for index, call in mine:
            record = held.get((call.call_id, digests[index]))
            if record is None:
                ours.append((index, call))
            else:
                theirs.append((index, record))
        entered = _ROUND_CALLS.set({**inside, **{key: hooks._running[key] for key in keys}})
        try:
            await _run_claimed(turn, ours, [claim for claim in claims if claim not in held],
                               theirs)
        finally:
            _ROUND_CALLS.reset(entered)
    finally:
        for key in keys:
            hooks._running.pop(key).set()
    for event in events:
        await event.wait()
    if waiting:
        for index, call in await replay_recorded(turn, waiting):
            turn.results[index] = in_flight(call.call_id)  # its claimant failed to claim


async def _run_claimed(turn: Turn, ours: list[tuple[int, SearchCall]],
                       claimed: list[tuple[str, str]],
                       theirs: list[tuple[int, CallRecord]]) -> None:
    """Answer the calls recorded or claimed before (``theirs``) from their records, then
    :func:`run_calls` for those this turn claimed. When that fails before a round was granted
    (the ledger failed or was busy, the caller was cancelled), nothing searched: the claims
    are withdrawn, so the same calls sent again run rather than being answered ``in_flight``
    for ever. After a grant they stay: a search may have run."""
    granted: list[bool] = []
    try:
        for index, record in theirs:
            await turn.answer_from(index, record)
        if ours:
            await run_calls(turn, ours, granted=lambda: granted.append(True))
    except BaseException:
        if claimed and not granted:
            ledger = turn.hooks.allowance.ledger
            try:
                await finish(lambda: ledger.release_calls(turn.run_id, claimed))
            except LedgerError as error:  # the claims stay: answered in_flight, never run twice
                log_event(_log, logging.WARNING, "search_call.claims_kept", run_id=turn.run_id,
                          calls=len(claimed), error=type(error).__name__)
        raise


async def run_calls(turn: Turn, valid: list[tuple[int, SearchCall]],
                    granted: Callable[[], object] | None = None) -> None:
    """Run the deliberate round for the valid calls and put each one's result at its index.

    Off the legacy path each call's record is written with the round, or alone when the round
    itself was refused; evidence shown is retained. ``granted`` is told when the round is
    granted, before anything searches.
    """
    hooks, run_id, results, digests = turn.hooks, turn.run_id, turn.results, turn.digests
    scope, principal = turn.scope, turn.principal
    settled: list[CallRecord] = []

    def settle(searches: Sequence[DeliberateSearch]) -> list[CallRecord]:
        # Inside the granted round: written in the same commit as its traces.
        settled[:] = call_records(run_id, valid, digests, searches)
        return settled

    done = await deliberate_turn(
        hooks.allowance, hooks.preparer, hooks.retriever, [call.query for _, call in valid],
        run_id=run_id, scope=scope, principal=principal, caps=hooks.caps,
        budget_s=hooks.preparation_budget_s,
        settle=None if hooks.legacy else settle,
        retain_limit=hooks.max_retained, granted=granted,
    )
    prepared, recall = done.prepared, done.recall
    if not hooks.legacy and not settled:
        # The round itself was refused: each call keeps its refusal.
        await hooks.allowance.ledger.record(
            (), (), call_records(run_id, valid, digests, recall.searches))
    if recall.refusal is not None:
        log_event(_log, logging.INFO, "deliberate.refused", run_id=run_id,
                  calls=len(valid), reason=recall.refusal.reason.value)
    retained: list[str] = []
    for (index, call), one, search in zip(valid, prepared, recall.searches, strict=True):
        if search.refusal is not None:
            results[index] = ToolResult(call_id=call.call_id, status="refused",
                                        content=search.refusal.message,
                                        refusal=search.refusal)
        elif search.failure is not None:
            log_event(_log, logging.WARNING, "search.retriever_failed", run_id=run_id,
                      call_id=call.call_id, reason=search.failure)
            results[index] = ToolResult(call_id=call.call_id, status="failed",
                                        content=failure_message(search.failure),
                                        slot=search.slot, failure=search.failure)
        else:
            rendered = search.rendered
            assert rendered is not None
            bounded = (*preparation_bounded(one), *search.bounded)
            retained.extend(item.id for item in rendered.items)
            results[index] = ToolResult(
                call_id=call.call_id, status="ok",
                content=search_content(rendered.text, bounded), slot=search.slot,
                evidence=rendered.items, notes=search.notes, bounded=bounded,
                omitted=rendered.omitted, dropped=search.dropped,
            )
    if retained and not settled:  # else retained with the call records, in their commit
        await hooks.allowance.ledger.retain(run_id, retained, limit=hooks.max_retained)
