"""The query value: one information-need query per round, and what its parts mean.

:class:`RecallQuery` is what every arm of a round searches with; its ``fingerprint`` ties the
semantic preparation to the retrieval that uses it. :class:`QueryStrategy` names how it was
formed, :class:`FragmentRole` which field of the working state each fragment came from, and
:class:`BaselineReason` why a query took the baseline path. The composers that form queries
are in :mod:`plugin.memory.compose`, the planner that picks one in
:mod:`plugin.memory.planning`.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["BaselineReason", "FragmentRole", "QueryStrategy", "RecallQuery"]


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
