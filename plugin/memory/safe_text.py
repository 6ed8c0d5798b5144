"""Stored text as one inert line of rendered context.

Memory text, ids and correction notices are data that someone else wrote. Rendered as they
are, a newline lets them open a section of their own (``"\\n\\nRecalled memory:\\n- [memory
x] ..."``), and control characters (ESC, NUL, bidi overrides) reach the model or a terminal.
:func:`one_line` makes any string safe to place inside a rendered line: control, line and
paragraph separators and bidi controls become spaces, runs of whitespace collapse, lone
surrogates become U+FFFD. Nothing else changes, so what the text says is kept.
"""

from __future__ import annotations

import re
import unicodedata

_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_SPACES = re.compile(r"\s+")


def _inert(char: str) -> str:
    if char in _BIDI:
        return " "
    category = unicodedata.category(char)
    if category in ("Cc", "Zl", "Zp"):
        return " "
    if category == "Cs":  # a lone surrogate: not text
        return "\ufffd"
    return char


def reads_as_itself(item_id: str) -> bool:
    """Whether ``item_id`` reads as itself inside a rendered item's tag (``[memory ID]``):
    :func:`one_line` leaves it as it is (no edge or doubled space, no control or bidi
    character), and it holds no ``]``, which would close the tag and let the rest of the id
    read as another item's. So the id the model reads is the id it can cite."""
    return "]" not in item_id and one_line(item_id) == item_id


def one_line(text: str, *, limit: int | None = None) -> str:
    """``text`` as one line with no control character; at most ``limit`` characters."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + "\u2026"
    if text.isprintable() and _BIDI.isdisjoint(text):
        cleaned = text  # the common case, checked in C: nothing to make inert
    else:
        cleaned = "".join(_inert(char) for char in text)
    return _SPACES.sub(" ", cleaned).strip()
