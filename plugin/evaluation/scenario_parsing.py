"""Parsing one scenario line: every value checked for its JSON type, its range and its
coherence, an error naming the field (``memories[2].principal``)."""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from plugin import strict_json
from plugin.control import validate
from plugin.control.dsn_text import visible
from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError
from plugin.memory.state import WorkingState
from plugin.memory.store.errors import InvalidMemoryError
from plugin.memory.store.values import check_memory_id

from .scenario_values import (
    GRADES,
    InvalidScenarioError,
    Scenario,
    ScenarioBelief,
    ScenarioCorpus,
    ScenarioCorrection,
    ScenarioMemory,
    ScenarioPerson,
)

__all__ = ["corpus_of", "decode", "scenario_of"]

# -- parsing --------------------------------------------------------------------------------------

ALL = "all"
"""The family name of the whole file in the reports (no scenario may use it)."""

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


def _decode(raw: str | bytes | bytearray) -> object:
    try:
        return strict_json.decode(raw)
    except strict_json.StrictJsonError as exc:
        raise InvalidScenarioError(exc.reason) from None


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
    if key:  # an id, a name or a family: printed in reports, on one line
        try:
            validate.identifier(value, field=field)
        except ValueError as exc:
            raise InvalidScenarioError(str(exc).removeprefix(f"{field} "), field=field) from None
    return value


def _reads_as(text: str) -> str:
    """What ``text`` looks like in a report: compatibility forms folded, case folded, and no
    white space or invisible character around or inside it."""
    return "".join(visible(unicodedata.normalize("NFKC", text)).split()).casefold()


def _array(value: object, field: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise InvalidScenarioError(f"must be an array, got {_json_type(value)}", field=field)
    return list(value)


def _time(value: object, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidScenarioError(f"must be a number, got {_json_type(value)}", field=field)
    try:
        number = float(value)  # an int past a float's range overflows
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise InvalidScenarioError(f"must be a finite number, got {str(value)[:40]}",
                                   field=field)
    return number


def _memory(data: object, field: str) -> ScenarioMemory:
    item = _object(data, field, _MEMORY_KEYS, _MEMORY_OPTIONAL)
    cites = tuple(
        _text(cite, f"{field}.cites[{i}]", key=True)
        for i, cite in enumerate(_array(item.get("cites", []), f"{field}.cites"))
    )
    memory_id = _text(item["id"], f"{field}.id", key=True)
    try:  # an id recall would drop (it could not be rendered as itself) is never scored
        check_memory_id(memory_id, "id")
    except InvalidMemoryError as exc:
        raise InvalidScenarioError(str(exc), field=f"{field}.id") from None
    return ScenarioMemory(
        id=memory_id,
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
    corpus = ScenarioCorpus(
        id=_text(top["corpus"], "corpus", key=True),
        memories=_memories(top),
        people=_people(top),
    )
    _check_ids("", "", corpus.memories, corpus.people, {}, ())  # on its own line, once
    return corpus


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
    if _reads_as(family) == ALL:  # "all ", "ALL", "all" with a no-break space: all read "all"
        raise InvalidScenarioError(f"{ALL!r} names the whole file in the reports; give the "
                                   f"scenario's own family", field="family")
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
    shared: tuple[str, int, int] | None = None
    if corpus_id is not None:
        corpus = corpora[corpus_id]
        shared = (corpus_id, len(corpus.memories), len(corpus.people))
        memories = corpus.memories + memories if memories else corpus.memories
        people = corpus.people + people if people else corpus.people
    state = _state(top["state"])
    relevant = _grades(top["relevant"])
    must_not = tuple(
        _text(item, f"must_not[{i}]", key=True)
        for i, item in enumerate(_array(top.get("must_not", []), "must_not"))
    )
    _check_ids(principal, scope, memories, people, relevant, must_not, corrections,
               corpus=shared)
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
    *,
    corpus: tuple[str, int, int] | None = None,
) -> None:
    """Ids name one item each (corrections included); relevance names memories or beliefs the
    scenario has. A prohibition may name an id the scenario lacks (it can never be shown, so
    it never counts as harm), but not a correction's.

    ``corpus`` is ``(id, memories, people)`` when the first memories and people are a
    corpus's (checked on its own line already): an error then names the scenario's own
    field, by its index on this line, and the corpus item it clashes with."""
    shared, shared_memories, shared_people = corpus or ("", 0, 0)

    def label(kind: str, index: int, first: int, tail: str = "") -> str:
        return (f"{kind}[{index}]{tail} of corpus {shared!r}" if index < first
                else f"{kind}[{index - first}]{tail}")

    owners: dict[str, str] = {}

    def claim(item_id: str, owner: str) -> None:
        if item_id in owners:
            first, second = owners[item_id], owner
            if " of corpus " in second:  # the error names the field on this line
                first, second = second, first
            raise InvalidScenarioError(f"id {item_id!r} is already used by {first}",
                                       field=f"{second}.id")
        owners[item_id] = owner

    foreign: set[str] = set()
    for index, memory in enumerate(memories):
        claim(memory.id, label("memories", index, shared_memories))
        if (memory.principal, memory.scope) != (principal, scope):
            foreign.add(memory.id)
    names: dict[str, str] = {}
    for p_index, person in enumerate(people):
        key = " ".join(person.name.casefold().split())
        listed = label("people", p_index, shared_people)
        if key in names:
            raise InvalidScenarioError(
                f"person {person.name!r} is already listed as {names[key]}",
                field=f"{listed}.name",
            )
        names[key] = listed
        for b_index, belief in enumerate(person.beliefs):
            claim(belief.id, label("people", p_index, shared_people, f".beliefs[{b_index}]"))
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
        if item_id in owners and item_id not in gradable:  # a correction: never ranked
            raise InvalidScenarioError(f"no memory or belief has id {item_id!r}", field=field)
        if item_id in relevant:
            raise InvalidScenarioError(f"{item_id!r} is also graded relevant", field=field)


corpus_of = _corpus
"""A corpus line's value, checked."""
scenario_of: Callable[[object, Mapping[str, ScenarioCorpus]], Scenario] = _scenario
"""A scenario line's value, checked and resolved against the corpora defined so far."""
decode = _decode
"""One line's JSON (duplicate keys and non-finite constants refused)."""
