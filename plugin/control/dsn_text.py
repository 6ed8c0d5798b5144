"""What a ledger location's text says before libpq reads it: whether it names a libpq keyword
anywhere (so it is meant as a connection string), whether a URI's userinfo holds a raw ``@``
(so libpq would read part of a password as the host), and the values a message quotes with
``repr``."""

from __future__ import annotations

import ast
import itertools
import os
import re
import unicodedata
import urllib.parse
from collections.abc import Callable, Mapping

LIBPQ_KEYWORDS = frozenset({
    "application_name", "channel_binding", "client_encoding", "connect_timeout", "dbname",
    "fallback_application_name", "gssdelegation", "gssencmode", "gsslib", "host", "hostaddr",
    "keepalives", "keepalives_count", "keepalives_idle", "keepalives_interval", "krbsrvname",
    "load_balance_hosts", "max_protocol_version", "min_protocol_version", "oauth_client_id",
    "oauth_client_secret", "oauth_issuer", "oauth_scope", "options", "passfile", "password", "port",
    "replication", "require_auth", "requirepeer", "requiressl", "scram_client_key",
    "scram_server_key", "service", "ssl_max_protocol_version", "ssl_min_protocol_version",
    "sslcert", "sslcertmode", "sslcompression", "sslcrl", "sslcrldir", "sslkey", "sslkeylogfile",
    "sslmode", "sslnegotiation", "sslpassword", "sslrootcert", "sslsni", "target_session_attrs",
    "tcp_user_timeout", "user",
})
"""libpq's connection keywords (``PQconndefaults``)."""

_KEYWORD_TOKEN = re.compile(
    r"(?i)(?:^|[ \t\n\r\f\v])(?:" + "|".join(sorted(LIBPQ_KEYWORDS)) + r")[ \t\n\r\f\v]*=")
_EXPLICIT_PATH = re.compile(r"[ \t\n\r\f\v]*\.{0,2}/")
"""A path that starts with ``/``, ``./`` or ``../``: a file, whatever its name holds."""


def names_keyword(text: str) -> bool:
    """Whether ``text`` holds a libpq keyword followed by ``=`` (white space around it allowed)
    as a word of its own, anywhere: ``host 127.0.0.1 dbname=test`` or ``psql host=db`` is a
    connection string with a typo, never a file name. A path that starts with ``/``, ``./``
    or ``../`` names a file whatever it holds."""
    return _EXPLICIT_PATH.match(text) is None and _KEYWORD_TOKEN.search(text) is not None


_USERINFO_ATS = re.compile(
    r"(?i)(postgres(?:ql)?:/{1,2})[^/@ \t\n\r\f\v]*@[^/ \t\n\r\f\v]*@")
"""A URI's authority holding two ``@`` or more, in a longer text: up to its last ``@``."""


def doubled_at(uri: str) -> bool:
    """Whether the URI ``uri`` holds an ``@`` in its host: after the first ``@`` that comes
    before any ``/`` past its ``//`` (which ends the userinfo, as libpq reads it) and before
    the next ``/`` or ``?``. A host never holds an ``@``: the rest of a password with a raw
    ``@`` in it would be read (and shown) as the host. A query may hold one."""
    start = uri.find("//") + 2
    at = uri.find("@", start)
    slash = uri.find("/", start)
    if at < 0 or 0 <= slash < at:
        return False
    ends = [i for i in (uri.find("/", at), uri.find("?", at)) if i >= 0]
    return "@" in uri[at + 1:min(ends, default=len(uri))]


SECRET_KEYWORDS = frozenset({"password", "sslpassword", "oauth_client_secret",
                             "scram_client_key", "scram_server_key"})
"""The libpq keywords (and URI query parameters) whose value is a secret."""
SECRET_NAME = "(?:" + "|".join(sorted(SECRET_KEYWORDS)) + ")"
"""A regular expression that matches one of :data:`SECRET_KEYWORDS`."""
_SECRET_INSIDE = re.compile(r"(?i)\b" + SECRET_NAME + r"[ \t]*=")


def is_secret(keyword: str) -> bool:
    """Whether libpq's ``keyword`` names a secret (white space and case aside)."""
    return keyword.strip(" \t\n\r\f\v").lower() in SECRET_KEYWORDS


def pasted_password(keyword: str, value: str) -> tuple[int, int] | None:
    """Where a ``user`` value holds a URI's ``name:password@host`` pasted whole (from just
    after its first ``:`` to its last ``@``), or None: libpq takes it all for a role name, and
    it is hidden as a password is."""
    if keyword.strip(" \t\n\r\f\v").lower() != "user":
        return None
    colon, at = value.find(":"), value.rfind("@")
    return (colon + 1, at) if 0 <= colon < at else None


def secret_inside(params: Mapping[str, object]) -> bool:
    """Whether a parameter libpq read that is no secret holds a secret keyword and ``=``: a
    URI with no path whose query libpq read into its user name or host, as in
    ``postgresql://db?user=a@corp&password=...``."""
    return any(_SECRET_INSIDE.search(str(value)) for key, value in params.items()
               if not is_secret(key))


def hide_userinfo_ats(text: str, hidden: str) -> str:
    """``text`` with the userinfo of each PostgreSQL URI in it that holds more than one ``@``
    replaced by ``hidden``: which ``@`` ends a password there cannot be known."""
    return _USERINFO_ATS.sub(rf"\1{hidden}@", text)


_LITERAL = re.compile(r"(?<!\w)(?:'(?:[^'\\\n]|\\.)*'" + r'|"(?:[^"\\\n]|\\.)*")')
"""A Python string literal, as ``repr`` writes one into a message (not an apostrophe)."""


def replace_literals(text: str, shown: Callable[[str], str],
                     elsewhere: Callable[[str], str]) -> str:
    """``text`` with each value it quotes as ``repr`` does (``'...'``) replaced by the
    ``repr`` of ``shown(value)`` where that differs (a password read in the value itself,
    before ``repr`` doubled its backslashes and escaped its quotes), and ``elsewhere`` applied
    to the text around those."""
    pieces: list[str] = []
    last = 0
    for match in _LITERAL.finditer(text):
        try:
            value = ast.literal_eval(match.group(0))
        except (ValueError, SyntaxError):  # quotes that are not a literal: left as they are
            continue
        if isinstance(value, str) and shown(value) != value:
            pieces += [elsewhere(text[last:match.start()]), repr(shown(value))]
            last = match.end()
    pieces.append(elsewhere(text[last:]))
    return "".join(pieces)


_BLANKS = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u2800\u3164\uffa0")
"""Characters that show nothing and are not format characters (a combining grapheme joiner,
the Hangul fillers, the Khmer inherent vowels, a blank braille cell)."""


def invisible(char: str) -> bool:
    """Whether ``char`` shows nothing: a format character, a variation selector or another
    default-ignorable or blank code point."""
    return (unicodedata.category(char) == "Cf" or char in _BLANKS
            or "\ufe00" <= char <= "\ufe0f" or "\u180b" <= char <= "\u180f")


def visible(text: str) -> str:
    """``text`` without the characters that show nothing (:func:`invisible`)."""
    return "".join(char for char in text if not invisible(char))


_STRAY = frozenset("\ufeff\u200b\u2060\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""Invisible characters no file name means to hold: a BOM, a zero-width space, a word joiner,
the bidi embeddings, overrides and isolates. The other format characters belong to names
(the zero-width joiner of an emoji or an Indic word, the non-joiner of a Persian one, a flag's
tags, a soft hyphen, a direction mark)."""


def location_problem(text: str, *, file: bool) -> str | None:
    """Why ``text`` can name no location, or None; the value itself is never repeated (it may
    hold a password). Empty or blank, or not encodable as a file name (a lone surrogate, which
    would fail only when the file is opened); and a ``file`` name holding a control or
    invisible character (a newline or a BOM an env file left on, a NUL, an escape sequence),
    which would name a file no one meant."""
    if not text.strip():
        return "must not be empty or blank"
    try:
        os.fsencode(text)
    except UnicodeError:
        return "holds a character no file name can hold (a lone surrogate)"
    if file and any(unicodedata.category(char) == "Cc" or char in _STRAY for char in text):
        return ("holds a control or invisible character (a newline, a tab, a BOM, a "
                "zero-width space): give the file's name without it")
    return uri_problem(text) if file else None


_TRUE = frozenset({"yes", "true", "on"})
_DIGITS = frozenset("0123456789")
_DEFAULT_VFS = frozenset({"unix", "win32", "memdb"})
"""VFS names that lock as a plain path does (each platform's default), or keep the database in
memory (:func:`is_ephemeral` judges that)."""


def _uri_true(value: str) -> bool:
    """SQLite's reading of a boolean URI parameter (``sqlite3_uri_boolean``): a value that
    starts with a digit is the number its leading digits make, kept to its low byte (so 256 is
    false, as is a number past a 32-bit int); otherwise yes, true or on in any case."""
    if value[:1] in _DIGITS:
        number = int("".join(itertools.takewhile(_DIGITS.__contains__, value)))
        return number <= 2**31 - 1 and number % 256 != 0
    return value.lower() in _TRUE


def uri_problem(text: str) -> str | None:
    """Why a ``file:`` URI cannot hold a ledger or a store that several processes share, or
    None: a parameter SQLite reads that changes how it locks the file (a VFS other than the
    platform's default; ``nolock`` or ``immutable`` true, which turn locking off) or opens it
    read-only (``mode=ro``). An in-memory database (``vfs=memdb``, ``mode=memory``) is
    :func:`is_ephemeral`'s to judge. Read as SQLite reads them: names are case-sensitive,
    names and values percent-decoded and cut at a decoded NUL; any occurrence of a repeated
    name that would be unsafe is refused."""
    if not text.startswith("file:"):  # SQLite reads only this spelling as a URI
        return None
    query = text[5:].partition("#")[0].partition("?")[2]
    for pair in query.split("&"):
        key, _, value = (urllib.parse.unquote(part).partition("\x00")[0]
                         for part in pair.partition("="))
        if key == "vfs" and value not in _DEFAULT_VFS:
            return (f"names an SQLite VFS ({value!r}), which locks the file differently from "
                    "the other processes or not at all: drop vfs= from the URI")
        if key in ("nolock", "immutable") and _uri_true(value):
            return (f"sets {key}, which turns SQLite's file locking off for a file other "
                    f"processes write: drop {key}= from the URI")
        if key == "mode" and value == "ro":
            return "opens the file read-only (mode=ro), and it must be written: drop mode=ro"
    return None


def is_ephemeral(location: str | os.PathLike[str]) -> bool:
    """Whether a ledger location keeps nothing once closed (an in-memory SQLite database)."""
    text = os.fspath(location)
    if text in ("", ":memory:"):  # "" is SQLite's private temporary database
        return True
    if text[:5].lower() == "file:":
        # SQLite ignores a fragment: ``?mode=memory#x`` is in memory too
        name, _, query = text[5:].partition("#")[0].partition("?")
        name = urllib.parse.unquote(name)
        options = urllib.parse.parse_qs(query)
        return (name in ("", ":memory:") or name.startswith(":memory:")
                or "memory" in options.get("mode", []) or "memdb" in options.get("vfs", []))
    return False
