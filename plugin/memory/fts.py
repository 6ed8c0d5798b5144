"""Safe FTS5 queries: user text becomes quoted terms, never FTS5 syntax.

A naive ``MATCH ?`` on user text raises on ``AND``, ``don't``, ``C++``, ``what?``, ``e-mail``,
``title: x``, ``*x``, an unbalanced quote or an empty string, and silently changes meaning on
``body: x``, ``NEAR(...)``, ``^x`` and ``x*``. :func:`fts5_match_expression` keeps only word
tokens, quotes each one and joins them with ``OR``, so the expression it returns is always
valid FTS5 and every term is matched as plain text.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["MAX_SCAN_CHARS", "fts5_match_expression", "remove_lone_surrogates"]

#: Only this many leading characters of a text are scanned for terms: a 1 MB string stays cheap,
#: and the term cap is reached long before in any real query.
MAX_SCAN_CHARS = 16 * 1024

_WORD = re.compile(r"\w+", re.UNICODE)
_NON_WORD = re.compile(r"\W", re.UNICODE)
_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 and C1 control characters (category Cc), NUL included.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def remove_lone_surrogates(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD, so that it can be encoded as UTF-8.

    Python strings may hold surrogates that no encoder (SQLite, a tokenizer) accepts.
    """
    return _SURROGATE.sub("\ufffd", text)


def fts5_match_expression(text: str, *, max_terms: int = 32) -> str | None:
    """An FTS5 expression matching any word of ``text``, or None when ``text`` has no word.

    The recipe: NFKC-normalise, turn control characters into spaces, take ``\\w+`` tokens,
    drop case-insensitive duplicates (the first spelling stands), keep at most ``max_terms``,
    double-quote each term (doubling any ``"``) and join them with `` OR ``. Only the first
    :data:`MAX_SCAN_CHARS` characters are scanned. Never raises for any ``str``; a caller that
    gets None skips the sparse arm. Raises ``ValueError`` if ``max_terms`` is below 1 and
    ``TypeError`` if ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if isinstance(max_terms, bool) or not isinstance(max_terms, int) or max_terms < 1:
        raise ValueError(f"max_terms must be an int >= 1, got {max_terms!r}")
    scanned = text[:MAX_SCAN_CHARS]
    if len(text) > MAX_SCAN_CHARS and _WORD.match(text, MAX_SCAN_CHARS):
        # Never keep half of a cut-off word (searching the reversed text stays linear).
        boundary = _NON_WORD.search(scanned[::-1])
        scanned = "" if boundary is None else scanned[: len(scanned) - boundary.start()]
    # Surrogates are not \w, so they never reach the expression; removing them first keeps
    # NFKC and the regex on plain, encodable text.
    scanned = remove_lone_surrogates(scanned)
    scanned = _CONTROL.sub(" ", unicodedata.normalize("NFKC", scanned))
    seen: set[str] = set()
    terms: list[str] = []
    for term in _WORD.findall(scanned):
        key = term.casefold()
        if key in seen:
            continue
        seen.add(key)
        terms.append('"' + term.replace('"', '""') + '"')
        if len(terms) >= max_terms:
            break
    if not terms:
        return None
    return " OR ".join(terms)
