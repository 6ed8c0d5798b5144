"""Enforcement on our side of the retriever protocol: attempts, handles, bounded parts.

A :class:`~plugin.memory.pipeline.Retriever` is code we do not control (a vector database, a
LangGraph store, mem0). The hooks therefore open every attempt themselves, before the
retriever runs: :func:`search_attempt` takes the slot from the permit, opens the attempt's
cancel scope (the permit's deadline), and only then calls the retriever, so a retriever that
ignores everything it is given still runs inside a slot and is cut at the deadline.

The retriever gets an :class:`AttemptHandle`, never the permit: the slot it runs on, the time
left, a :meth:`~AttemptHandle.source_read` counter (no new slot, same deadline, at most the
policy's fallbacks) and :meth:`~AttemptHandle.nested` for the People-to-belief read, which goes
back through here and takes a ``NESTED`` slot from the same permit or comes back bounded. The
retriever body runs with :func:`~plugin.control.hide_permit`: ``current_permit()`` is None in it
and in every task it spawns, so it cannot reach the permit to take its siblings' slots. A
handle used after its attempt ended (stored, or called from a task that outlived the attempt)
refuses, with reason ``closed``.

Whatever the allowance cut short (a refused nested read, source reads past the fallbacks, the
semantic arm withheld by the preparation bound) is recorded here, from what the handle saw,
not from what the retriever reports: it becomes a :class:`Bounded` part of the result, said to
the model in the bounded wording.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Literal, NoReturn

import anyio
import attrs

from plugin.control import (
    AttemptKind,
    BudgetRefusal,
    Permit,
    RecallBudgetExceeded,
    RefusalReason,
    hide_permit,
)
from plugin.errors import AttemptHandleError

from .store import Evidence

if TYPE_CHECKING:
    from .pipeline import ContextCaps, Retriever
    from .preparation import PreparedRecall

NOT_EVIDENCE = (
    "Memory recall was bounded; this is not evidence that no memory exists, so do not "
    "conclude that nothing is stored."
)

Part = Literal["nested_read", "source_read", "semantic_arm", "delta"]

_PART_WORDS: dict[str, str] = {
    "nested_read": "The belief read for the people this search names did not run",
    "delta": "The belief read for the people this context names did not run",
    "source_read": "Some sources cited by the evidence were not read",
    "semantic_arm": "The semantic (meaning-based) part of this search did not run",
}


@attrs.frozen(kw_only=True)
class Bounded:
    """One part of a search that the allowance cut short, as the model reads it.

    ``reason`` is a :class:`~plugin.control.RefusalReason` value, or ``"preparation"`` when
    the preparation bound withheld the part. ``message`` carries the bounded wording ("recall
    was bounded", "not evidence").
    """

    part: str
    reason: str
    message: str

    @classmethod
    def of(cls, part: Part, reason: str, detail: str = "") -> Bounded:
        words = _PART_WORDS[part]
        return cls(part=part, reason=reason,
                   message=f"{words} ({detail or reason}). {NOT_EVIDENCE}")

    @classmethod
    def refused(cls, part: Part, refusal: BudgetRefusal) -> Bounded:
        return cls(part=part, reason=refusal.reason.value,
                   message=f"{_PART_WORDS[part]}. {refusal.message}")

    def as_dict(self) -> dict[str, str]:
        return {"part": self.part, "reason": self.reason, "message": self.message}


@attrs.frozen(kw_only=True)
class NestedRead:
    """What :meth:`AttemptHandle.nested` returns: the beliefs, or why there are none."""

    beliefs: tuple[Evidence, ...] = ()
    slot: int | None = None
    refusal: BudgetRefusal | None = None
    """Set when the read was refused (no slot free, deadline, attempt ended): bounded."""


def _evidence(value: Iterable[Evidence]) -> tuple[Evidence, ...]:
    return tuple(value)


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class Found:
    """What a retriever's search returns: its ranked evidence, best first.

    The hooks render it under the host's context caps (a retriever cannot exceed them).
    ``people`` are the People the search discovered, ``arms`` the candidate arms that ran,
    ``notes`` free-form degradations for traces (the hooks never rely on them).
    """

    evidence: tuple[Evidence, ...] = attrs.field(converter=_evidence)
    people: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    arms: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    notes: tuple[str, ...] = attrs.field(default=(), converter=_strings)


NestedReader = Callable[[Sequence[str]], Awaitable[NestedRead]]

_MISUSE = "an AttemptHandle is handed to one retriever call; it cannot be copied or pickled"


class AttemptHandle:
    """A retriever's narrow view of the one attempt it runs in (never the permit).

    Valid while its attempt runs; afterwards :meth:`source_read` and :meth:`nested` refuse
    (reason ``closed``) and :meth:`seconds_left` is 0.
    """

    __slots__ = ("__weakref__", "_ended", "_kind", "_lock", "_nested", "_nested_used",
                 "_permit", "_refused", "_slot")

    def __init__(
        self, permit: Permit, slot: int, kind: AttemptKind, nested: NestedReader | None
    ) -> None:
        self._permit = permit
        self._slot = slot
        self._kind = kind
        self._nested = nested
        self._nested_used = False
        self._ended = False
        self._refused: list[tuple[Part, BudgetRefusal]] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "ended" if self._ended else "running"
        return f"<AttemptHandle slot={self._slot} kind={self._kind.value} {state}>"

    def __copy__(self) -> NoReturn:
        raise AttemptHandleError(_MISUSE)

    def __deepcopy__(self, memo: object) -> NoReturn:
        raise AttemptHandleError(_MISUSE)

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise AttemptHandleError(_MISUSE)

    @property
    def slot(self) -> int:
        """The run-wide number of the slot this attempt took."""
        return self._slot

    @property
    def kind(self) -> AttemptKind:
        return self._kind

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def offers_nested(self) -> bool:
        """Whether :meth:`nested` may be called (a deliberate search's People read)."""
        return self._nested is not None and not self._nested_used

    def seconds_left(self) -> float:
        """Seconds until the attempt's deadline (0 once the attempt ended)."""
        return 0.0 if self._ended else self._permit.seconds_left()

    def _closed(self) -> BudgetRefusal:
        return self._permit.refusal(RefusalReason.CLOSED)

    def source_read(self) -> int:
        """Account one source-read fallback of this attempt; return its number.

        No new slot, same deadline. Raises :class:`~plugin.control.RecallBudgetExceeded`
        past the policy's ``source_read_fallbacks``, at the deadline, or after the attempt
        ended (``closed``); the hooks then tell the model that sources were left unread.
        """
        if self._ended:
            refusal = self._closed()
        else:
            try:
                return self._permit.source_read(self._slot)
            except RecallBudgetExceeded as exc:
                refusal = exc.refusal
        self._record("source_read", refusal)
        raise RecallBudgetExceeded(refusal)

    async def nested(self, people: Sequence[str]) -> NestedRead:
        """The People-to-belief read for ``people``, on a ``NESTED`` slot of the same permit.

        Goes back through the hooks; refused (not queued) when no slot is free, at the
        deadline, or after the attempt ended: the result then carries the refusal, and the
        hooks say so to the model. One nested read per attempt.
        """
        if self._nested is None:
            raise AttemptHandleError(
                f"a {self._kind.value} attempt offers no nested read; the hooks read the "
                f"People's beliefs themselves"
            )
        names = tuple(str(name) for name in people)
        with self._lock:
            ended, used = self._ended, self._nested_used
            self._nested_used = True
        if ended:
            return NestedRead(refusal=self._closed())
        if used:  # the attempt's one nested read was made (and is reported) already
            return NestedRead(refusal=self._permit.refusal(RefusalReason.SLOTS))
        read = await self._nested(names)
        if read.refusal is not None:
            self._record("nested_read", read.refusal)
        return read

    def _record(self, part: Part, refusal: BudgetRefusal) -> None:
        with self._lock:
            if not self._ended:  # after the attempt, nobody reads it any more
                self._refused.append((part, refusal))

    def _end(self) -> tuple[Bounded, ...]:
        """End the attempt; what it cut short, one :class:`Bounded` per part."""
        with self._lock:
            self._ended = True
            refused = list(self._refused)
        first: dict[str, BudgetRefusal] = {}
        for part, refusal in refused:
            first.setdefault(part, refusal)
        return tuple(Bounded.refused(part, refusal)  # type: ignore[arg-type]
                     for part, refusal in first.items())


@attrs.frozen(kw_only=True)
class Attempted:
    """One search attempt as the hooks ran it."""

    slot: int
    found: Found
    bounded: tuple[Bounded, ...] = ()
    belief_slot: int | None = None


async def search_attempt(
    permit: Permit,
    retriever: Retriever,
    prepared: PreparedRecall,
    *,
    kind: AttemptKind,
    caps: ContextCaps,
    nested_beliefs: bool,
    on_slot: Callable[[], object] | None = None,
    nested_after: anyio.Event | None = None,
) -> Attempted:
    """Take a slot, then run the retriever's search inside the attempt (see the module doc).

    ``on_slot`` is called as soon as the slot is taken (the deliberate round starts its calls
    one after another this way, so slots go to the calls in order); a nested read first waits
    for ``nested_after`` (set once every call of the round has its slot). Raises
    :class:`~plugin.control.RecallBudgetExceeded` when no slot is left, the permit is closed
    or expired, or the deadline cut the search.
    """
    query = prepared.query
    principal, scope = query.principal, query.scope
    belief_slot: list[int] = []

    async def nested(people: Sequence[str]) -> NestedRead:
        if principal is None or scope is None:
            return NestedRead(refusal=permit.refusal(RefusalReason.CLOSED))
        if nested_after is not None:
            await nested_after.wait()
        try:
            slot, beliefs = await beliefs_attempt(
                permit, retriever, people, kind=AttemptKind.NESTED, principal=principal,
                scope=scope, caps=caps,
            )
        except RecallBudgetExceeded as exc:
            return NestedRead(refusal=exc.refusal)
        belief_slot.append(slot)
        return NestedRead(beliefs=beliefs, slot=slot)

    async with permit.attempt(
        kind, strategy=query.strategy.value, fingerprint=query.fingerprint
    ) as slot:
        if on_slot is not None:
            on_slot()
        handle = AttemptHandle(permit, slot, kind, nested if nested_beliefs else None)
        try:
            with hide_permit():
                found = await retriever.search(prepared, handle, caps=caps,
                                               nested_beliefs=nested_beliefs)
        finally:
            bounded = handle._end()
        if not isinstance(found, Found):
            raise TypeError(f"Retriever.search must return a Found, got {type(found).__name__}")
    return Attempted(slot=slot, found=found, bounded=bounded,
                     belief_slot=belief_slot[0] if belief_slot else None)


async def beliefs_attempt(
    permit: Permit,
    retriever: Retriever,
    people: Sequence[str],
    *,
    kind: AttemptKind,
    principal: str,
    scope: str,
    caps: ContextCaps,
) -> tuple[int, tuple[Evidence, ...]]:
    """A People-to-belief read on a slot of its own (the automatic delta, or a nested read)."""
    async with permit.attempt(kind) as slot:
        handle = AttemptHandle(permit, slot, kind, None)
        try:
            with hide_permit():
                beliefs = await retriever.read_beliefs(
                    tuple(people), handle, principal=principal, scope=scope, caps=caps
                )
        finally:
            handle._end()
    return slot, tuple(beliefs)
