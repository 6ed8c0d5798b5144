"""The safe FTS5 recipe: any text gives None or an expression FTS5 accepts as plain terms."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.memory.fts import (
    MAX_SCAN_CHARS,
    TOKENIZER,
    fts5_match_expression,
    remove_lone_surrogates,
)

from ._hostile import HOSTILE_TEXT


@pytest.fixture(scope="module")
def fts() -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(body, tokenize = '{TOKENIZER}')")
    conn.executemany(
        "INSERT INTO t (body) VALUES (?)",
        [("the body of the text",), ("a xylophone",), ("x marks the spot",), ("near a and b",)],
    )
    yield conn
    conn.close()


def run(conn: sqlite3.Connection, expression: str) -> list[int]:
    rows = conn.execute(
        "SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank, rowid", (expression,)
    ).fetchall()
    return [row[0] for row in rows]


def test_recipe_quotes_dedups_and_joins() -> None:
    assert fts5_match_expression("Hello, hello WORLD world!") == '"Hello" OR "WORLD"'
    assert fts5_match_expression("don't") == '"don" OR "t"'
    assert fts5_match_expression("C++") == '"C"'
    assert fts5_match_expression("body: x") == '"body" OR "x"'
    assert fts5_match_expression("NEAR(a b)") == '"NEAR" OR "a" OR "b"'
    assert fts5_match_expression("x*") == '"x"'
    assert fts5_match_expression("^x") == '"x"'


def test_nfkc_and_control_characters() -> None:
    # Fullwidth "foo" folds to ASCII; the ligature U+FB01 becomes "fi"; NUL and tab separate terms.
    assert fts5_match_expression("\uff46\uff4f\uff4f \ufb01le") == '"foo" OR "file"'
    assert fts5_match_expression("a\x00b\tc") == '"a" OR "b" OR "c"'
    # Case-insensitive dedup, the first spelling stands (casefold: "STRASSE" == "straße").
    assert fts5_match_expression("straße STRASSE") == '"straße"'


@pytest.mark.parametrize("text", ["", "   ", "?!*^:()", '"', "\x00\x01", "\ud800\udc00x"[:2]])
def test_no_term_gives_none(text: str) -> None:
    assert fts5_match_expression(text) is None


def test_term_cap() -> None:
    text = " ".join(f"w{i}" for i in range(100))
    expression = fts5_match_expression(text, max_terms=5)
    assert expression == '"w0" OR "w1" OR "w2" OR "w3" OR "w4"'
    assert fts5_match_expression(text) is not None
    assert fts5_match_expression(text).count(" OR ") == 31  # type: ignore[union-attr]


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="max_terms"):
        fts5_match_expression("x", max_terms=0)
    with pytest.raises(TypeError, match="text"):
        fts5_match_expression(b"x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text", ["", "AND", "don't", "C++", "what?", "e-mail", "title: x", "*x", '"']
)
def test_naive_match_raises(fts: sqlite3.Connection, text: str) -> None:
    # The reason for the recipe: these raise when handed to MATCH as they are.
    with pytest.raises(sqlite3.OperationalError):
        run(fts, text)


@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_hostile_text_is_accepted_by_fts5(fts: sqlite3.Connection, text: str) -> None:
    expression = fts5_match_expression(text)
    if expression is not None:
        expression.encode("utf-8")
        run(fts, expression)


def test_syntax_is_plain_terms(fts: sqlite3.Connection) -> None:
    # "body: x" is not a column filter (t has a column named body): it matches the word "body".
    assert run(fts, fts5_match_expression("body: zzz") or "") == [1]
    # "x*" is not a prefix query: it does not reach "xylophone".
    assert run(fts, fts5_match_expression("x*") or "") == [3]
    # NEAR is a word here.
    assert run(fts, fts5_match_expression("NEAR(zzz qqq)") or "") == [4]
    # AND is a word too, not an operator.
    assert run(fts, fts5_match_expression("AND") or "") == [4]


def test_huge_input_is_cheap() -> None:
    huge = "?" * 1_000_000 + " needle"
    start = time.perf_counter()
    assert fts5_match_expression(huge) is None  # the needle is past the scanned prefix
    words = "word " * 200_000
    assert fts5_match_expression(words) == '"word"'  # no half word from the cut
    assert time.perf_counter() - start < 1.0
    assert fts5_match_expression("?" * (MAX_SCAN_CHARS - 10) + " needle") == '"needle"'


def test_remove_lone_surrogates() -> None:
    assert remove_lone_surrogates("a\ud800b\udfff") == "a\ufffdb\ufffd"
    assert remove_lone_surrogates("plain é") == "plain é"


@settings(max_examples=500, deadline=None)
@given(text=st.text())
def test_any_text_gives_none_or_an_expression_fts5_accepts(text: str) -> None:
    expression = fts5_match_expression(text)
    if expression is None:
        return
    expression.encode("utf-8")  # nothing unencodable reaches SQLite
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute(
            f"CREATE VIRTUAL TABLE t USING fts5(body, tokenize = '{TOKENIZER}')"
        )
        conn.execute("INSERT INTO t (body) VALUES (?)", (remove_lone_surrogates(text),))
        conn.execute("SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank", (expression,))
    finally:
        conn.close()


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(
        alphabet=st.sampled_from(list("abc AND OR NOT NEAR()*^:\"+-{}'\x00\ud800 ")), max_size=60
    )
)
def test_syntax_heavy_text_gives_none_or_an_accepted_expression(
    fts: sqlite3.Connection, text: str
) -> None:
    expression = fts5_match_expression(text)
    if expression is not None:
        run(fts, expression)
        assert all(term.startswith('"') for term in expression.split(" OR "))
