"""Safe FTS5 queries: user text becomes quoted terms, never FTS5 syntax.

A naive ``MATCH ?`` on user text raises on ``AND``, ``don't``, ``C++``, ``what?``, ``e-mail``,
``title: x``, ``*x``, an unbalanced quote or an empty string, and silently changes meaning on
``body: x``, ``NEAR(...)``, ``^x`` and ``x*``. :func:`fts5_match_expression` keeps only word
tokens, quotes each one and joins them with ``OR``, so the expression it returns is always
valid FTS5 and every term is matched as plain text.

A quoted term still goes through the index's tokenizer, :data:`TOKENIZER`: Unicode-aware
words (``unicode61``), diacritics removed (``remove_diacritics 2``, so "cafe" finds "café"
whether its accent is one code point or two), then Porter stemming (``porter``, so
"invoices" finds "invoice" and "running" finds "run"). Porter is an English stemmer; it leaves
words of other scripts as they are and can conflate some English words that differ
("university" and "universe" share a stem).
"""

from __future__ import annotations

from .terms import MAX_SCAN_CHARS, remove_lone_surrogates, word_terms

__all__ = ["MAX_SCAN_CHARS", "TOKENIZER", "fts5_match_expression", "remove_lone_surrogates"]

#: The FTS5 tokenizer of the store's full-text indexes (see the module docstring).
TOKENIZER = "porter unicode61 remove_diacritics 2"


def fts5_match_expression(text: str, *, max_terms: int = 32) -> str | None:
    """An FTS5 expression matching any word of ``text``, or None when ``text`` has no word.

    The recipe: NFKC-normalise, turn control characters into spaces, take ``\\w+`` tokens,
    drop case-insensitive duplicates (the first spelling stands), keep at most ``max_terms``
    (all of it is :func:`~plugin.memory.terms.word_terms`), double-quote each term (doubling
    any ``"``) and join them with `` OR ``. Only the first :data:`MAX_SCAN_CHARS` characters
    are scanned. Never raises for any ``str``; a caller that gets None skips the sparse arm.
    Raises ``ValueError`` if ``max_terms`` is below 1 and ``TypeError`` if ``text`` is not a
    string.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if isinstance(max_terms, bool) or not isinstance(max_terms, int) or max_terms < 1:
        raise ValueError(f"max_terms must be an int >= 1, got {max_terms!r}")
    terms = word_terms(text, limit=max_terms, fold=False)
    if not terms:
        return None
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
