"""A model's search tool call: its id and arguments, read within bounds and validated.

What the model emits is untrusted text. :meth:`SearchCall.validate` reads it with limits on
size and nesting (before ``json.loads`` can recurse), keeps only a ``query`` with searchable
words and an optional ``scope`` equal to the run's trusted scope, and raises
:class:`InvalidSearchCallError`, never anything else: one bad call never costs the turn.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Mapping

import attrs

from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError, RecallboundError
from plugin.memory.terms import query_terms

MAX_QUERY_BYTES = 4096
"""The longest search-call query accepted (UTF-8 bytes); longer calls are invalid."""

MAX_ARGUMENT_CHARS = 8 * MAX_QUERY_BYTES
"""The longest arguments JSON text read (characters; a query escaped as \\u escapes fits)."""

MAX_ARGUMENT_DEPTH = 4
"""The deepest nesting of arguments JSON text read; a valid call has depth 1."""

MAX_CALL_ID_BYTES = 256
"""The longest call id accepted (UTF-8 bytes)."""

class InvalidSearchCallError(RecallboundError, ValueError):
    """A model's search call is malformed or out of scope (it gets no slot)."""


UNREADABLE_ARGUMENTS = "<arguments that cannot be read>"
"""The identity text of arguments that neither JSON nor ``repr`` can render (nested too deep,
an int too long to print); the hooks reject such a call."""


def canonical_arguments(arguments: Mapping[str, object] | str | None) -> str:
    """The arguments as one comparable text: JSON objects compare by content, not spelling.

    Never raises: arguments JSON cannot hold compare by their ``repr``, or as
    :data:`UNREADABLE_ARGUMENTS` when even that fails (the hooks reject such a call).
    """
    if arguments is None:
        return "{}"
    value: object = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments  # not JSON: the raw text is the identity (the hooks reject it)
    try:
        return json.dumps(_plain(value), sort_keys=True, ensure_ascii=False,
                          separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        return repr(value)
    except (ValueError, RecursionError):
        return UNREADABLE_ARGUMENTS


def _plain(value: object) -> object:
    """``value`` with every mapping a dict and every list or tuple a list (how JSON reads
    them back): a ``MappingProxyType`` or a framework's own mapping compares by content."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def arguments_digest(arguments: Mapping[str, object] | str | None) -> str:
    """Hex SHA-256 of the canonical arguments: the part of a call's identity the ledger keeps."""
    text = canonical_arguments(arguments)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _call_id(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    # The adapter builds the ToolCall (trusted code); what the model chose for the id is
    # checked per call by dispatch, so one bad id never costs the turn.
    if not isinstance(value, str):
        raise InvalidArgumentTypeError(
            f"ToolCall.call_id must be a str, got {type(value).__name__}"
        )


@attrs.frozen(kw_only=True)
class ToolCall:
    """A tool call as the model emitted it: an id and its raw arguments.

    ``call_id`` must be a ``str`` (:class:`~plugin.errors.InvalidArgumentTypeError`); an empty,
    over-long or non-UTF-8 id, one with a NUL character, and anything in ``arguments``, get an
    ``invalid`` result.
    """

    call_id: str = attrs.field(validator=_call_id)
    arguments: Mapping[str, object] | str
    """The arguments as a mapping, or as the JSON text many model APIs deliver."""

    @classmethod
    def with_new_id(cls, arguments: Mapping[str, object] | str, *,
                    prefix: str = "call-") -> ToolCall:
        """A call whose id is made up here: ``prefix`` and a random UUID.

        For a host whose model API gives its calls no id. It is claimed and recorded like
        any call, under that id: the same call sent again (the object, a copy, or a call
        rebuilt with that id, in this process or another) is answered from its record, and
        one interrupted mid-search answers ``in_flight`` (never a second search).
        """
        if not isinstance(prefix, str):
            raise InvalidArgumentTypeError(f"prefix must be a str, got {type(prefix).__name__}")
        call_id = f"{prefix}{uuid.uuid4().hex}"
        try:  # the host's own prefix: a bad one is its error now, not the call's later
            _check_call_id(call_id)
        except InvalidSearchCallError as exc:
            raise InvalidArgumentError(f"prefix makes no valid call id: {exc}") from None
        return cls(call_id=call_id, arguments=arguments)


@attrs.frozen(kw_only=True)
class _OneOffCall(ToolCall):
    """A call under an id made up for one dispatch and then forgotten (see :func:`one_off`)."""


def one_off(arguments: Mapping[str, object] | str, *, prefix: str) -> ToolCall:
    """A call under a fresh id that no one can send again: the MCP server's, for a request
    that names no call id (a client resending the request sends a new call). No claim can
    guard what cannot be repeated, so dispatch writes none for it (one synced commit fewer);
    its outcome is recorded like any call's."""
    return _OneOffCall.with_new_id(arguments, prefix=prefix)


def is_one_off(call: ToolCall) -> bool:
    """Whether ``call`` came from :func:`one_off`."""
    return type(call) is _OneOffCall


def _json_depth(text: str, limit: int) -> int:
    """The nesting depth of JSON ``text`` (brackets outside strings), counted up to ``limit``+1.

    Read before ``json.loads``, whose C scanner recurses once per level and raises
    ``RecursionError`` on deep input.
    """
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif char in "]}":
            depth -= 1
    return deepest


def _check_call_id(call_id: str) -> None:
    if not call_id.strip():
        raise InvalidSearchCallError("the call id is empty")
    if "\x00" in call_id:  # no ledger can keep it whole (PostgreSQL refuses it in text)
        raise InvalidSearchCallError("the call id contains a NUL character")
    try:
        size = len(call_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidSearchCallError("the call id is not valid Unicode text") from None
    if size > MAX_CALL_ID_BYTES:
        raise InvalidSearchCallError(f"the call id is longer than {MAX_CALL_ID_BYTES} bytes")


_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


def shown_name(key: object) -> str:
    """An unknown argument's name as the rejection says it: a plain name (letters, digits,
    ``_``, at most 40) quoted, anything else described, so that what the model wrote never
    reads as recallbound's own words (a bounded notice, a memory line, a section)."""
    if isinstance(key, str) and _PLAIN_NAME.fullmatch(key):
        return repr(key)
    return "a name that is not shown" if isinstance(key, str) else type(key).__name__


def _arguments(raw: object) -> Mapping[object, object]:
    """The arguments as a mapping, read within the size and depth bounds."""
    if isinstance(raw, str):
        if len(raw) > MAX_ARGUMENT_CHARS:
            raise InvalidSearchCallError(
                f"arguments are longer than {MAX_ARGUMENT_CHARS} characters"
            )
        if _json_depth(raw, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
            raise InvalidSearchCallError(f"arguments nest deeper than {MAX_ARGUMENT_DEPTH}")
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            raise InvalidSearchCallError("arguments are not valid JSON") from None
    if not isinstance(raw, Mapping):
        raise InvalidSearchCallError("arguments must be an object with a 'query'")
    if len(raw) > 8:
        raise InvalidSearchCallError("arguments have too many fields")
    return raw


@attrs.frozen(kw_only=True)
class SearchCall:
    """A validated search call."""

    call_id: str
    query: str

    @classmethod
    def validate(cls, call: ToolCall, *, scope: str) -> SearchCall:
        """Check a raw call: a usable id, a ``query`` string with searchable words, an optional
        ``scope`` equal to the run's trusted scope, nothing else, within the size and depth
        bounds. Raises :class:`InvalidSearchCallError`; never anything else.
        """
        try:
            return cls._validate(call, scope)
        except InvalidSearchCallError:
            raise
        except Exception as exc:  # a hostile mapping (raising __iter__, deep __eq__, ...)
            raise InvalidSearchCallError(
                f"arguments could not be read ({type(exc).__name__})"
            ) from None

    @classmethod
    def _validate(cls, call: ToolCall, scope: str) -> SearchCall:
        _check_call_id(call.call_id)
        args = _arguments(call.arguments)
        unknown = [key for key in args if key not in ("query", "scope")]
        if unknown:
            shown = ", ".join(shown_name(key) for key in unknown[:3])
            raise InvalidSearchCallError(f"unknown argument(s): {shown}")
        query = args.get("query")
        if not isinstance(query, str):
            raise InvalidSearchCallError("'query' must be a string")
        if len(query) > MAX_QUERY_BYTES:
            raise InvalidSearchCallError(f"'query' is longer than {MAX_QUERY_BYTES} bytes")
        try:
            size = len(query.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidSearchCallError("'query' is not valid Unicode text") from None
        if size > MAX_QUERY_BYTES:
            raise InvalidSearchCallError(f"'query' is longer than {MAX_QUERY_BYTES} bytes")
        if not query_terms(query):
            raise InvalidSearchCallError("'query' has no searchable words")
        asked = args.get("scope")
        if asked is not None and not (isinstance(asked, str) and asked == scope):
            raise InvalidSearchCallError("'scope' is outside this run's scope")
        return cls(call_id=call.call_id, query=query)
