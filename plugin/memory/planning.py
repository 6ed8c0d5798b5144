"""Query planning: one deterministic information-need query per round.

``compose_baseline`` and ``compose_task_context`` are pure functions of a
:class:`~plugin.memory.state.WorkingState` and the trusted ``scope``/``principal`` arguments.
No model is called and nothing is cached; the working state is only read. The task-context
composer reads only bounded windows of the state (the first eight tasks, the first eight
facts, the first two questions and constraints), so its cost does not grow with the state.

:class:`QueryPlanner` picks the strategy per call: the ``task_context`` experiment needs the
release admission on *every* call, and anything short of a timely ``True`` gives the baseline.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from itertools import chain, islice
from typing import Any

import anyio
import attrs

from plugin.errors import InvalidArgumentTypeError
from plugin.memory.state import WorkingState

_log = logging.getLogger("recallbound.memory")

Admission = Callable[[str], Awaitable[bool]]
"""Release admission: awaited with the experiment's name, answers ``True`` to admit it."""

DEFAULT_MAX_BYTES = 512
TASK_WINDOW = 8
"""Only the first eight tasks and the first eight facts are ever read."""
MAX_TASKS = 2
MAX_QUESTIONS = 2
MAX_CONSTRAINTS = 2
MAX_ENTITIES = 8


class QueryStrategy(enum.Enum):
    """How the query is formed (the ``query_planning`` setting)."""

    BASELINE = "baseline"
    """Objective, open questions and the current request (the default and frozen control)."""
    TASK_CONTEXT = "task_context"
    """The bounded task-context composer (the experiment; needs release admission)."""


class FragmentRole(enum.Enum):
    """What one fragment of a query is: the field of the working state it was taken from."""

    REQUEST = "request"
    """The current request (or a deliberate search call's text)."""
    NEXT_ACTION = "next_action"
    TASK = "task"
    """An unfinished task."""
    QUESTION = "question"
    """An open question."""
    OBJECTIVE = "objective"
    CONSTRAINT = "constraint"
    ENTITY = "entity"
    """An entity named by an established fact."""


class BaselineReason(enum.Enum):
    """Why a query took the baseline path."""

    DEFAULT = "default"
    """The baseline strategy was selected."""
    ADMISSION_WITHDRAWN = "admission_withdrawn"
    """The admission answered ``False``."""
    ADMISSION_UNAVAILABLE = "admission_unavailable"
    """No admission was configured."""
    ADMISSION_FAILED = "admission_failed"
    """The admission raised, or answered something other than a ``bool``."""
    ADMISSION_TIMEOUT = "admission_timeout"
    """The admission did not answer within ``admission_timeout_s``."""
    REQUEST_TOO_LARGE = "request_too_large"
    """The current request alone exceeds the byte bound; it is kept whole, unenriched."""
    FROZEN_CONTROL = "frozen_control"
    """Recent-candidate selection, which keeps the baseline whatever the strategy."""
    SEARCH_CALL = "search_call"
    """The model's own search text from a deliberate tool call, used as given (not planned)."""


def _fingerprint(
    strategy: QueryStrategy, fragments: tuple[str, ...], scope: str | None, principal: str | None
) -> str:
    canonical = json.dumps(
        {
            "fragments": list(fragments),
            "principal": principal,
            "scope": scope,
            "strategy": strategy.value,
        },
        sort_keys=True,
        ensure_ascii=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _optional_str(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(
            f"RecallQuery.{attribute.name} must be str or None, got {type(value).__name__}"
        )


def _tuple_of(kind: type) -> Callable[[object, attrs.Attribute[Any], object], None]:
    """A validator: a tuple whose every item is a ``kind``."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, tuple):
            raise TypeError(
                f"RecallQuery.{attribute.name} must be a tuple, got {type(value).__name__}"
            )
        for index, item in enumerate(value):
            if not isinstance(item, kind):
                raise TypeError(f"RecallQuery.{attribute.name}[{index}] must be "
                                f"{kind.__name__}, got {type(item).__name__}")

    return check


@attrs.frozen(kw_only=True)
class RecallQuery:
    """One information-need query, as used by every arm of one round.

    ``text`` is the fragments joined by ``"\\n"``. ``fingerprint`` is the hex SHA-256 of a
    canonical JSON encoding of the strategy, fragments, scope and principal (not of
    ``baseline_reason``), stable across processes. ``scope`` and ``principal`` are the trusted
    runtime arguments, never read from text. There is deliberately no date, ``as_of``,
    ``known_at`` or belief filter: dates and entities in the text are relevance hints only.

    ``roles`` holds each fragment's :class:`FragmentRole`, one per fragment (the composers set
    them; left empty, every fragment counts as the request). Roles are not part of the
    fingerprint: the fragments, in order, already determine them for a given strategy.
    """

    fragments: tuple[str, ...] = attrs.field(validator=_tuple_of(str))
    strategy: QueryStrategy = attrs.field(validator=attrs.validators.instance_of(QueryStrategy))
    baseline_reason: BaselineReason | None = attrs.field(
        validator=attrs.validators.optional(attrs.validators.instance_of(BaselineReason))
    )
    scope: str | None = attrs.field(default=None, validator=_optional_str)
    principal: str | None = attrs.field(default=None, validator=_optional_str)
    roles: tuple[FragmentRole, ...] = attrs.field(default=(), validator=_tuple_of(FragmentRole))
    text: str = attrs.field(init=False)
    fingerprint: str = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if (self.strategy is QueryStrategy.BASELINE) is (self.baseline_reason is None):
            raise ValueError(
                "RecallQuery.baseline_reason must be set exactly when strategy is BASELINE, "
                f"got {self.baseline_reason!r} for {self.strategy!r}"
            )
        if not self.roles:
            object.__setattr__(self, "roles", (FragmentRole.REQUEST,) * len(self.fragments))
        elif len(self.roles) != len(self.fragments):
            raise ValueError(
                f"RecallQuery.roles must give one role per fragment: {len(self.roles)} roles "
                f"for {len(self.fragments)} fragments"
            )
        object.__setattr__(self, "text", "\n".join(self.fragments))
        object.__setattr__(
            self,
            "fingerprint",
            _fingerprint(self.strategy, self.fragments, self.scope, self.principal),
        )


class _Fragments:
    """Collects whole, stripped, non-empty, deduplicated fragments under an optional bound."""

    __slots__ = ("_keys", "_room", "fragments", "roles")

    def __init__(self, max_bytes: int | None) -> None:
        self._room = max_bytes
        self._keys: set[str] = set()
        self.fragments: list[str] = []
        self.roles: list[FragmentRole] = []

    def add(self, raw: str, role: FragmentRole) -> None:
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
        key = " ".join(fragment.casefold().split())
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
    constraints; the first eight entity names of the first eight facts (fact texts are never
    used). Each group's candidates are chosen by position before filtering, so a candidate
    that is blank, a duplicate or too large takes its place in the group and does not pull in a
    later one (a ninth task or fact is never read).

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
    parts.extend(islice(entities, MAX_ENTITIES), FragmentRole.ENTITY)
    return RecallQuery(
        fragments=tuple(parts.fragments),
        roles=tuple(parts.roles),
        strategy=QueryStrategy.TASK_CONTEXT,
        baseline_reason=None,
        scope=scope,
        principal=principal,
    )


def _strategy(value: QueryStrategy | str) -> QueryStrategy:
    if isinstance(value, QueryStrategy):
        return value
    if isinstance(value, str):
        try:
            return QueryStrategy(value)
        except ValueError:
            raise ValueError(
                f"QueryPlanner.strategy must be one of "
                f"{', '.join(s.value for s in QueryStrategy)}, got {value!r}"
            ) from None
    raise TypeError(f"QueryPlanner.strategy must be a QueryStrategy, got {type(value).__name__}")


def _admission(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not callable(value):
        raise TypeError(
            f"QueryPlanner.admission must be an async callable or None, got {type(value).__name__}"
        )


def _timeout(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"QueryPlanner.admission_timeout_s must be a number, got {type(value).__name__}"
        )
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"QueryPlanner.admission_timeout_s must be finite and > 0, got {value!r}")


@attrs.frozen
class QueryPlanner:
    """Forms the round's query with the configured strategy.

    ``admission`` is an async callable taking the experiment name (``"task_context"``) and
    returning a ``bool``; ``None`` means admission is unavailable. It is awaited on every
    :meth:`plan` call with the ``task_context`` strategy, never cached. ``strategy`` also
    accepts its string value (``"task_context"``).
    """

    strategy: QueryStrategy = attrs.field(default=QueryStrategy.BASELINE, converter=_strategy)
    admission: Admission | None = attrs.field(default=None, validator=_admission)
    admission_timeout_s: float = attrs.field(default=0.25, validator=_timeout)

    async def plan(
        self, state: WorkingState, *, scope: str | None = None, principal: str | None = None
    ) -> RecallQuery:
        """The query for this round.

        With ``TASK_CONTEXT``, admission is asked now; an answer of ``True`` within
        ``admission_timeout_s`` gives :func:`compose_task_context`, anything else (``False``,
        no admission, an exception, a non-bool answer, no answer in time) gives the baseline
        with the matching :class:`BaselineReason`. Cancellation of the caller propagates.
        """
        _check_state(state)
        _check_trusted(scope, principal)
        if self.strategy is QueryStrategy.BASELINE:
            return _baseline(state, scope, principal, BaselineReason.DEFAULT)
        refused = await self._admit()
        if refused is not None:
            return _baseline(state, scope, principal, refused)
        return compose_task_context(state, scope=scope, principal=principal)

    def plan_recent(
        self, state: WorkingState, *, scope: str | None = None, principal: str | None = None
    ) -> RecallQuery:
        """The query for recent-candidate selection: the baseline, whatever the strategy.

        This is the frozen control (``baseline_reason`` ``FROZEN_CONTROL``); admission is not
        asked. Its fingerprint equals that of :func:`compose_baseline` for the same arguments.
        """
        _check_state(state)
        _check_trusted(scope, principal)
        return _baseline(state, scope, principal, BaselineReason.FROZEN_CONTROL)

    async def _admit(self) -> BaselineReason | None:
        """None when the experiment is admitted, else why the baseline is used."""
        admission = self.admission
        if admission is None:
            return BaselineReason.ADMISSION_UNAVAILABLE
        answer: object = None
        with anyio.move_on_after(self.admission_timeout_s) as deadline:
            try:
                answer = await admission(QueryStrategy.TASK_CONTEXT.value)
            except Exception:
                if deadline.cancel_called:
                    # The admission turned our timeout into an error of its own.
                    return BaselineReason.ADMISSION_TIMEOUT
                _log.warning("query-planning admission failed; using the baseline", exc_info=True)
                return BaselineReason.ADMISSION_FAILED
        if deadline.cancel_called:  # a late answer is no answer, even one that swallowed it
            return BaselineReason.ADMISSION_TIMEOUT
        if answer is True:
            return None
        if answer is False:
            return BaselineReason.ADMISSION_WITHDRAWN
        _log.warning(
            "query-planning admission answered %s, not bool; using the baseline",
            type(answer).__name__,
        )
        return BaselineReason.ADMISSION_FAILED
