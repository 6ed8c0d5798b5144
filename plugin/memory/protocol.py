"""The retriever protocol: what crosses the trust line between the hooks and a memory backend.

A :class:`Retriever` is code we do not control. The hooks call it inside an attempt they opened
(:mod:`plugin.memory.enforce`) and hand it an :class:`AttemptHandle`, never the permit; it
returns a :class:`Found`, which the hooks check, filter and render under the host's
:class:`ContextCaps`. Whatever the allowance cut short is a :class:`Bounded` part of the result.

Threat model: in-process, recallbound contains a retriever's *mistakes* (it blocks, raises,
returns junk, spawns work, re-enters the hooks), not its *malice*: Python code can read any
frame and any object of its process, permits included. A retriever you do not trust runs in a
worker process behind :class:`~plugin.memory.process.ProcessRetriever`, which sees only the
search requests and returns plain evidence.

This module is a leaf: it imports the control layer and the values it names, and nothing of the
pipeline or the enforcement built on it.
"""

from __future__ import annotations

import inspect
import itertools
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Literal, NoReturn, Protocol, cast, runtime_checkable

import attrs

from plugin.control import AttemptKind, BudgetRefusal, RecallBudgetExceeded, RefusalReason
from plugin.control.policy import MAX_COUNT
from plugin.control.wording import bounded
from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError, RetrieverProtocolError

from .store import Evidence

if TYPE_CHECKING:
    from plugin.control import Permit

    from .preparation import PreparedRecall


def _positive(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise ValueError(f"ContextCaps.{attribute.name} must be an int between 1 and "
                         f"{MAX_COUNT}, got {str(value)[:40]}")


@attrs.frozen(kw_only=True)
class ContextCaps:
    """The host's limits on rendered recall context."""

    max_items: int = attrs.field(default=8, validator=_positive)
    """Most evidence items rendered."""
    max_bytes: int = attrs.field(default=4096, validator=_positive)
    """Most UTF-8 bytes of rendered evidence."""
    candidates_per_arm: int = attrs.field(default=20, validator=_positive)
    """How many candidates each arm contributes to ranking."""
    beliefs_per_person: int = attrs.field(default=3, validator=_positive)

    @property
    def examined(self) -> int:
        """How many items of one read the hooks examine: the first ``4 * max(max_items,
        candidates_per_arm)`` a retriever returns. The rest are never looked at (not checked,
        not ranked, not rendered) and are counted as left out by the caps, so a retriever
        that returns a million items costs what one that returns eighty does."""
        return 4 * max(self.max_items, self.candidates_per_arm)


CORRECTIONS_EXAMINED = 1024
"""How many current corrections of one read the hooks examine (they are sorted newest first
among these); the rest are never looked at and are counted as left out."""


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
                   message=bounded(f"{words[0].lower()}{words[1:]} ({detail or reason})"))

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
SourceReader = Callable[[int], int]

_MISUSE = "an AttemptHandle is handed to one retriever call; it cannot be copied or pickled"


class AttemptHandle:
    """A retriever's narrow view of the one attempt it runs in (never the permit's authority).

    Valid while its attempt runs; afterwards :meth:`source_read` and :meth:`nested` refuse
    (reason ``closed``) and :meth:`seconds_left` is 0.
    """

    __slots__ = ("__weakref__", "_ended", "_kind", "_lock", "_names", "_nested",
                 "_nested_used", "_permit", "_read_source", "_refused", "_slot")

    def __init__(
        self,
        permit: Permit,
        slot: int,
        kind: AttemptKind,
        nested: NestedReader | None,
        read_source: SourceReader | None = None,
        *,
        names: int | None = None,
    ) -> None:
        self._permit = permit
        self._names = names if names is not None else ContextCaps().examined
        self._slot = slot
        self._kind = kind
        self._nested = nested
        self._read_source = read_source if read_source is not None else permit.source_read
        self._nested_used = False
        self._ended = False
        self._refused: list[tuple[Part, BudgetRefusal]] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "ended" if self._ended else "running"
        return f"<AttemptHandle slot={self._slot} kind={self._kind.value} {state}>"

    def __copy__(self) -> NoReturn:
        raise InvalidArgumentTypeError(_MISUSE)

    def __deepcopy__(self, memo: object) -> NoReturn:
        raise InvalidArgumentTypeError(_MISUSE)

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise InvalidArgumentTypeError(_MISUSE)

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
                return self._read_source(self._slot)
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
            raise InvalidArgumentError(
                f"a {self._kind.value} attempt offers no nested read; the hooks read the "
                f"People's beliefs themselves"
            )
        # The first names alone are read (as of a search's own People): an endless iterable
        # given by mistake costs what a long one does, and the deadline can still cut.
        names = tuple(name for name in itertools.islice(people, self._names)
                      if isinstance(name, str))
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
        first: dict[Part, BudgetRefusal] = {}
        for part, refusal in refused:
            first.setdefault(part, refusal)
        return tuple(Bounded.refused(part, refusal) for part, refusal in first.items())


@runtime_checkable
class Retriever(Protocol):
    """A memory backend, as the hooks call it: plain search, never the permit.

    :meth:`searchable` is synchronous; the five others are ``async def`` (checked by
    :func:`check_retriever`). The hooks take each attempt's slot and open its deadline before
    calling :meth:`search` or :meth:`read_beliefs`, and hand over an :class:`AttemptHandle`
    (the slot, the time left, a source-read counter, a nested People read that goes back
    through the hooks). Every method runs with ``current_permit()`` None. Whatever a retriever
    does, it runs inside a slot and its late, failing or foreign results never reach the model
    as evidence. :class:`~plugin.SimpleRetriever` builds one from a single search function.
    """

    def searchable(self, prepared: PreparedRecall) -> bool:
        """Whether an attempt would run anything (else it is skipped: reserved, not executed)."""
        ...

    async def named_people(self, prepared: PreparedRecall) -> tuple[str, ...]:
        """The known People the prepared query names (a lookup of names, no evidence).

        Part of preparing a deliberate call, under the preparation bound: a call that names
        People gets a second slot reserved for its nested belief read.
        """
        ...

    async def search(
        self,
        prepared: PreparedRecall,
        handle: AttemptHandle,
        *,
        caps: ContextCaps,
        nested_beliefs: bool,
    ) -> Found:
        """Search for ``prepared`` inside the attempt ``handle`` stands for; best first.

        With ``nested_beliefs``, read the discovered People's beliefs through
        ``handle.nested(...)`` (it may come back refused).
        """
        ...

    async def read_beliefs(
        self,
        people: Sequence[str],
        handle: AttemptHandle,
        *,
        principal: str,
        scope: str,
        caps: ContextCaps,
    ) -> tuple[Evidence, ...]:
        """The beliefs of ``people`` (the hooks opened the attempt and took its slot)."""
        ...

    async def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:
        """Current correction notices, newest first (no slot: they stay available when
        recall is spent)."""
        ...

    async def revalidate(
        self, ids: Sequence[str], *, principal: str, scope: str
    ) -> tuple[Evidence, ...]:
        """Re-read retained evidence by id (no search, no slot); the missing ones are gone."""
        ...


ASYNC_METHODS = ("named_people", "search", "read_beliefs", "corrections", "revalidate")
"""The :class:`Retriever` methods the hooks await."""


def is_async_callable(value: object) -> bool:
    """Whether calling ``value`` returns an awaitable by declaration (``async def``)."""
    if inspect.iscoroutinefunction(value):
        return True
    if not callable(value) or inspect.isroutine(value):
        return False
    return inspect.iscoroutinefunction(type(value).__call__)  # a callable object's method


def check_retriever(retriever: object) -> Retriever:
    """Return ``retriever`` if it implements :class:`Retriever`; else raise
    :class:`~plugin.errors.RetrieverProtocolError` (a ``TypeError``) naming the first method
    that is missing, or that is not ``async def`` (``searchable`` must be a plain method)."""
    name = type(retriever).__name__
    searchable = getattr(retriever, "searchable", None)
    if not callable(searchable):
        raise RetrieverProtocolError(f"{name} is not a Retriever: it has no searchable()")
    if is_async_callable(searchable):
        raise RetrieverProtocolError(
            f"{name}.searchable must be a plain (not async) method returning a bool"
        )
    for method in ASYNC_METHODS:
        value = getattr(retriever, method, None)
        if not callable(value):
            raise RetrieverProtocolError(f"{name} is not a Retriever: it has no {method}()")
        if not is_async_callable(value):
            raise RetrieverProtocolError(
                f"{name}.{method} must be an async method (async def); the hooks await it"
            )
    # Not isinstance(): since Python 3.12 a runtime protocol check reads attributes statically,
    # so a proxy that forwards its methods through __getattr__ would fail it after passing
    # every check above.
    return cast(Retriever, retriever)
