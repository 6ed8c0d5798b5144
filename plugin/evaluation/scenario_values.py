"""The values a scenario file describes (a scenario, its memories, people, beliefs and
corrections, a shared corpus) and the one error for a malformed or incoherent scenario.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import attrs

from plugin.errors import RecallboundError
from plugin.memory.state import WorkingState

__all__ = [
    "GRADES", "InvalidScenarioError", "Scenario", "ScenarioBelief", "ScenarioCorpus",
    "ScenarioCorrection", "ScenarioMemory", "ScenarioPerson",
]

GRADES = (1, 2)
"""Relevance grades: 2 is needed for the next action, 1 is pending work or a constraint."""


class InvalidScenarioError(RecallboundError, ValueError):
    """A scenario line is malformed or incoherent.

    ``line`` is the 1-based line number in the file (``None`` for a scenario built from a
    mapping outside a file), ``field`` the dotted path of the offending value
    (``memories[2].principal``; empty for the line as a whole), ``reason`` what is wrong.
    """

    def __init__(self, reason: str, *, field: str = "", line: int | None = None) -> None:
        self.reason = reason
        self.field = field
        self.line = line
        where = [f"line {line}"] if line is not None else []
        if field:
            where.append(f"field {field!r}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {reason}" if prefix else reason)

    def at_line(self, line: int) -> InvalidScenarioError:
        """The same error, located at ``line``."""
        return InvalidScenarioError(self.reason, field=self.field, line=line)


# -- values ---------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ScenarioMemory:
    """A memory to seed; ``principal``/``scope`` may differ from the scenario's (foreign)."""

    id: str
    text: str
    principal: str
    scope: str
    created_at: float | None = None
    cites: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class ScenarioBelief:
    """A belief held by a person (always of the scenario's principal and scope)."""

    id: str
    text: str
    created_at: float | None = None


@attrs.frozen(kw_only=True)
class ScenarioCorrection:
    """A current correction notice of the scenario's principal and scope (the preparation
    hook shows current corrections, and they take their share of the context caps)."""

    id: str
    text: str
    created_at: float | None = None


@attrs.frozen(kw_only=True)
class ScenarioPerson:
    """A person known to the scenario's principal, with what they believe."""

    name: str
    beliefs: tuple[ScenarioBelief, ...] = ()


def _frozen_grades(value: Mapping[str, int]) -> Mapping[str, int]:
    return types.MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class Scenario:
    """One evaluation scenario; build it with :meth:`from_json`.

    ``relevant`` maps item ids (memories or beliefs) to their grade, 2 or 1. ``must_not`` are
    ids that must never be retrieved. Ids are unique within a scenario (memories and beliefs
    together), so an id names one item.
    """

    id: str
    family: str
    principal: str
    scope: str
    memories: tuple[ScenarioMemory, ...]
    state: WorkingState
    relevant: Mapping[str, int] = attrs.field(converter=_frozen_grades, hash=False)
    people: tuple[ScenarioPerson, ...] = ()
    must_not: tuple[str, ...] = ()
    corpus: str | None = None
    """The corpus the memories and people came from (None: the scenario's own only)."""
    own_items: bool = True
    """Whether the scenario adds memories, people or corrections of its own (beyond its
    corpus)."""
    corrections: tuple[ScenarioCorrection, ...] = ()
    """Current correction notices, stored as the store's corrections (the scenario's own)."""

    @property
    def foreign_ids(self) -> frozenset[str]:
        """Ids of the memories the scenario's principal may not see in its scope."""
        return frozenset(
            m.id for m in self.memories if (m.principal, m.scope) != (self.principal, self.scope)
        )

    @property
    def essential(self) -> frozenset[str]:
        """Ids graded 2 (needed for the next action)."""
        return frozenset(i for i, grade in self.relevant.items() if grade == 2)

    @classmethod
    def from_json(
        cls,
        line_or_mapping: str | bytes | Mapping[str, Any],
        *,
        line: int | None = None,
        corpora: Mapping[str, ScenarioCorpus] | None = None,
    ) -> Scenario:
        """Parse one scenario from a JSON line (``str`` or UTF-8 ``bytes``) or a mapping.

        ``corpora`` are the corpora a ``"corpus"`` reference may name. Raises
        :class:`InvalidScenarioError` (naming ``line`` when given, and the field) for text that
        is not UTF-8 or not JSON, duplicate or unknown keys, missing or mistyped fields,
        non-finite numbers, grades other than 1 and 2, an undefined corpus, and incoherent ids.
        """
        # The parser builds these values; it is reached when a scenario is parsed, not before.
        from .scenario_parsing import decode, scenario_of

        try:
            if isinstance(line_or_mapping, Mapping):
                data: object = line_or_mapping
            elif isinstance(line_or_mapping, (str, bytes, bytearray)):
                data = decode(line_or_mapping)
            else:
                raise InvalidScenarioError(
                    f"a scenario is a JSON line or a mapping, got {type(line_or_mapping).__name__}"
                )
            return scenario_of(data, corpora or {})
        except InvalidScenarioError as exc:
            if line is None or exc.line is not None:
                raise
            raise exc.at_line(line) from None


@attrs.frozen(kw_only=True)
class ScenarioCorpus:
    """Memories and people defined once in a file and shared by the scenarios naming it."""

    id: str
    memories: tuple[ScenarioMemory, ...]
    people: tuple[ScenarioPerson, ...] = ()
