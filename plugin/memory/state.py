"""The agent's working state: the planner's only input.

Values are frozen and validated when built, so a malformed state fails here, naming the field,
rather than later inside a search. Sequences are stored as tuples. ``__init__`` takes typed
values only (``Task``/``Fact`` instances, sequences of ``str``); JSON-like data goes through
:meth:`WorkingState.from_dict`.

Text rules: any ``str`` is accepted, including NUL characters and very large strings (the
composer bounds what it uses), except text that cannot be encoded as UTF-8 (a lone surrogate),
which raises :class:`~plugin.errors.InvalidArgumentError`: such text could not be hashed,
stored or searched later. A ``str`` subclass is stored as the plain text it holds, so what
the composer asks of a text (its size, its stripped form) is answered by ``str`` itself. A
``str`` where a sequence of strings is expected is a type error, never split into characters.
Sets and other unordered or one-shot iterables are refused too: the planner's output must not
depend on iteration order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import attrs

from plugin.control.validate import plain
from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError

_NOT_SEQUENCES = (str, bytes, bytearray, memoryview)


def _check_text(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise InvalidArgumentTypeError(f"{name} must be str, got {type(value).__name__}")
    if not str.isascii(value):  # str's own methods: a subclass's may say anything
        try:
            str.encode(value, "utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(
                f"{name} is not valid Unicode text: lone surrogate at index {exc.start}"
            ) from None


def _exact(value: Any) -> Any:
    """A ``str`` subclass becomes the plain text it holds (``str.__str__`` copies it without
    calling the subclass's methods): what the composer later asks of a text (its size, its
    stripped form) is then answered by ``str`` itself. Anything else is left as it is."""
    return plain(value) if isinstance(value, str) else value


def _to_tuple(value: Any) -> Any:
    """Sequences become tuples (of plain ``str`` where they hold text, see :func:`_exact`);
    anything else is left for the validator to reject by type."""
    if isinstance(value, Sequence) and not isinstance(value, _NOT_SEQUENCES):
        return tuple(_exact(item) for item in value)
    return value


def _tasks(value: Sequence[Task]) -> tuple[Task, ...]:
    return cast("tuple[Task, ...]", _to_tuple(value))


def _facts(value: Sequence[Fact]) -> tuple[Fact, ...]:
    return cast("tuple[Fact, ...]", _to_tuple(value))


def _strs(value: Sequence[str]) -> tuple[str, ...]:
    return cast("tuple[str, ...]", _to_tuple(value))


def _check_tuple(name: str, value: object, item: type[Any], item_name: str) -> None:
    if not isinstance(value, tuple):
        raise InvalidArgumentTypeError(
            f"{name} must be a sequence of {item_name}, got {type(value).__name__}"
        )
    for index, element in enumerate(value):
        if item is str:
            _check_text(f"{name}[{index}]", element)
        elif not isinstance(element, item):
            raise InvalidArgumentTypeError(
                f"{name}[{index}] must be {item_name}, got {type(element).__name__}"
            )


def _text(owner: str) -> Any:
    def validate(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
        _check_text(f"{owner}.{attribute.name}", value)

    return validate


def _tuple_of(owner: str, item: type[Any]) -> Any:
    def validate(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        _check_tuple(f"{owner}.{attribute.name}", value, item, item.__name__)

    return validate


def _check_bool(instance: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidArgumentTypeError(
            f"Task.{attribute.name} must be bool, got {type(value).__name__}"
        )


@attrs.frozen
class Task:
    """One task of the agent's plan; ``done`` tasks are never used for recall."""

    text: str = attrs.field(converter=_exact, validator=_text("Task"))
    done: bool = attrs.field(default=False, validator=_check_bool)


@attrs.frozen
class Fact:
    """An established fact; only its ``entities`` (names) reach a query, never its text."""

    text: str = attrs.field(converter=_exact, validator=_text("Fact"))
    entities: tuple[str, ...] = attrs.field(
        default=(), converter=_strs, validator=_tuple_of("Fact", str)
    )


@attrs.frozen
class WorkingState:
    """What the agent is doing: the request, its plan and what it knows.

    Raises :class:`~plugin.errors.InvalidArgumentTypeError` (a ``TypeError``) for a field of
    the wrong type and :class:`~plugin.errors.InvalidArgumentError` (a ``ValueError``) for
    text that is not valid Unicode; the message names the field (``WorkingState.tasks[3]``).
    """

    current_request: str = attrs.field(converter=_exact, validator=_text("WorkingState"))
    objective: str = attrs.field(default="", converter=_exact, validator=_text("WorkingState"))
    next_action: str = attrs.field(default="", converter=_exact, validator=_text("WorkingState"))
    tasks: tuple[Task, ...] = attrs.field(
        default=(), converter=_tasks, validator=_tuple_of("WorkingState", Task)
    )
    open_questions: tuple[str, ...] = attrs.field(
        default=(), converter=_strs, validator=_tuple_of("WorkingState", str)
    )
    constraints: tuple[str, ...] = attrs.field(
        default=(), converter=_strs, validator=_tuple_of("WorkingState", str)
    )
    facts: tuple[Fact, ...] = attrs.field(
        default=(), converter=_facts, validator=_tuple_of("WorkingState", Fact)
    )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkingState:
        """Build a state from JSON-like data (the evaluator's ``"state"`` object).

        ``current_request`` is required; ``tasks`` are ``{"text", "done"}`` objects (``done``
        optional) and ``facts`` are ``{"text", "entities"}`` objects (``entities`` optional).
        Unknown or missing keys raise :class:`~plugin.errors.InvalidArgumentError`; ``null``
        for a field is a type error, not a default. Errors name the path
        (``WorkingState.tasks[2].done``).
        """
        _check_keys("WorkingState", data, required=("current_request",), optional=_STATE_KEYS)
        kwargs: dict[str, Any] = {}
        for key in ("current_request", "objective", "next_action"):
            if key in data:
                _check_text(f"WorkingState.{key}", data[key])
                kwargs[key] = data[key]
        for key in ("open_questions", "constraints"):
            if key in data:
                kwargs[key] = _strings(f"WorkingState.{key}", data[key])
        if "tasks" in data:
            kwargs["tasks"] = tuple(
                _task(f"WorkingState.tasks[{i}]", item)
                for i, item in enumerate(_items("WorkingState.tasks", data["tasks"], "object"))
            )
        if "facts" in data:
            kwargs["facts"] = tuple(
                _fact(f"WorkingState.facts[{i}]", item)
                for i, item in enumerate(_items("WorkingState.facts", data["facts"], "object"))
            )
        return cls(**kwargs)


_STATE_KEYS = (
    "current_request",
    "objective",
    "next_action",
    "tasks",
    "open_questions",
    "constraints",
    "facts",
)


def _check_keys(
    name: str, data: object, *, required: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    if not isinstance(data, Mapping):
        raise InvalidArgumentTypeError(
            f"{name} must be a mapping (JSON object), got {type(data).__name__}"
        )
    unknown = sorted(repr(key) for key in data if key not in optional)
    if unknown:
        raise InvalidArgumentError(
            f"{name} has unknown key(s) {', '.join(unknown)}; expected some of "
            f"{', '.join(optional)}"
        )
    missing = [key for key in required if key not in data]
    if missing:
        raise InvalidArgumentError(f"{name} is missing required key(s) {', '.join(missing)}")


def _items(name: str, value: object, item_name: str) -> tuple[Any, ...]:
    if not isinstance(value, Sequence) or isinstance(value, _NOT_SEQUENCES):
        raise InvalidArgumentTypeError(
            f"{name} must be a list of {item_name}, got {type(value).__name__}"
        )
    return tuple(value)


def _strings(name: str, value: object) -> tuple[str, ...]:
    items = _items(name, value, "str")
    for index, item in enumerate(items):
        _check_text(f"{name}[{index}]", item)
    return items


def _task(name: str, item: object) -> Task:
    _check_keys(name, item, required=("text",), optional=("text", "done"))
    assert isinstance(item, Mapping)
    _check_text(f"{name}.text", item["text"])
    done = item.get("done", False)
    if not isinstance(done, bool):
        raise InvalidArgumentTypeError(f"{name}.done must be bool, got {type(done).__name__}")
    return Task(item["text"], done)


def _fact(name: str, item: object) -> Fact:
    _check_keys(name, item, required=("text",), optional=("text", "entities"))
    assert isinstance(item, Mapping)
    _check_text(f"{name}.text", item["text"])
    entities = _strings(f"{name}.entities", item.get("entities", ()))
    return Fact(item["text"], entities)
