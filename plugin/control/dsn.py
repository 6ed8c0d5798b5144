"""Ledger locations: which database a string names, and the one redaction of its password.

A location is one of:

- a PostgreSQL URI, ``postgresql://`` or ``postgres://`` (its query may carry ``schema=NAME``,
  recallbound's own parameter, taken out before the DSN reaches libpq);
- a libpq key=value connection string, ``host=db.internal dbname=fleet user=app`` (parsed by
  psycopg's own parser, so it needs the ``postgres`` extra; it has no ``schema`` keyword, the
  ledger's schema is then the default ``recallbound``);
- anything else is a SQLite file path (or a ``file:`` URI, or ``:memory:``).

A value that looks like a connection string (a ``scheme://``, a leading ``word=``, a libpq
keyword such as ``host=`` or ``dbname=`` as a word anywhere in it, or a URI that lost its
scheme: ``user:password@host/db``) and cannot be used as one is
a :class:`~plugin.errors.LedgerConfigError`, never a SQLite file name: a worker that silently
opened a file of its own would grant a fleet's run its allowance again. To name a SQLite file
whose name holds such a word, start it with ``./`` (or give it as an absolute path).

:func:`redact` is the one redaction every output uses (``config show``, the ledger CLI, logs,
error messages): a password never appears, in any form.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any, Literal

import attrs

from plugin.errors import LedgerConfigError

from .dsn_schema import FOREIGN_DSN, SCHEMELESS_URI, URI_START, USERINFO, at_in_path, query_mark
from .dsn_schema import SCHEMA_PARAMETER as SCHEMA_PARAMETER
from .dsn_schema import check_schema as check_schema
from .dsn_schema import split_schema as split_schema
from .dsn_text import (
    SECRET_NAME,
    doubled_at,
    hide_userinfo_ats,
    invisible,
    is_secret,
    names_keyword,
    pasted_password,
    replace_literals,
    secret_inside,
    visible,
)

__all__ = ["LedgerLocation", "POSTGRES_SCHEMES", "SCHEMA_PARAMETER", "is_connection_string",
           "parse_location", "redact"]

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
"""The schemes of a PostgreSQL URI (libpq's two)."""

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_KEYWORD = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*=")

# libpq's white space (C ``isspace``): a Unicode space is an ordinary character to it.
_SPACE = " \t\n\r\f\v"
_QUOTES = "'\"`\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u00ab\u00bb\u2039\u203a"


def _wrapper(char: str) -> bool:
    """A quote, white space, or an invisible character (:func:`invisible`: a BOM, a zero-width
    space, a direction mark, a Hangul filler...): what a connection string is pasted inside,
    or after."""
    return char in _QUOTES or char in _SPACE or invisible(char)


# A password inside a longer text (a message that quotes a location): a URI's userinfo
# (``//user:secret@``), a secret keyword (``password=``, ``sslpassword=``, ...) or query
# parameter, its value quoted or not, read as libpq reads a key=value value (a backslash
# escapes the next character, only white space ends it: ``#`` and ``&`` belong to the value);
# a URI's password may end in white space before its ``@``, which libpq reads.
_URI_PASSWORD = re.compile(r"(:/+[^:/@ \t\n\r\f\v]*:)[^ \t\n\r\f\v]*?[ \t\n\r\f\v]*@")
"""A URI's ``user:secret@`` (one slash, or three: a path keeps one of ``postgresql://``)."""
_KEYWORD_PASSWORD = re.compile(
    r"(?is)(\b" + SECRET_NAME + r"[ \t\n\r\f\v]*=[ \t\n\r\f\v]*)"
    r"('(?:[^'\\]|\\.)*'?|(?:\\.|[^ \t\n\r\f\v])*)")
_QUOTED = re.compile(r'"[^"]*"')
_SECRET_ENV = "PGPASSWORD"
_HIDDEN = "***"


@attrs.frozen(kw_only=True)
class LedgerLocation:
    """A parsed ledger location: a SQLite ``path``, or a PostgreSQL ``dsn`` (+ ``schema``)."""

    kind: Literal["sqlite", "postgres"]
    target: str = attrs.field(repr=lambda target: repr(redact(target)))
    """The SQLite path, or the DSN for libpq (the ``schema`` parameter taken out); its
    ``repr`` hides the password."""
    schema: str | None = None


def _keywords(text: str) -> bool:
    """Whether ``text`` is meant as a libpq key=value string (see the module doc)."""
    return _KEYWORD.match(text) is not None or names_keyword(text)


def _form(text: str) -> str:
    """What an unusable location is, for an error, without its text (it may hold a password)."""
    scheme = _SCHEME.match(text.strip())
    if _URI.match(text.strip()) and scheme is not None and not _keywords(text):
        return f"a {scheme.group(0)} URI"  # a whole scheme, then whatever it cannot use
    if SCHEMELESS_URI.match(text):
        return "a URI without its scheme"
    if scheme is not None and not _keywords(text):
        return f"a {scheme.group(0)} URI"
    return "a key=value string"


def conninfo_dict(dsn: str) -> dict[str, Any]:
    """psycopg's own parser; without the ``postgres`` extra a connection string is an error,
    and so is a URI with an ``@`` in its host or path (:func:`doubled_at`, :func:`at_in_path`)."""
    if "\x00" in dsn:  # libpq reads up to the first NUL: the rest would be another DSN
        raise LedgerConfigError(f"the ledger ({_form(dsn)}) holds a NUL character")
    if URI_START.match(dsn) and (doubled_at(dsn) or at_in_path(dsn)):
        raise LedgerConfigError(
            f"the ledger ({_form(dsn)}) holds an '@' in its host or database name: write "
            f"postgresql://user:password@host/dbname, each '@' in a part as %40, '/' as %2F")
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise LedgerConfigError(
            f"the ledger ({_form(dsn)}) is a PostgreSQL connection string, which needs the "
            f"postgres extra (pip install 'recallbound[postgres]')") from None
    try:
        params = conninfo_to_dict(dsn)
    except Exception as exc:  # psycopg.ProgrammingError: libpq could not parse it
        # libpq quotes the fragment it stumbled on, which may be a password: never shown.
        message = _QUOTED.sub('"..."', " ".join(str(exc).split()))
    else:
        if not secret_inside(params):
            return params
        message = ("libpq reads a password keyword inside another value (with no '/' "
                   "before a URI's '?', its query is read as the user name and host)")
    # Raised outside the handler: libpq's own error (the password in it) is not its context.
    raise LedgerConfigError(
        f"the ledger ({_form(dsn)}) looks like a PostgreSQL connection string but cannot be "
        f"used as one: {redact(message)}")


def parse_location(location: str | os.PathLike[str]) -> LedgerLocation:
    """Which ledger ``location`` names (see the module doc).

    Raises :class:`~plugin.errors.LedgerConfigError` (a ``ConfigError``) for a value that looks
    like a connection string and cannot be used as one; its message never holds a password.
    """
    if not isinstance(location, str):
        # A path is read as its text is: one value, one ledger, however it is given (a
        # connection string, a quoted one, one that cannot be used: the str's own errors).
        target = os.fsdecode(os.fspath(location))
        if parse_location(target).kind != "sqlite":
            raise LedgerConfigError(
                f"the ledger path ({_form(target.strip())}) reads as a connection string: give "
                f"a connection string as a str, a file of that name as an absolute path")
        return LedgerLocation(kind="sqlite", target=target)
    text = location.strip()
    if text.startswith(POSTGRES_SCHEMES):
        dsn, schema = split_schema(text)
        conninfo_dict(dsn)
        return LedgerLocation(kind="postgres", target=dsn, schema=schema)
    if _URI.match(text) and not text.lower().startswith("file:"):
        raise LedgerConfigError(
            f"the ledger ({_form(text)}) is a URI recallbound cannot open: a ledger is a "
            f"postgresql:// or postgres:// DSN, a libpq key=value string, or a SQLite file path")
    if _keywords(text):
        # Unstripped: libpq skips white space itself, and a final backslash-escaped space
        # belongs to the last value.
        conninfo_dict(location)
        return LedgerLocation(kind="postgres", target=location)
    if FOREIGN_DSN.match(text) or SCHEMELESS_URI.match(text):
        raise LedgerConfigError(
            f"the ledger ({_form(text)}) looks like a PostgreSQL DSN but is not one: write "
            f"postgresql://host/dbname (a file of that name: ./name)")
    start, end = 0, len(text)
    while start < end and _wrapper(text[start]):
        start += 1
    while end > start and _wrapper(text[end - 1]):
        end -= 1
    unwrapped = text[start:end]
    wrapped = start > 0 and (text[0] not in _QUOTES or text[-1] in _QUOTES
                             or text[0] not in text[1:])  # quoted, or an opening quote alone
    seen = visible(unwrapped)  # what a reader sees: an invisible character inside it too
    if (wrapped or seen != unwrapped) and (_URI.match(seen) or _keywords(seen)
                                           or FOREIGN_DSN.match(seen)):
        # quotes an env file or a unit file left on, or an invisible character pasted in
        raise LedgerConfigError(
            f"the ledger ({_form(unwrapped)}) is a connection string inside quotes or after an "
            f"invisible character: give it without them")
    if text != location:  # a space an env file or a unit file left on: another file
        raise LedgerConfigError("the ledger's file name begins or ends with white space: "
                                "give the file's name without it")
    return LedgerLocation(kind="sqlite", target=location)


def is_connection_string(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is, or looks like, a database connection string or URI: what
    :func:`parse_location` does not read as a SQLite file path. A store that is a SQLite file
    refuses it rather than create a file of that name."""
    try:
        return parse_location(location).kind != "sqlite"
    except LedgerConfigError:
        return True


def shown_location(location: str | os.PathLike[str]) -> str:
    """A ledger or store location for display: a file path as it is, a PostgreSQL location
    with its passwords hidden (:func:`redact`), and a text that looks like a connection string
    but that libpq cannot read, by its form alone (``<a postgresql: URI>``): where its password
    is cannot be known, so none of it is shown."""
    text = os.fspath(location)
    try:
        parse_location(text)
    except LedgerConfigError:
        return f"<{_form(text)}>"
    return redact(text)


def _uri_spans(dsn: str, start: int) -> list[tuple[int, int]]:
    """Where a URI's passwords are, read as libpq reads them; ``start`` is just past ``://``.

    The userinfo's password runs from its first ``:`` to the ``@``; a ``password`` query
    parameter (its key percent-decoded) runs to the next ``&`` or the end.
    """
    spans: list[tuple[int, int]] = []
    userinfo = USERINFO.match(dsn, start)
    if userinfo is not None:
        at = userinfo.end() - 1
        colon = dsn.find(":", start, at)
        if colon >= 0:
            spans.append((colon + 1, at))
    mark = query_mark(dsn)
    if mark >= 0:
        position = mark + 1
        for item in dsn[mark + 1:].split("&"):
            key, equals, _ = item.partition("=")
            if equals and is_secret(urllib.parse.unquote(key)):
                spans.append((position + len(key) + 1, position + len(item)))
            position += len(item) + 1
    return spans


def _keyword_spans(dsn: str) -> list[tuple[int, int]] | None:
    """Where a key=value string's passwords are, read as libpq reads it; ``None`` when libpq
    could not read it (a word with no ``=``, an unterminated quote).

    A keyword runs to ``=`` or white space; white space around ``=`` is skipped. A value in
    single quotes runs to the closing quote, a backslash escaping the next character; any other
    value runs to white space, a backslash escaping the next character (``\\ `` is a space of
    the value).
    """
    spans: list[tuple[int, int]] = []
    index, end = 0, len(dsn)
    while index < end:
        if dsn[index] in _SPACE:
            index += 1
            continue
        start = index
        while index < end and dsn[index] != "=" and dsn[index] not in _SPACE:
            index += 1
        keyword = dsn[start:index]
        while index < end and dsn[index] in _SPACE:
            index += 1
        if index >= end or dsn[index] != "=":
            return None
        index += 1
        while index < end and dsn[index] in _SPACE:
            index += 1
        value = index
        if index < end and dsn[index] == "'":
            index += 1
            while True:
                if index >= end:
                    return None
                if dsn[index] == "\\":
                    index += 2
                    continue
                index += 1
                if dsn[index - 1] == "'":
                    break
        else:
            while index < end and dsn[index] not in _SPACE:
                index += 2 if dsn[index] == "\\" else 1
            index = min(index, end)
        if is_secret(keyword):
            spans.append((value, index))
        elif (pasted := pasted_password(keyword, dsn[value:index])) is not None:
            spans.append((value + pasted[0], value + pasted[1]))
    return spans


def _hide(text: str, spans: Iterable[tuple[int, int]]) -> str:
    pieces: list[str] = []
    last = 0
    for start, end in sorted(spans):
        if end > start >= last:
            pieces += [text[last:start], _HIDDEN]
            last = end
    pieces.append(text[last:])
    return "".join(pieces)


def _hide_in_message(text: str) -> str:
    text = hide_userinfo_ats(text, _HIDDEN)
    text = _URI_PASSWORD.sub(rf"\1{_HIDDEN}@", text)
    return _KEYWORD_PASSWORD.sub(rf"\1{_HIDDEN}", text)


def _libpq_reading(dsn: str) -> dict[str, Any] | None:
    """What libpq reads in ``dsn`` (a URI's ``schema`` taken out); ``None`` when it cannot
    read it (psycopg.ProgrammingError, a bad schema) or psycopg is not installed."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        return conninfo_to_dict(split_schema(dsn.strip())[0] if URI_START.match(dsn) else dsn)
    except Exception:
        return None


def _shown_value(keyword: str, value: str) -> str:
    """A value libpq read, as shown: a password hidden whole, a pasted one in part."""
    if is_secret(keyword):
        return _HIDDEN
    pasted = pasted_password(keyword, value)
    return value if pasted is None else _hide(value, [pasted])


def _checked(location: str, shown: str) -> str:
    """``shown``, if libpq reads it as ``location`` with every password ``***``; else libpq's
    own rendering of ``location`` with its passwords hidden (key=value form). Without
    psycopg, or for a text libpq cannot read, ``shown`` as it is.
    """
    try:
        from psycopg.conninfo import make_conninfo
    except ImportError:
        return shown
    params = _libpq_reading(location)
    if params is None:
        return shown
    hidden = {key: _shown_value(key, value) for key, value in params.items()}
    if _libpq_reading(shown) == hidden:
        return shown
    return make_conninfo("", **hidden)


def _redact_location(text: str) -> str | None:
    """``text`` with its passwords hidden if the whole of it is a PostgreSQL location (the
    rest of it unchanged), else ``None``."""
    uri = URI_START.match(text)
    if uri is not None:
        if any(char in _SPACE for char in text.strip(_SPACE)) and _libpq_reading(text) is None:
            # libpq refuses white space inside a URI's part (a message that starts with a URI),
            # but reads it at a part's end: a password pasted with a space before its '@'
            return None
        if doubled_at(text):
            return hide_userinfo_ats(text, _HIDDEN)
        shown = _URI_PASSWORD.sub(rf"\1{_HIDDEN}@", _hide(text, _uri_spans(text, uri.end())))
        loose = _URI_PASSWORD.search(text)
        if loose is not None and "/" in loose.group(0)[3:]:
            return shown  # a password holding a "/": libpq reads a port and a dbname there
    elif _KEYWORD.match(text):
        spans = _keyword_spans(text)
        if spans is None:
            return None
        shown = _hide_in_message(_hide(text, spans))
    else:
        return None
    return _checked(text, shown)


def redact(text: str | os.PathLike[str], *, secrets: Iterable[str | None] = ()) -> str:
    """``text`` (a DSN, or any message) with every password replaced by ``***``.

    A whole location is read as libpq reads it, so every character of its password is hidden,
    in each form libpq accepts: a URI's userinfo password, a ``password`` (or ``sslpassword``)
    query parameter, percent-encoded key included, and a key=value ``password`` quoted or with
    backslash escapes; with psycopg installed, the result is checked with libpq's own parser.
    In a longer text, a URI's userinfo password and a ``password=`` value (quoted, or up to
    white space) are hidden, and so is any value it quotes as ``repr`` does (read before its
    backslashes were doubled). Each of ``secrets`` and the value of ``PGPASSWORD`` are hidden
    wherever they appear (also percent-encoded).
    """
    original = os.fspath(text)
    shown = _redact_location(original)
    if shown is None:
        shown = replace_literals(original, shown_location, _hide_in_message)
    literal = {s for s in (*secrets, os.environ.get(_SECRET_ENV, "")) if s}
    for secret in sorted(literal, key=len, reverse=True):
        for form in {secret, urllib.parse.quote(secret, safe=""),
                     urllib.parse.quote_plus(secret)}:
            shown = shown.replace(form, _HIDDEN)
    return shown
