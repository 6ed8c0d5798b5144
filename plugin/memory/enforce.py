"""Enforcement on our side of the retriever protocol: attempts, containment, admission.

A :class:`~plugin.memory.protocol.Retriever` is code we do not control (a vector database, a
LangGraph store, mem0). The hooks therefore open every attempt themselves, before the
retriever runs: :func:`search_attempt` takes the slot from the permit, opens the attempt's
cancel scope (the permit's deadline), and only then calls the retriever, so a retriever that
ignores everything it is given still runs inside a slot and is cut at the deadline. One that
blocks where no cancel scope reaches (a thread, a blocking call on the loop) and returns late
gets nothing through: the attempt leaves as a ``deadline`` refusal and stays executed. The
attempt runs in a task of its own (:func:`in_attempt_apart`), so one that will not end does
not hold its caller past the deadline and :data:`LATE_GRACE_S`.

The retriever gets an :class:`~plugin.memory.protocol.AttemptHandle`, never the permit: every
call into a retriever runs under :func:`contained`, with ``current_permit()`` None, so a
retriever that looks for the ambient permit (or re-enters code that does) takes no slot by
mistake. This contains mistakes, not malice: code in this process can reach the permit through
frames or the garbage collector; an untrusted retriever runs in another process
(:class:`~plugin.memory.process.ProcessRetriever`). Whatever it
raises (its own ``RecallBudgetExceeded``, a ``CancelledError`` raised by hand, an exception
whose ``__str__`` raises) becomes a :class:`~plugin.errors.RetrieverFailedError` with a typed
reason and none of its text. A real cancellation (the deadline, the host) still propagates.

What a search returns is admitted by :func:`admit` before anyone renders it, caps first: only
the first :attr:`ContextCaps.examined` items are looked at (the rest are counted as left out by
the caps), and each text is cut to the byte cap before any per-character work, so what
recallbound does after a search is bounded whatever the retriever returned, and it runs inside
the attempt, whose deadline is checked when it ends. Every examined item must be a
well-formed :class:`~plugin.memory.store.Evidence` (else the search is that call's own
``failed`` result, ``bad_evidence``). A missing principal or scope is the run's. An item of
another principal or scope, or whose id (or a cited id) is not a valid id
(:func:`plugin.control.validate.identifier`: at most 512 UTF-8 bytes, valid Unicode, no control
character), is dropped, counted and logged at WARNING without its text; so a bad id never
reaches a ledger, and every ledger behaves the same. Whatever the allowance cut short (a
refused nested read, source reads past the fallbacks) is recorded from what the handle saw,
not from what the retriever reports.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import attrs

from plugin.control import (
    Attempt,
    AttemptKind,
    Permit,
    RecallBudgetExceeded,
    RefusalReason,
    validate,
)
from plugin.control.logs import log_event
from plugin.errors import RetrieverFailedError

from .containment import LATE_GRACE_S as LATE_GRACE_S
from .containment import STOPS as STOPS
from .containment import contained as contained
from .containment import contained_apart as contained_apart
from .containment import contained_sync as contained_sync
from .containment import contained_within as contained_within
from .containment import in_attempt_apart
from .containment import stop_unwrapped as stop_unwrapped
from .preparation import PreparedRecall
from .protocol import AttemptHandle as AttemptHandle
from .protocol import Bounded as Bounded
from .protocol import ContextCaps, Retriever
from .protocol import Found as Found
from .protocol import NestedRead as NestedRead
from .protocol import Part as Part
from .safe_text import one_line, reads_as_itself
from .store import Evidence
from .store.values import EVIDENCE_KINDS

_log = logging.getLogger("recallbound.memory")

def _number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


MAX_CITES = 64
"""The most source ids one evidence item may cite."""
NOTE_LIMIT = 200
"""The characters a search's note keeps (the rest is cut, and an ellipsis says so)."""


def _well_formed(value: object) -> bool:
    """Exact types only: a ``str`` subclass could compare equal to any principal."""
    if type(value) is not Evidence:
        return False
    item: Any = value  # fields set past the validators hold anything
    return (
        type(item.id) is str and type(item.text) is str and type(item.arm) is str
        and type(item.kind) is str and item.kind in EVIDENCE_KINDS
        and (item.principal is None or type(item.principal) is str)
        and (item.scope is None or type(item.scope) is str)
        and _number(item.score) and _number(item.created_at)
        and type(item.cites) is tuple and all(type(c) is str for c in item.cites)
    )


def _valid_ids(item: Evidence) -> bool:
    """The item's id and those it cites (at most :data:`MAX_CITES`) are valid ids, and its arm
    a short name: what every ledger can store and every output print on one line. The id also
    reads as itself once rendered (:func:`~plugin.memory.safe_text.reads_as_itself`), so the
    id the model reads is the id it can cite."""
    return (
        len(item.cites) <= MAX_CITES and validate.is_identifier(item.id)
        and reads_as_itself(item.id)
        and all(validate.is_identifier(c) for c in item.cites)
        and len(item.arm) <= validate.MAX_ID_BYTES
    )


def unexamined(items: object, caps: ContextCaps) -> int:
    """How many of a read's items lie past the first :attr:`ContextCaps.examined` (counted as
    left out by the caps, never looked at)."""
    if type(items) not in (tuple, list):
        return 0
    assert isinstance(items, (tuple, list))
    return max(0, len(items) - caps.examined)


def admit(
    items: object,
    *,
    principal: str,
    scope: str,
    run_id: str,
    what: str = "search",
    caps: ContextCaps | None = None,
    examined: int | None = None,
) -> tuple[tuple[Evidence, ...], int]:
    """Check a retriever's evidence; return what the run may see and how many were dropped
    (for naming another principal or scope, or for a bad id).

    With ``caps``, only the first :attr:`ContextCaps.examined` items (or ``examined``) are
    looked at, and each text is cut to ``caps.max_bytes + 1`` characters (a longer one cannot
    fit anyway) before anything reads it. Raises :class:`~plugin.errors.RetrieverFailedError`
    (``bad_result``, ``bad_evidence``) for junk (an item that is not an Evidence of the exact
    types). An item with no principal or scope gets the run's; one naming another principal or
    scope, or whose id (or a cited id) is not a valid id, is dropped (counted, logged at
    WARNING with no text of it).
    """
    if type(items) not in (tuple, list):
        raise RetrieverFailedError("bad_result")
    assert isinstance(items, (tuple, list))
    if caps is not None:
        items = items[: caps.examined if examined is None else examined]
        longest = caps.max_bytes + 1
    kept: list[Evidence] = []
    dropped = invalid = 0
    for item in items:
        if not _well_formed(item):
            raise RetrieverFailedError("bad_evidence")
        if not _valid_ids(item):
            invalid += 1
            continue
        owner, where = item.principal, item.scope
        if (owner is not None and owner != principal) or (where is not None and where != scope):
            dropped += 1
            continue
        if owner is None or where is None:
            item = attrs.evolve(item, principal=principal, scope=scope)
        if caps is not None and len(item.text) > longest:
            item = attrs.evolve(item, text=item.text[:longest])
        kept.append(item)
    if dropped:
        log_event(_log, logging.WARNING, "evidence.foreign_dropped", run_id=run_id, what=what,
                  dropped=dropped)
    if invalid:
        log_event(_log, logging.WARNING, "evidence.invalid_id_dropped", run_id=run_id,
                  what=what, dropped=invalid)
    return tuple(kept), dropped + invalid


def _found(value: object, caps: ContextCaps) -> Found:
    """A search's return value, checked: a :class:`Found` whose names are strings. Only the
    first :attr:`ContextCaps.examined` names of each kind are read (the rest are never looked
    at, so a million names cost what eighty do); the result holds those alone."""
    if type(value) is not Found:
        raise RetrieverFailedError("bad_result")
    kept = []
    for names in (value.people, value.arms, value.notes):
        if type(names) is not tuple:
            raise RetrieverFailedError("bad_result")
        examined = names[:caps.examined]
        if not all(type(name) is str for name in examined):
            raise RetrieverFailedError("bad_result")
        kept.append(examined)
    people, arms, notes = kept
    return Found(evidence=value.evidence, people=people, arms=arms, notes=notes)


@attrs.frozen(kw_only=True)
class Attempted:
    """One search attempt as the hooks ran it: admitted evidence, and what was cut short."""

    slot: int
    found: Found
    bounded: tuple[Bounded, ...] = ()
    belief_slot: int | None = None
    dropped: int = 0
    """Items dropped for naming another principal or scope, or for a bad id (never rendered)."""
    unexamined: int = 0
    """Items past the first :attr:`ContextCaps.examined` (left out by the caps, unread)."""


async def search_attempt(
    permit: Permit,
    retriever: Retriever,
    prepared: PreparedRecall,
    *,
    kind: AttemptKind,
    caps: ContextCaps,
    nested_beliefs: bool,
    on_slot: Callable[[int], object] | None = None,
    nested_after: anyio.Event | None = None,
) -> Attempted:
    """Take a slot, then run the retriever's search inside the attempt (see the module doc).

    ``on_slot`` is called with the slot as soon as it is taken (the deliberate round starts
    its calls one after another this way, so slots go to the calls in order); a nested read
    first waits for ``nested_after`` (set once every call of the round has its slot). Raises
    :class:`~plugin.control.RecallBudgetExceeded`
    when no slot is left, the permit is closed or expired, or the search was cut by (or
    outlived) the deadline; :class:`~plugin.errors.RetrieverFailedError` when the retriever
    failed (its slot stays consumed).
    """
    query = prepared.query
    principal, scope = query.principal, query.scope
    if principal is None or scope is None:
        raise ValueError("a search needs the trusted principal and scope of the run")
    belief_slot: list[int] = []
    inner: list[Attempt] = []  # the nested reads' attempts: they end with the search's
    nested_cut: list[Bounded] = []  # what the allowance cut short inside a nested read
    over: list[bool] = []  # set when the search returned
    dropped = 0

    async def nested(people: Sequence[str]) -> NestedRead:
        nonlocal dropped
        if nested_after is not None:
            await nested_after.wait()
        if over:  # the search returned meanwhile: its handle is used after its attempt ended
            return NestedRead(refusal=permit.refusal(RefusalReason.CLOSED))
        try:
            slot, beliefs, foreign, cut = await beliefs_read(
                permit, retriever, people, kind=AttemptKind.NESTED, principal=principal,
                scope=scope, caps=caps, opened=inner,
            )
        except RecallBudgetExceeded as exc:
            return NestedRead(refusal=exc.refusal)
        dropped += foreign
        belief_slot.append(slot)
        nested_cut.extend(cut)
        return NestedRead(beliefs=beliefs, slot=slot)

    def read_source(slot: int) -> int:
        return permit.source_read(slot)

    entered = permit.attempt(kind, strategy=query.strategy.value, fingerprint=query.fingerprint)

    async def attempt(searched: Callable[[], None]) -> Attempted:
        async with entered as slot:
            if on_slot is not None:
                on_slot(slot)
            handle = AttemptHandle(permit, slot, kind, nested if nested_beliefs else None,
                                   read_source, names=caps.examined)
            try:
                found = _found(await contained(lambda: retriever.search(
                    prepared, handle, caps=caps, nested_beliefs=nested_beliefs)), caps)
            finally:
                over.append(True)
                searched()
                bounded = handle._end()
            unread = unexamined(found.evidence, caps)
            evidence, foreign = admit(found.evidence, principal=principal, scope=scope,
                                      run_id=permit.run_id, caps=caps)
            permit.note_dropped(slot, foreign)
            found = Found(evidence=evidence, people=found.people, arms=found.arms,
                          notes=tuple(one_line(note, limit=NOTE_LIMIT) for note in found.notes))
        return Attempted(slot=slot, found=found, bounded=(*bounded, *nested_cut),
                         belief_slot=belief_slot[0] if belief_slot else None,
                         dropped=dropped + foreign, unexamined=unread)

    return await in_attempt_apart(permit, entered, attempt, inner=inner)


async def beliefs_read(
    permit: Permit,
    retriever: Retriever,
    people: Sequence[str],
    *,
    kind: AttemptKind,
    principal: str,
    scope: str,
    caps: ContextCaps,
    opened: list[Attempt] | None = None,
) -> tuple[int, tuple[Evidence, ...], int, tuple[Bounded, ...]]:
    """A People-to-belief read on a slot of its own: its slot, the admitted beliefs, how many
    were dropped for naming another principal or scope, and what the allowance cut short in
    it (source reads past the fallbacks: said to the model as any attempt's are). Its attempt
    is added to ``opened`` (a search's nested reads, which end with the search's attempt)."""
    entered = permit.attempt(kind)
    if opened is not None:
        opened.append(entered)

    async def attempt(
        searched: Callable[[], None],
    ) -> tuple[int, tuple[Evidence, ...], int, tuple[Bounded, ...]]:
        async with entered as slot:
            handle = AttemptHandle(permit, slot, kind, None, permit.source_read)
            try:
                beliefs = await contained(lambda: retriever.read_beliefs(
                    tuple(people), handle, principal=principal, scope=scope, caps=caps))
            finally:
                searched()
                cut = handle._end()
            admitted, dropped = admit(beliefs, principal=principal, scope=scope,
                                      run_id=permit.run_id, what="beliefs", caps=caps)
            permit.note_dropped(slot, dropped)
        return slot, admitted, dropped, tuple(cut)

    return await in_attempt_apart(permit, entered, attempt)
