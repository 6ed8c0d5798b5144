"""Query composers: pure functions from a working state to one :class:`RecallQuery`.

``compose_baseline`` and ``compose_task_context`` are pure functions of a
:class:`~plugin.memory.state.WorkingState` and the trusted ``scope``/``principal`` arguments.
No model is called and nothing is cached; the working state is only read. The task-context
composer reads only bounded windows of the state (the first eight tasks, the first eight
facts, the first two questions and constraints), so its cost does not grow with the state.
``compose_search_call`` forms a deliberate search call's query from the model's own text.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain, islice

from plugin.errors import InvalidArgumentTypeError
from plugin.memory.state import WorkingState

from .query import BaselineReason, FragmentRole, QueryStrategy, RecallQuery

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ENTITY_WINDOW",
    "MAX_CONSTRAINTS",
    "MAX_ENTITIES",
    "MAX_QUESTIONS",
    "MAX_TASKS",
    "TASK_WINDOW",
    "compose_baseline",
    "compose_search_call",
    "compose_task_context",
]

DEFAULT_MAX_BYTES = 512
TASK_WINDOW = 8
"""Only the first eight tasks and the first eight facts are ever read."""
MAX_TASKS = 2
MAX_QUESTIONS = 2
MAX_CONSTRAINTS = 2
MAX_ENTITIES = 8
ENTITY_WINDOW = TASK_WINDOW * MAX_ENTITIES
"""Only the first 64 entity names of the first eight facts are read (a repeated name counts
once among them)."""


class _Fragments:
    """Collects whole, stripped, non-empty, deduplicated fragments under an optional bound."""

    __slots__ = ("_keys", "_raws", "_room", "fragments", "roles")

    def __init__(self, max_bytes: int | None) -> None:
        self._room = max_bytes
        self._keys: set[str] = set()
        self._raws: set[str] = set()
        self.fragments: list[str] = []
        self.roles: list[FragmentRole] = []

    def add(self, raw: str, role: FragmentRole) -> None:
        # A text seen before, as given, is left out as it was the first time (a duplicate, or
        # too large for the room, which only shrinks) without being read again: a state that
        # repeats one huge string costs the composer one reading of it, not one per repeat.
        if raw in self._raws:
            return
        self._raws.add(raw)
        fragment = raw.strip()
        if not fragment:
            return
        room = self._room
        if room is not None:
            if self.fragments:
                room -= 1  # the "\n" separator
            # A character takes at least one byte: skip huge fragments without encoding them.
            if len(fragment) > room:
                return
            size = len(fragment) if fragment.isascii() else len(fragment.encode("utf-8"))
            if size > room:
                return
        key = _dedup_key(fragment)
        if key in self._keys:
            return
        self._keys.add(key)
        self.fragments.append(fragment)
        self.roles.append(role)
        if room is not None:
            self._room = room - size

    def extend(self, raws: Iterable[str], role: FragmentRole) -> None:
        for raw in raws:
            self.add(raw, role)


def _distinct(names: Iterable[str]) -> Iterator[str]:
    """Each entity name once (as fragments count as one), blank ones left out, among the first
    :data:`ENTITY_WINDOW` names: a person named in every fact is one entity reference."""
    seen_raw: set[str] = set()
    seen: set[str] = set()
    for name in islice(names, ENTITY_WINDOW):
        if name in seen_raw:
            continue  # a repeat read once
        seen_raw.add(name)
        key = _dedup_key(name)
        if key and key not in seen:
            seen.add(key)
            yield name


def _dedup_key(fragment: str) -> str:
    """What two fragments share when they count as one: the text case-folded, its whitespace
    collapsed to single spaces."""
    return " ".join(fragment.casefold().split())


def _check_state(state: object) -> None:
    if not isinstance(state, WorkingState):
        raise InvalidArgumentTypeError(
            f"state must be WorkingState, got {type(state).__name__}"
        )


def _check_trusted(scope: object, principal: object) -> None:
    for name, value in (("scope", scope), ("principal", principal)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be str or None, got {type(value).__name__}")


def _baseline(
    state: WorkingState, scope: str | None, principal: str | None, reason: BaselineReason
) -> RecallQuery:
    parts = _Fragments(None)
    parts.add(state.objective, FragmentRole.OBJECTIVE)
    parts.extend(state.open_questions, FragmentRole.QUESTION)
    parts.add(state.current_request, FragmentRole.REQUEST)
    return RecallQuery(
        fragments=tuple(parts.fragments),
        roles=tuple(parts.roles),
        strategy=QueryStrategy.BASELINE,
        baseline_reason=reason,
        scope=scope,
        principal=principal,
    )


def compose_search_call(
    text: str, *, scope: str | None = None, principal: str | None = None
) -> RecallQuery:
    """The query of one deliberate search call: the model's text, stripped, as one fragment.

    Scope and principal still come from the trusted runtime arguments, never from the text.
    """
    if not isinstance(text, str):
        raise TypeError(f"a search call's query must be str, got {type(text).__name__}")
    _check_trusted(scope, principal)
    fragment = text.strip()
    return RecallQuery(
        fragments=(fragment,) if fragment else (),
        strategy=QueryStrategy.BASELINE,
        baseline_reason=BaselineReason.SEARCH_CALL,
        scope=scope,
        principal=principal,
    )


def compose_baseline(
    state: WorkingState, *, scope: str | None = None, principal: str | None = None
) -> RecallQuery:
    """The baseline query: the objective, every open question, then the current request.

    Fragments are stripped, empty ones skipped and whole duplicates dropped (case-folded,
    whitespace collapsed; the first stands), as in the task-context composer. The baseline has
    no byte bound: it is the unchanged control. ``baseline_reason`` is ``DEFAULT``.

    Raises ``TypeError`` when ``state`` is not a ``WorkingState`` or scope/principal are not
    ``str``/``None``.
    """
    _check_state(state)
    _check_trusted(scope, principal)
    return _baseline(state, scope, principal, BaselineReason.DEFAULT)


def compose_task_context(
    state: WorkingState,
    *,
    scope: str | None = None,
    principal: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> RecallQuery:
    """The task-context query: what the agent is doing, in at most ``max_bytes`` UTF-8 bytes.

    Fragments, in order: the current request; the next action; the first two unfinished tasks
    among the first eight tasks; the first two open questions; the objective; the first two
    constraints; the first eight distinct entity names among the first 64 names of the first
    eight facts (a name given again counts once, a blank one not at all; fact texts are never
    used). Each group's candidates are chosen by position before filtering, so a task,
    question or constraint that is blank, a duplicate or too large, or an entity name equal to
    an earlier fragment, takes its place in the group and does not pull in a later one (a
    ninth task or fact is never read).

    Each candidate is stripped of surrounding whitespace and otherwise kept unchanged (no
    Unicode normalisation); blank ones are skipped; one equal to an already kept fragment after
    ``str.casefold`` and collapsing whitespace runs is dropped (the first kept one stands).
    Fragments are never truncated: one that does not fit in the remaining bytes (counting its
    ``"\\n"`` separator) is skipped and later, smaller ones may still fit.

    A stripped current request longer than ``max_bytes`` bytes takes the unchanged baseline
    (``baseline_reason`` ``REQUEST_TOO_LARGE``); one of exactly ``max_bytes`` bytes is kept,
    alone. Raises ``TypeError`` for a state that is not a ``WorkingState`` or scope/principal
    that are not ``str``/``None``, and ``TypeError``/``ValueError`` for a ``max_bytes`` that is
    not an int >= 1.
    """
    _check_state(state)
    _check_trusted(scope, principal)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"max_bytes must be int, got {type(max_bytes).__name__}")
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")

    request = state.current_request.strip()
    if len(request) > max_bytes or len(request.encode("utf-8")) > max_bytes:
        return _baseline(state, scope, principal, BaselineReason.REQUEST_TOO_LARGE)

    parts = _Fragments(max_bytes)
    parts.add(request, FragmentRole.REQUEST)
    parts.add(state.next_action, FragmentRole.NEXT_ACTION)
    unfinished = [task.text for task in islice(state.tasks, TASK_WINDOW) if not task.done]
    parts.extend(unfinished[:MAX_TASKS], FragmentRole.TASK)
    parts.extend(islice(state.open_questions, MAX_QUESTIONS), FragmentRole.QUESTION)
    parts.add(state.objective, FragmentRole.OBJECTIVE)
    parts.extend(islice(state.constraints, MAX_CONSTRAINTS), FragmentRole.CONSTRAINT)
    entities = chain.from_iterable(fact.entities for fact in islice(state.facts, TASK_WINDOW))
    parts.extend(islice(_distinct(entities), MAX_ENTITIES), FragmentRole.ENTITY)
    return RecallQuery(
        fragments=tuple(parts.fragments),
        roles=tuple(parts.roles),
        strategy=QueryStrategy.TASK_CONTEXT,
        baseline_reason=None,
        scope=scope,
        principal=principal,
    )
