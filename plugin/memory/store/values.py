"""What the store holds and hands back, and how every value is checked at its boundary.

Write values are validated here (:class:`InvalidMemoryError` names the field); read arguments
are checked by :func:`check_limit` and :func:`visible`, which never let a malformed principal
or scope reach SQL.
"""

from __future__ import annotations

import math
import numbers
import unicodedata
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, Literal

import attrs

from ...control import validate
from ..safe_text import reads_as_itself
from ..terms import remove_lone_surrogates
from .errors import InvalidMemoryError

__all__ = [
    "Arm",
    "Evidence",
    "EvidenceKind",
    "MAX_LIMIT",
    "MAX_MEMORY_ID_BYTES",
    "MAX_MEMORY_TEXT_BYTES",
    "MemoryRecord",
    "MemoryWrite",
    "Person",
    "check_memory_id",
    "check_memory_text",
    "check_ids",
    "check_key",
    "check_count",
    "check_limit",
    "check_text",
    "check_time",
    "encodable",
    "person_key",
    "visible",
]

EvidenceKind = Literal["memory", "belief", "source", "correction"]
#: Which read produced a piece of evidence.
Arm = Literal["sparse", "semantic", "recent", "lookup", "belief", "correction", "source"]


EVIDENCE_KINDS: frozenset[str] = frozenset(EvidenceKind.__args__)  # type: ignore[attr-defined]


def _plain(value: object) -> object:
    """A ``str`` of any subclass (``numpy.str_``, a str enum) as the exact ``str`` of its
    characters, so a comparison or a render reads the characters, never a subclass's methods;
    anything else unchanged (its field's validator names it)."""
    return str.__str__(value) if isinstance(value, str) and type(value) is not str else value


def _plain_owner(value: object) -> object:
    return None if value is None else _plain(value)


def _real(value: object) -> object:
    """Any real number but a bool (``numpy.float32``, ``Decimal`` included) as a ``float``;
    anything else, or a number no float holds (``10**400``), unchanged (its field's validator
    names it)."""
    if type(value) is float or isinstance(value, bool) or not isinstance(
            value, (numbers.Real, Decimal)):
        return value
    try:
        return float(value)
    except (OverflowError, ValueError):  # too large, or a signalling Decimal NaN
        return value


def _plain_ids(value: object) -> object:
    """An iterable of ids (a list, a generator) as a tuple of exact ``str``; a bare string or
    bytes, or anything not iterable, unchanged (the validator names it)."""
    if type(value) is tuple and all(type(item) is str for item in value):
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return value
    return tuple(_plain(item) for item in value)


def _evidence_str(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"Evidence.{attribute.name} must be a str, got {type(value).__name__}")


def _evidence_owner(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(
            f"Evidence.{attribute.name} must be a str or None, got {type(value).__name__}"
        )


def _evidence_number(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is float:
        if not math.isfinite(value):  # a cosine against a zero vector, say: no rank, no time
            raise ValueError(f"Evidence.{attribute.name} must be finite, got {value!r}")
        return
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Decimal)):
        raise TypeError(
            f"Evidence.{attribute.name} must be a real number, got {type(value).__name__}"
        )
    # A number the converter could not make a float: too large for one.
    raise ValueError(f"Evidence.{attribute.name} must be a number a float can hold, got "
                     f"{type(value).__name__} out of range")


def _evidence_ids(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not tuple or not all(type(item) is str for item in value):
        raise TypeError(f"Evidence.{attribute.name} must be an iterable of str ids (not a "
                        f"str), got {type(value).__name__}")


def _evidence_kind(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or value not in EVIDENCE_KINDS:
        raise ValueError(f"Evidence.kind must be one of {sorted(EVIDENCE_KINDS)}, got {value!r}")


@attrs.frozen(kw_only=True)
class Evidence:
    """One retrieved item. ``Evidence(id=..., text=...)`` is enough; the rest has defaults.

    ``score`` is higher-is-better within its ``arm`` only (sparse: minus the bm25 rank;
    semantic: cosine similarity; recent, lookup, belief, correction, source: ``created_at``).
    ``arm`` may be any name, a backend's own included. ``principal`` and ``scope`` default to
    None, which the hooks read as the run's own; evidence naming another principal or scope is
    dropped before rendering. ``cites`` are the ids of the sources a memory cites.

    What a backend hands over is taken as it is meant: any real number but a bool
    (``numpy.float32``, ``Decimal`` included) is kept as a ``float``, any string (``numpy.str_``,
    a str enum; ``kind`` too) as the exact ``str`` of its characters, any iterable of ids (a
    list) as a tuple. A value of another type raises ``TypeError`` naming the field, a number
    no float holds (``10**400``), a NaN or an infinity, or an unknown kind ``ValueError``.
    """

    id: str = attrs.field(converter=_plain, validator=_evidence_str)
    text: str = attrs.field(converter=_plain, validator=_evidence_str)
    kind: EvidenceKind = attrs.field(default="memory", converter=_plain,
                                     validator=_evidence_kind)
    score: float = attrs.field(default=0.0, converter=_real, validator=_evidence_number)
    arm: str = attrs.field(default="retriever", converter=_plain, validator=_evidence_str)
    principal: str | None = attrs.field(default=None, converter=_plain_owner,
                                        validator=_evidence_owner)
    scope: str | None = attrs.field(default=None, converter=_plain_owner,
                                    validator=_evidence_owner)
    created_at: float = attrs.field(default=0.0, converter=_real, validator=_evidence_number)
    cites: tuple[str, ...] = attrs.field(default=(), converter=_plain_ids,
                                         validator=_evidence_ids)


@attrs.frozen(kw_only=True)
class Person:
    """A person known to one principal in one scope."""

    name: str
    principal: str
    scope: str


def encodable(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8 (no lone surrogates), so SQLite can store it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_key(value: object, name: str) -> str:
    """Validate an identifier: a non-empty, UTF-8-encodable ``str``."""
    if not isinstance(value, str):
        raise InvalidMemoryError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise InvalidMemoryError(f"{name} must not be empty")
    if not encodable(value):
        raise InvalidMemoryError(f"{name} must not contain lone surrogates")
    return value


def check_ids(value: object, name: str) -> tuple[str, ...]:
    """Validate an iterable of identifiers (a bare ``str`` is refused, not split)."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidMemoryError(f"{name} must be an iterable of ids (not a str)")
    return tuple(check_key(item, name) for item in value)


def check_text(value: object) -> str:
    """A stored text: a ``str``, with lone surrogates replaced by U+FFFD."""
    if not isinstance(value, str):
        raise InvalidMemoryError(f"text must be a str, got {type(value).__name__}")
    return remove_lone_surrogates(value)


def check_time(value: object) -> float | None:
    """An optional ``created_at``: None or a finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidMemoryError(f"created_at must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise InvalidMemoryError(f"created_at must be finite, got {value!r}")
    return float(value)


#: The most UTF-8 bytes a memory written with ``remember`` may hold.
MAX_MEMORY_TEXT_BYTES = 64 * 1024
#: The most UTF-8 bytes of a memory id given to ``remember`` (the shared rule for ids).
MAX_MEMORY_ID_BYTES = validate.MAX_ID_BYTES


def check_memory_id(value: object, name: str = "id") -> str:
    """A memory id for ``remember``: the shared rule for ids
    (:func:`plugin.control.validate.identifier`: not blank, at most
    :data:`MAX_MEMORY_ID_BYTES` UTF-8 bytes, valid Unicode, no control character or line
    separator) that also reads as itself once rendered
    (:func:`~plugin.memory.safe_text.reads_as_itself`: one no rendering could show is refused
    when it is written); else :class:`InvalidMemoryError`."""
    checked = validate.identifier(
        value, field=name, max_bytes=MAX_MEMORY_ID_BYTES,
        error=InvalidMemoryError, type_error=InvalidMemoryError,
    )
    if not reads_as_itself(checked):
        raise InvalidMemoryError(
            f"{name} must read as itself once rendered: no ']', no space at either end or "
            f"two in a row, no bidi control; got {checked!r}")
    return checked


def check_memory_text(value: object) -> str:
    """A memory's text for ``remember``: the shared rule for bounded text
    (:func:`plugin.control.validate.bounded_text`: not blank, valid Unicode, no NUL, at most
    :data:`MAX_MEMORY_TEXT_BYTES` UTF-8 bytes); else :class:`InvalidMemoryError`. Stored
    exactly as given."""
    return validate.bounded_text(
        value, field="text", max_bytes=MAX_MEMORY_TEXT_BYTES,
        error=InvalidMemoryError, type_error=InvalidMemoryError,
    )


def _validate_owner(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A written memory's principal or scope: the rule every hook holds a run's to
    (:func:`plugin.control.validate.bounded_text`: not blank, valid Unicode, no NUL, at most
    :data:`~plugin.control.validate.MAX_ID_BYTES` UTF-8 bytes), so no memory is written that
    no run could ever recall; else :class:`InvalidMemoryError`."""
    validate.bounded_text(value, field=attribute.name, max_bytes=validate.MAX_ID_BYTES,
                          error=InvalidMemoryError, type_error=InvalidMemoryError)


def _validate_memory_id(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    check_memory_id(value, attribute.name)


def _validate_memory_text(
    _instance: object, _attribute: attrs.Attribute[Any], value: object
) -> None:
    check_memory_text(value)


@attrs.frozen(kw_only=True)
class MemoryWrite:
    """One memory to ``remember``: the input of :meth:`MemoryStore.remember_many`.

    ``id`` None lets the store generate one; an id already held by the same principal and
    scope is replaced. Checked on construction (:class:`InvalidMemoryError` names the field):
    see :func:`check_memory_text` and :func:`check_memory_id`; principal and scope are held to
    the rule every hook holds a run's to (at most 512 UTF-8 bytes, no NUL).
    """

    text: str = attrs.field(validator=_validate_memory_text)
    principal: str = attrs.field(validator=_validate_owner)
    scope: str = attrs.field(validator=_validate_owner)
    id: str | None = attrs.field(default=None,
                                 validator=attrs.validators.optional(_validate_memory_id))

    @classmethod
    def from_dict(cls, data: object) -> MemoryWrite:
        """Build from a JSON object ``{"text", "principal", "scope", "id"?}``; anything else
        (another type, a missing or unknown key) is :class:`InvalidMemoryError`."""
        if not isinstance(data, dict):
            raise InvalidMemoryError(
                f"a memory must be an object with text, principal and scope, "
                f"got {type(data).__name__}"
            )
        unknown = sorted(str(key) for key in data if key not in _WRITE_KEYS)
        if unknown:
            raise InvalidMemoryError(f"unknown key(s): {', '.join(map(repr, unknown))}")
        missing = [key for key in ("text", "principal", "scope") if key not in data]
        if missing:
            raise InvalidMemoryError(f"missing key(s): {', '.join(map(repr, missing))}")
        return cls(
            text=data["text"], principal=data["principal"], scope=data["scope"],
            id=data.get("id"),
        )


_WRITE_KEYS = frozenset(("text", "principal", "scope", "id"))


def _cites(value: object) -> tuple[str, ...]:
    return check_ids(value, "cites")


@attrs.frozen(kw_only=True)
class MemoryRecord:
    """A memory to store: the input of :meth:`MemoryStore.add_memories`.

    Lone surrogates in ``text`` are replaced by U+FFFD; the id must be one
    :meth:`MemoryStore.remember` takes (:func:`check_memory_id`: recall drops an id it could
    not render as itself), principal and scope the ones a run may have; else
    :class:`InvalidMemoryError`. ``created_at`` defaults to the store's clock.
    """

    id: str = attrs.field(validator=_validate_memory_id)
    text: str = attrs.field(converter=check_text)
    principal: str = attrs.field(validator=_validate_owner)
    scope: str = attrs.field(validator=_validate_owner)
    created_at: float | None = attrs.field(default=None, converter=check_time)
    cites: tuple[str, ...] = attrs.field(default=(), converter=_cites)


def person_key(name: str) -> str:
    """How a person's name is matched: NFKC, case-folded, stripped."""
    return unicodedata.normalize("NFKC", remove_lone_surrogates(name)).casefold().strip()


#: The largest ``limit`` or ``page`` a read takes: the largest integer SQLite holds.
MAX_LIMIT = 2**63 - 1


def check_count(value: object, name: str, *, least: int = 0) -> int:
    """A count argument ``name``: an int from ``least`` to :data:`MAX_LIMIT`, else
    ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) \
            or not least <= value <= MAX_LIMIT:
        raise ValueError(f"{name} must be an int from {least} to 2**63 - 1, got {value!r}")
    return value


def check_limit(limit: object) -> int:
    """A read's ``limit``: an int from 0 to :data:`MAX_LIMIT`, else ``ValueError``."""
    return check_count(limit, "limit")


def visible(principal: object, scope: object) -> bool:
    """Whether a trusted principal/scope pair can name any stored row at all."""
    if not isinstance(principal, str):
        raise TypeError(f"principal must be a str, got {type(principal).__name__}")
    if not isinstance(scope, str):
        raise TypeError(f"scope must be a str, got {type(scope).__name__}")
    return encodable(principal) and encodable(scope)
