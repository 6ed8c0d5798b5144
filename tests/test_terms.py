"""One term extractor: every caller's differences are parameters of ``word_terms``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.memory.fts import fts5_match_expression
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.pipeline import content_terms, query_terms
from plugin.memory.terms import MAX_SCAN_CHARS, STOPWORDS, word_terms


def test_word_terms_rules() -> None:
    text = "Stra\u00dfe STRASSE \uff46\uff4f\uff4f a\x00b \ud800x"
    assert word_terms(text, limit=None) == ("strasse", "foo", "a", "b", "x")
    assert word_terms(text, limit=None, fold=False) == ("Straße", "foo", "a", "b", "x")
    assert word_terms(text, limit=2) == ("strasse", "foo")
    assert word_terms("b a B", limit=None, unique=False) == ("b", "a", "b")


def test_scan_bound_drops_a_cut_word_unless_asked_to_keep_it() -> None:
    text = "alpha " + "x" * 20
    assert word_terms(text, limit=None, scan=10) == ("alpha",)
    assert word_terms(text, limit=None, scan=10, whole_words=False) == ("alpha", "xxxx")
    assert word_terms(text, limit=None, scan=None) == ("alpha", "x" * 20)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_bad_bounds_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        word_terms("a", limit=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        word_terms("a", limit=None, scan=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        word_terms(b"a", limit=None)  # type: ignore[arg-type]


def test_callers_are_parameters_of_one_extractor() -> None:
    assert query_terms("The The release", limit=64) == ("the", "release")
    assert content_terms("the release of the budget") == ("release", "budget")
    assert content_terms("what is it") == ("what", "is", "it")  # nothing but function words
    assert "the" in STOPWORDS
    # The hashing adapter counts every occurrence: a repeated word weighs more.
    assert HashingEmbedding().count_tokens("deploy Deploy deploy!") == 3


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_fts_expression_quotes_exactly_the_shared_terms(text: str) -> None:
    terms = word_terms(text, limit=32, fold=False)
    expected = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms) if terms else None
    assert fts5_match_expression(text) == expected
    assert query_terms(text) == tuple(t.casefold() for t in word_terms(text, limit=64))


def test_default_scan_is_the_fts_bound() -> None:
    text = "x " * MAX_SCAN_CHARS + "tail"
    assert "tail" not in word_terms(text, limit=None, unique=False)
