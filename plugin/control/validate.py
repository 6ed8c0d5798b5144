"""The shared validators: each rule about a plain value is written here, once.

Every function takes the value and the ``field`` it came from, returns the value (normalised
where said) and raises the package's misuse errors naming that field:
:class:`~plugin.errors.InvalidArgumentTypeError` for a wrong type,
:class:`~plugin.errors.InvalidArgumentError` for a value out of range. A caller that reports
bad values differently (configuration raises :class:`~plugin.errors.ConfigError`) passes its
own ``error`` and ``type_error`` classes. Bounds are checked before any per-character work, so
a hostile 100 MB string costs one ``len()``.

Imports only the standard library and :mod:`plugin.errors`: the control package stands alone.
"""

from __future__ import annotations

import math
import unicodedata

from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = [
    "MAX_ID_BYTES",
    "MAX_RUN_ID_BYTES",
    "bounded_text",
    "first_bad_character",
    "identifier",
    "is_identifier",
    "is_storable",
    "plain",
    "run_id",
    "seconds",
    "storable",
]

MAX_ID_BYTES = 512
"""The longest id (evidence id, scope, principal) in UTF-8 bytes."""
MAX_RUN_ID_BYTES = 512
"""The longest run id in UTF-8 bytes."""

ErrorClass = type[Exception]

# Characters that have no place in an id: C0 and C1 controls (NUL, newline, escape, ...),
# lone surrogates, and the Unicode line and paragraph separators. An id is shown to operators
# and, inert, to a model; none of these can be shown as itself.
_BAD_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})


def first_bad_character(text: str) -> str | None:
    """Return the first character of ``text`` that an id must not contain, or ``None``."""
    if text.isprintable():
        # The fast path: isprintable() is false for every character in _BAD_CATEGORIES.
        return None
    for char in text:
        if unicodedata.category(char) in _BAD_CATEGORIES:
            return char
    return None


def _describe(char: str) -> str:
    return f"U+{ord(char):04X}"


def finite(value: float) -> bool:
    """:func:`math.isfinite`, and False (never ``OverflowError``) for an int past a float's
    range: such a value is not a number of seconds."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def number_text(value: object) -> str:
    """``value`` for an error message: an int too large to show is described, not printed
    (its decimal text can be longer than Python converts)."""
    if isinstance(value, int) and not finite(value):
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def seconds(
    value: object,
    *,
    field: str,
    maximum: float | None = None,
    allow_zero: bool = False,
    error: ErrorClass = InvalidArgumentError,
    type_error: ErrorClass = InvalidArgumentTypeError,
) -> float:
    """Return ``value`` as a float: a finite number of seconds, > 0 (>= 0 with ``allow_zero``),
    and at most ``maximum`` when one is given. ``bool`` is not a number here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise type_error(f"{field} must be a number of seconds, got {type(value).__name__}")
    low_ok = value >= 0 if allow_zero else value > 0
    if not (finite(value) and low_ok):
        bound = ">= 0" if allow_zero else "> 0"
        raise error(f"{field} must be finite and {bound} seconds, got {number_text(value)}")
    number = float(value)
    if maximum is not None and number > maximum:
        raise error(f"{field} must be at most {maximum} seconds, got {value!r}")
    return number


def _encoded_size(
    value: str, *, field: str, max_bytes: int, error: ErrorClass
) -> int:
    # Every character is at least one UTF-8 byte: a string longer than the cap in characters is
    # refused before it is encoded (a 100 MB id costs nothing).
    if len(value) > max_bytes:
        raise error(f"{field} must be at most {max_bytes} UTF-8 bytes, got {len(value)} characters")
    size = len(_utf8(value, field=field, error=error))
    if size > max_bytes:
        raise error(f"{field} must be at most {max_bytes} UTF-8 bytes, got {size}")
    return size


def _utf8(value: str, *, field: str, error: ErrorClass) -> bytes:
    """``value`` as UTF-8, else ``error`` naming ``field`` and its first lone surrogate."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(
            f"{field} is not valid Unicode text (a lone surrogate at position {exc.start})"
        ) from None


def storable(value: str, *, field: str, error: ErrorClass = InvalidArgumentError) -> str:
    """Return ``value`` (a ``str``) if every ledger can store it as given: valid Unicode (no
    lone surrogate, which is not UTF-8) and no NUL (which PostgreSQL's text cannot hold)."""
    _utf8(value, field=field, error=error)
    if "\x00" in value:
        raise error(f"{field} must not contain a NUL character")
    return value


def is_storable(value: str) -> bool:
    """Whether every ledger can store ``value`` (:func:`storable`)."""
    try:
        storable(value, field="text")
    except InvalidArgumentError:
        return False
    return True


def plain(value: str) -> str:
    """``value`` as a plain ``str``: a subclass's text is copied by ``str.__str__``, which calls
    none of its methods, so what is checked and compared later (a principal against an item's,
    say) is ``str``'s own answer, never a subclass's ``__eq__``."""
    return value if type(value) is str else str.__str__(value)


def bounded_text(
    value: object,
    *,
    field: str,
    max_bytes: int,
    error: ErrorClass = InvalidArgumentError,
    type_error: ErrorClass = InvalidArgumentTypeError,
) -> str:
    """Return ``value``: a ``str`` that is not blank, valid Unicode, and at most ``max_bytes``
    UTF-8 bytes. Newlines and tabs are allowed (this is text, not an id). A ``str`` subclass
    is returned as the plain text it holds (:func:`plain`)."""
    if not isinstance(value, str):
        raise type_error(f"{field} must be a str, got {type(value).__name__}")
    value = plain(value)
    _encoded_size(value, field=field, max_bytes=max_bytes, error=error)
    if "\x00" in value:
        raise error(f"{field} must not contain a NUL character")
    if not value.strip():
        raise error(f"{field} must not be empty or blank")
    return value


def identifier(
    value: object,
    *,
    field: str,
    max_bytes: int = MAX_ID_BYTES,
    error: ErrorClass = InvalidArgumentError,
    type_error: ErrorClass = InvalidArgumentTypeError,
) -> str:
    """Return ``value``: an id. A ``str`` that is not blank, at most ``max_bytes`` UTF-8 bytes,
    valid Unicode (no lone surrogate), with no control character (NUL, newline, escape, C1)
    and no line or paragraph separator. Every ledger can store it and every output can print
    it on one line. A ``str`` subclass is returned as the plain text it holds (:func:`plain`)."""
    if not isinstance(value, str):
        raise type_error(f"{field} must be a str, got {type(value).__name__}")
    value = plain(value)
    _encoded_size(value, field=field, max_bytes=max_bytes, error=error)
    bad = first_bad_character(value)
    if bad is not None:
        raise error(f"{field} must not contain control characters, found {_describe(bad)}")
    if not value.strip():
        raise error(f"{field} must not be empty or blank")
    return value


def is_identifier(value: str, *, field: str = "id") -> bool:
    """Whether ``value`` (a ``str``) is an id by :func:`identifier`'s rule, for the places that
    drop a bad id and count it rather than fail."""
    try:
        identifier(value, field=field)
    except ValueError:
        return False
    return True


def run_id(
    value: object,
    *,
    field: str = "run_id",
    error: ErrorClass = InvalidArgumentError,
    type_error: ErrorClass = InvalidArgumentError,
) -> str:
    """Return ``value`` if it is a valid run id: a ``str`` that is not blank, valid Unicode,
    at most :data:`MAX_RUN_ID_BYTES` UTF-8 bytes, with no NUL. Other control characters are
    stored (a host chooses its run ids; every output escapes them). A run id of the wrong type
    is an invalid run id too (:class:`~plugin.errors.InvalidArgumentError`, a ``ValueError``)."""
    if not isinstance(value, str):
        raise type_error(f"{field} must be a str, got {type(value).__name__}")
    _encoded_size(value, field=field, max_bytes=MAX_RUN_ID_BYTES, error=error)
    if "\x00" in value:
        raise error(f"{field} must not contain a NUL character")
    if not value.strip():
        raise error(f"{field} must not be empty or blank")
    return value
