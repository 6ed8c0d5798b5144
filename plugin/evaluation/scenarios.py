"""Evaluation scenarios: the evaluator's input, one JSON object a line (the
format is documented on the evaluation page).

:func:`load_scenarios` reads any such file: UTF-8 text, one scenario a line, blank lines
skipped. Everything is checked when read, so a malformed file fails here with an
:class:`InvalidScenarioError` naming the line and the field, never later inside a search.
Beyond the JSON shape, a scenario must be coherent: ids unique within it, every ``relevant``
and ``must_not`` id naming one of its items, no relevant item that the scenario's principal
could never see, no item both relevant and forbidden.

A file may define a corpus once and reference it from many scenarios: a line
``{"corpus": "c1", "memories": [...], "people": [...]}`` defines corpus ``c1``, and a scenario
line with ``"corpus": "c1"`` (and no ``memories`` of its own, or only extra ones) uses its
memories and people. A corpus is defined before the lines that use it, so
:func:`iter_scenarios` reads a file line by line and never holds more than its corpora and
the current scenario. The old form (every scenario carrying its memories) stays readable.
"""

from __future__ import annotations

import json
import math
import os
import types
from collections.abc import Generator, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import attrs

from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError, RecallboundError
from plugin.memory.state import WorkingState

__all__ = [
    "InvalidScenarioError",
    "Scenario",
    "ScenarioCorpus",
    "ScenarioBelief",
    "ScenarioCorrection",
    "ScenarioMemory",
    "ScenarioPerson",
    "iter_scenarios",
    "load_scenarios",
    "parse_scenarios",
    "stream_scenarios",
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
        try:
            if isinstance(line_or_mapping, Mapping):
                data: object = line_or_mapping
            elif isinstance(line_or_mapping, (str, bytes, bytearray)):
                data = _decode(line_or_mapping)
            else:
                raise InvalidScenarioError(
                    f"a scenario is a JSON line or a mapping, got {type(line_or_mapping).__name__}"
                )
            return _scenario(data, corpora or {})
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


def parse_scenarios(text: bytes | str, *, first_line: int = 1) -> list[Scenario]:
    """Parse JSONL text: one scenario (or corpus) a non-blank line; see :func:`iter_scenarios`.

    ``bytes`` are decoded line by line, so bytes that are not UTF-8 are reported with their
    line number. A UTF-8 byte-order mark at the start is ignored.
    """
    raw_lines: list[bytes | str]
    if isinstance(text, (bytes, bytearray)):
        raw_lines = list(bytes(text).split(b"\n"))
    elif isinstance(text, str):
        raw_lines = list(text.split("\n"))
    else:
        raise TypeError(f"text must be bytes or str, got {type(text).__name__}")
    return list(iter_scenarios(raw_lines, first_line=first_line))


def iter_scenarios(
    lines: Iterable[bytes | str], *, first_line: int = 1
) -> Iterator[Scenario]:
    """Scenarios from JSONL lines, one at a time, resolving corpus references.

    Scenario ids are unique across the lines, corpus ids too; a corpus is defined before the
    scenarios that name it. A byte-order mark on the first line is ignored. Raises
    :class:`InvalidScenarioError` naming the line for anything malformed.
    """
    corpora: dict[str, ScenarioCorpus] = {}
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=first_line):
        if number == first_line:
            raw = (
                raw.removeprefix(b"\xef\xbb\xbf")
                if isinstance(raw, bytes)
                else raw.removeprefix("\ufeff")
            )
        if not raw.strip():
            continue
        try:
            data = _decode(raw)
            if isinstance(data, Mapping) and "corpus" in data and "id" not in data:
                corpus = _corpus(data)
                if corpus.id in corpora:
                    raise InvalidScenarioError(
                        f"corpus {corpus.id!r} is already defined", field="corpus"
                    )
                corpora[corpus.id] = corpus
                continue
            scenario = _scenario(data, corpora)
        except InvalidScenarioError as exc:
            raise exc.at_line(number) from None
        if scenario.id in seen:
            raise InvalidScenarioError(
                f"scenario id {scenario.id!r} was already used on line {seen[scenario.id]}",
                field="id",
                line=number,
            )
        seen[scenario.id] = number
        yield scenario


def load_scenarios(path: str | os.PathLike[str]) -> list[Scenario]:
    """Read a whole scenario file (JSONL, UTF-8); see :func:`stream_scenarios` for large ones.

    Raises :class:`InvalidScenarioError` for a malformed line and ``OSError`` when the file
    cannot be read.
    """
    return list(stream_scenarios(path))


def stream_scenarios(path: str | os.PathLike[str]) -> Generator[Scenario, None, None]:
    """Read a scenario file line by line (see :func:`iter_scenarios`); the file stays open
    while the iterator is consumed."""
    with open(path, "rb") as file:
        yield from iter_scenarios(file)


# -- parsing --------------------------------------------------------------------------------------

_SCENARIO_KEYS = ("id", "family", "principal", "scope", "state", "relevant")
_SCENARIO_OPTIONAL = ("memories", "people", "must_not", "corpus", "corrections")
_CORPUS_KEYS = ("corpus", "memories")
_CORPUS_OPTIONAL = ("people",)
_MEMORY_KEYS = ("id", "text", "principal", "scope")
_MEMORY_OPTIONAL = ("created_at", "cites")
_PERSON_KEYS = ("name",)
_PERSON_OPTIONAL = ("beliefs",)
_DATED_KEYS = ("id", "text")
_DATED_OPTIONAL = ("created_at",)


def _reject_constant(name: str) -> object:
    raise InvalidScenarioError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise InvalidScenarioError(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


def _decode(raw: str | bytes | bytearray) -> object:
    if isinstance(raw, (bytes, bytearray)):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidScenarioError(
                f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}"
            ) from None
    try:
        return json.loads(
            raw, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant
        )
    except json.JSONDecodeError as exc:
        raise InvalidScenarioError(f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise InvalidScenarioError("not valid JSON: nested too deeply") from None


def _object(
    data: object, field: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise InvalidScenarioError(
            f"must be a JSON object, got {_json_type(data)}", field=field
        )
    unknown = sorted(str(key) for key in data if key not in required and key not in optional)
    if unknown:
        raise InvalidScenarioError(
            f"unknown key(s) {', '.join(map(repr, unknown))}; expected "
            f"{', '.join(required + optional)}",
            field=field,
        )
    missing = [key for key in required if key not in data]
    if missing:
        raise InvalidScenarioError(
            f"missing required key(s) {', '.join(map(repr, missing))}", field=field
        )
    return data


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    return type(value).__name__


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _text(value: object, field: str, *, key: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidScenarioError(f"must be a string, got {_json_type(value)}", field=field)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidScenarioError(
            f"not valid Unicode text: lone surrogate at index {exc.start}", field=field
        ) from None
    if key and not value.strip():
        raise InvalidScenarioError("must not be empty", field=field)
    return value


def _array(value: object, field: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise InvalidScenarioError(f"must be an array, got {_json_type(value)}", field=field)
    return list(value)


def _time(value: object, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidScenarioError(f"must be a number, got {_json_type(value)}", field=field)
    if not math.isfinite(value):
        raise InvalidScenarioError(f"must be finite, got {value!r}", field=field)
    return float(value)


def _memory(data: object, field: str) -> ScenarioMemory:
    item = _object(data, field, _MEMORY_KEYS, _MEMORY_OPTIONAL)
    cites = tuple(
        _text(cite, f"{field}.cites[{i}]", key=True)
        for i, cite in enumerate(_array(item.get("cites", []), f"{field}.cites"))
    )
    return ScenarioMemory(
        id=_text(item["id"], f"{field}.id", key=True),
        text=_text(item["text"], f"{field}.text"),
        principal=_text(item["principal"], f"{field}.principal", key=True),
        scope=_text(item["scope"], f"{field}.scope", key=True),
        created_at=_time(item.get("created_at"), f"{field}.created_at"),
        cites=cites,
    )


_Dated = TypeVar("_Dated", ScenarioBelief, ScenarioCorrection)


def _dated(kind: type[_Dated], data: object, field: str) -> _Dated:
    """A belief or a correction: ``id``, ``text`` and an optional ``created_at``."""
    item = _object(data, field, _DATED_KEYS, _DATED_OPTIONAL)
    return kind(
        id=_text(item["id"], f"{field}.id", key=True),
        text=_text(item["text"], f"{field}.text"),
        created_at=_time(item.get("created_at"), f"{field}.created_at"),
    )


def _person(data: object, field: str) -> ScenarioPerson:
    item = _object(data, field, _PERSON_KEYS, _PERSON_OPTIONAL)
    beliefs = _array(item.get("beliefs", []), f"{field}.beliefs")
    return ScenarioPerson(
        name=_text(item["name"], f"{field}.name", key=True),
        beliefs=tuple(
            _dated(ScenarioBelief, b, f"{field}.beliefs[{i}]") for i, b in enumerate(beliefs)
        ),
    )


def _grades(data: object) -> dict[str, int]:
    if not isinstance(data, Mapping):
        raise InvalidScenarioError(
            f"must be a JSON object of id to grade, got {_json_type(data)}", field="relevant"
        )
    grades: dict[str, int] = {}
    for item_id, grade in data.items():
        field = f"relevant.{item_id}"
        _text(item_id, field, key=True)
        if isinstance(grade, bool) or not isinstance(grade, int) or grade not in GRADES:
            raise InvalidScenarioError(
                f"grade must be 1 or 2, got {json.dumps(grade, ensure_ascii=False)}", field=field
            )
        grades[item_id] = grade
    return grades


def _state(data: object) -> WorkingState:
    try:
        return WorkingState.from_dict(data)  # type: ignore[arg-type]  # it checks the type
    except (InvalidArgumentError, InvalidArgumentTypeError) as exc:
        raise InvalidScenarioError(str(exc), field="state") from None


def _corpus(data: object) -> ScenarioCorpus:
    top = _object(data, "", _CORPUS_KEYS, _CORPUS_OPTIONAL)
    return ScenarioCorpus(
        id=_text(top["corpus"], "corpus", key=True),
        memories=_memories(top),
        people=_people(top),
    )


def _memories(top: Mapping[str, Any]) -> tuple[ScenarioMemory, ...]:
    return tuple(
        _memory(item, f"memories[{i}]")
        for i, item in enumerate(_array(top.get("memories", []), "memories"))
    )


def _people(top: Mapping[str, Any]) -> tuple[ScenarioPerson, ...]:
    return tuple(
        _person(item, f"people[{i}]")
        for i, item in enumerate(_array(top.get("people", []), "people"))
    )


def _scenario(data: object, corpora: Mapping[str, ScenarioCorpus]) -> Scenario:
    top = _object(data, "", _SCENARIO_KEYS, _SCENARIO_OPTIONAL)
    scenario_id = _text(top["id"], "id", key=True)
    family = _text(top["family"], "family", key=True)
    principal = _text(top["principal"], "principal", key=True)
    scope = _text(top["scope"], "scope", key=True)
    corpus_id: str | None = None
    if "corpus" in top:
        corpus_id = _text(top["corpus"], "corpus", key=True)
        if corpus_id not in corpora:
            raise InvalidScenarioError(
                f"corpus {corpus_id!r} is not defined on an earlier line", field="corpus"
            )
    elif "memories" not in top:
        raise InvalidScenarioError("missing required key(s) 'memories' (or a 'corpus')")
    memories, people = _memories(top), _people(top)
    corrections = tuple(
        _dated(ScenarioCorrection, item, f"corrections[{i}]")
        for i, item in enumerate(_array(top.get("corrections", []), "corrections"))
    )
    own_items = bool(memories or people or corrections)
    if corpus_id is not None:
        corpus = corpora[corpus_id]
        memories = corpus.memories + memories if memories else corpus.memories
        people = corpus.people + people if people else corpus.people
    state = _state(top["state"])
    relevant = _grades(top["relevant"])
    must_not = tuple(
        _text(item, f"must_not[{i}]", key=True)
        for i, item in enumerate(_array(top.get("must_not", []), "must_not"))
    )
    _check_ids(principal, scope, memories, people, relevant, must_not, corrections)
    return Scenario(
        id=scenario_id,
        family=family,
        principal=principal,
        scope=scope,
        memories=memories,
        state=state,
        relevant=relevant,
        people=people,
        must_not=must_not,
        corpus=corpus_id,
        own_items=own_items or corpus_id is None,
        corrections=corrections,
    )


def _check_ids(
    principal: str,
    scope: str,
    memories: tuple[ScenarioMemory, ...],
    people: tuple[ScenarioPerson, ...],
    relevant: Mapping[str, int],
    must_not: tuple[str, ...],
    corrections: tuple[ScenarioCorrection, ...] = (),
) -> None:
    """Ids name one item each (corrections included); relevance and prohibitions name
    memories or beliefs the scenario has."""
    owners: dict[str, str] = {}

    def claim(item_id: str, owner: str) -> None:
        if item_id in owners:
            raise InvalidScenarioError(
                f"id {item_id!r} is already used by {owners[item_id]}", field=f"{owner}.id"
            )
        owners[item_id] = owner

    foreign: set[str] = set()
    for index, memory in enumerate(memories):
        claim(memory.id, f"memories[{index}]")
        if (memory.principal, memory.scope) != (principal, scope):
            foreign.add(memory.id)
    names: dict[str, int] = {}
    for p_index, person in enumerate(people):
        key = " ".join(person.name.casefold().split())
        if key in names:
            raise InvalidScenarioError(
                f"person {person.name!r} is already listed as people[{names[key]}]",
                field=f"people[{p_index}].name",
            )
        names[key] = p_index
        for b_index, belief in enumerate(person.beliefs):
            claim(belief.id, f"people[{p_index}].beliefs[{b_index}]")
    gradable = dict(owners)
    for index, correction in enumerate(corrections):
        claim(correction.id, f"corrections[{index}]")
    for item_id in relevant:
        field = f"relevant.{item_id}"
        if item_id not in gradable:
            raise InvalidScenarioError(f"no memory or belief has id {item_id!r}", field=field)
        if item_id in foreign:
            raise InvalidScenarioError(
                f"{item_id!r} belongs to another principal or scope and can never be retrieved",
                field=field,
            )
    for index, item_id in enumerate(must_not):
        field = f"must_not[{index}]"
        if item_id not in gradable:
            raise InvalidScenarioError(f"no memory or belief has id {item_id!r}", field=field)
        if item_id in relevant:
            raise InvalidScenarioError(f"{item_id!r} is also graded relevant", field=field)
