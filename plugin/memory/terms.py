"""Word terms of a text: the one tokenizer behind the sparse arm, the pipeline and hashing.

Every caller that needs "the words of this text" goes through :func:`word_terms`, so there is
one place for the rules: lone surrogates become U+FFFD, NFKC, control characters become spaces,
``\\w+`` tokens, an optional case-insensitive dedup, an optional stop list and an optional cap.
What differs between callers (how much text is scanned, whether terms are case-folded, how many
are kept) is a parameter, not a copy of the loop.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

__all__ = [
    "ACKNOWLEDGEMENTS",
    "MAX_SCAN_CHARS",
    "STOPWORDS",
    "content_terms",
    "query_terms",
    "remove_lone_surrogates",
    "request_content",
    "word_terms",
]

#: Only this many leading characters of a query are scanned for terms by default: a 1 MB string
#: stays cheap, and the term cap is reached long before in any real query.
MAX_SCAN_CHARS = 16 * 1024

_WORD = re.compile(r"\w+", re.UNICODE)
_NON_WORD = re.compile(r"\W", re.UNICODE)
_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 and C1 control characters (category Cc), NUL included.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")

STOPWORDS = frozenset(
    """a about after again all am an and any are as at be been before being between both but by
    can could did do does doing down during each few for from further had has have having he
    her here hers him his how i if in into is it its itself just me more most my no nor not
    now of off on once only or other our out over own same she should so some such than that
    the their them then there these they this those through to too under until up very was
    we were what when where which while who whom why will with would you your""".split()  # noqa: SIM905
)
"""English function words left out of the sparse and recent arms' terms (unless a query has
nothing else): they match nearly every memory and drown the words that carry the need."""

ACKNOWLEDGEMENTS = frozenset(
    """ok okay okey kk yes yeah yep yup sure alright allright right fine good great cool nice
    perfect awesome sounds looks works thanks thank thx please pls plz go going ahead continue
    continuing carry keep proceed next step onward onwards resume um umm uh hmm mm mhm hm guess
    whatever anyway let lets
    ja jo jep passt gut weiter mach los bitte klar genau super prima
    oui ouais continuez continuons vas allez allons va marche accord bien parfait ça
    sí si vale sigue seguimos sigamos adelante venga dale perfecto bueno claro vamos por favor
    sì bene avanti continua prosegui procedi certo perfetto
    sim segue siga pode bora beleza
    goed verder doorgaan
    joo kyllä selvä jatka jatketaan vaan okei seuraava hyvä
    okej fortsätt kör bra nästa
    tak dalej dobrze""".split()  # noqa: SIM905
)
"""Words that, in a request to an agent, only acknowledge or say "go on" (case-folded, in the
languages people most often write such requests in): they are not content, even in a scope
whose notes use them ("next week", "looks good"). A request is otherwise measured on the
scope's own vocabulary, so a go-on word of another language, absent from the notes, carries
nothing either."""


def request_content(terms: Iterable[str]) -> tuple[str, ...]:
    """The ``terms`` of a request that may carry content: no function word, no acknowledgement
    (:data:`ACKNOWLEDGEMENTS`), no single character."""
    return tuple(term for term in terms
                 if len(term) > 1 and term not in STOPWORDS and term not in ACKNOWLEDGEMENTS)


def remove_lone_surrogates(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD, so that it can be encoded as UTF-8.

    Python strings may hold surrogates that no encoder (SQLite, a tokenizer) accepts.
    """
    return _SURROGATE.sub("\ufffd", text)


def _positive_or_none(value: object, name: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")


def _scanned(text: str, scan: int | None, whole_words: bool) -> str:
    if scan is None or len(text) <= scan:
        return text
    cut = text[:scan]
    if whole_words and _WORD.match(text, scan):
        # Never keep half of a cut-off word (searching the reversed text stays linear).
        boundary = _NON_WORD.search(cut[::-1])
        cut = "" if boundary is None else cut[: len(cut) - boundary.start()]
    return cut


def word_terms(
    text: str,
    *,
    limit: int | None,
    scan: int | None = MAX_SCAN_CHARS,
    whole_words: bool = True,
    fold: bool = True,
    unique: bool = True,
) -> tuple[str, ...]:
    """The ``\\w+`` terms of ``text`` in order of appearance.

    ``text[:scan]`` is read (all of it when ``scan`` is None); with ``whole_words`` a word cut
    by that bound is dropped rather than kept in half. Lone surrogates are replaced, the text is
    NFKC-normalised and control characters turn into spaces. ``fold`` returns case-folded terms
    (else the first spelling of each stands); ``unique`` drops case-insensitive repeats;
    ``limit`` keeps at most that many terms (None: all). Raises ``TypeError`` when ``text`` is
    not a str and ``ValueError`` for a ``limit`` or ``scan`` below 1.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    _positive_or_none(limit, "limit")
    _positive_or_none(scan, "scan")
    # Surrogates are not \w, so they never reach a term; removing them first keeps NFKC and the
    # regex on plain, encodable text.
    cleaned = remove_lone_surrogates(_scanned(text, scan, whole_words))
    cleaned = _CONTROL.sub(" ", unicodedata.normalize("NFKC", cleaned))
    seen: set[str] = set()
    terms: list[str] = []
    for match in _WORD.finditer(cleaned):
        term = match.group()
        key = term.casefold()
        if unique:
            if key in seen:
                continue
            seen.add(key)
        terms.append(key if fold else term)
        if limit is not None and len(terms) >= limit:
            break
    return tuple(terms)


def query_terms(text: str, *, limit: int = 64) -> tuple[str, ...]:
    """The case-folded word terms of ``text`` in order, deduplicated, at most ``limit``.

    The first 65,536 characters are scanned (the pipeline reads memory texts with it too).
    """
    return word_terms(text, limit=limit, scan=65_536, whole_words=False)


def content_terms(text: str) -> tuple[str, ...]:
    """:func:`query_terms` without function words; all terms when nothing else is left.

    The cap counts every distinct word, function words included.
    """
    terms = query_terms(text)
    content = tuple(term for term in terms if term not in STOPWORDS)
    return content or terms
