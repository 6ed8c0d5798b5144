"""What the model reads of evidence: whole inert lines under the host's context caps.

Every string in a rendered line (the kind, the id, the text) went through
:func:`~plugin.memory.safe_text.one_line`, so a retriever's or a store's text cannot open a
section of its own or inject control characters. What the caps left out is said in the
bounded wording (:mod:`plugin.control.wording`), never dropped in silence.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from plugin.control.wording import left_out

from .protocol import ContextCaps
from .safe_text import one_line
from .store import Evidence


@attrs.frozen(kw_only=True)
class Rendered:
    """Evidence rendered under the context caps, and what was left out."""

    items: tuple[Evidence, ...]
    text: str
    omitted: int
    """Evidence items ranked but left out by the caps."""


def evidence_line(item: Evidence, label: str | None = None, *, limit: int | None = None) -> str:
    """One evidence item as one inert line: ``- [kind id] text``, the text cut to ``limit``
    characters first (so no per-character work ever reads past the byte cap).

    The whole id is shown (the hooks admit only valid ids, at most 512 bytes), so it counts
    against the caps like the text, and the id the model reads is the id it can cite.
    """
    kind = label if label is not None else one_line(item.kind, limit=32)
    return f"- [{kind} {one_line(item.id, limit=512)}] {one_line(item.text, limit=limit)}"


def line_bytes(line: str) -> int:
    return len(line.encode("utf-8", "surrogatepass"))


def _fit(
    evidence: Sequence[Evidence], caps: ContextCaps, label: str | None = None
) -> tuple[list[Evidence], list[str]]:
    """The items whose whole lines (under ``label``, if given) fit the caps, in order, and
    their lines."""
    lines: list[str] = []
    kept: list[Evidence] = []
    used = 0
    for item in evidence:
        if len(kept) >= caps.max_items:
            break
        line = evidence_line(item, label, limit=caps.max_bytes)
        size = line_bytes(line) + (1 if lines else 0)
        if used + size > caps.max_bytes:
            continue
        lines.append(line)
        kept.append(item)
        used += size
    return kept, lines


def fit(
    evidence: Sequence[Evidence], caps: ContextCaps, *, label: str | None = None
) -> tuple[Evidence, ...]:
    """The items :func:`render` would show, without rendering them (a retriever choosing what
    to recover sources for; the hooks render once). With ``label``, each line is measured as
    shown under that label (a correction's line says ``correction`` whatever its kind)."""
    return tuple(_fit(evidence, caps, label)[0])


def render(evidence: Sequence[Evidence], caps: ContextCaps, *, unexamined: int = 0) -> Rendered:
    """Render whole evidence lines within ``caps``; an item that does not fit is left out.

    ``unexamined`` items (past what the hooks examine of a read) are counted as left out too.
    """
    kept, lines = _fit(evidence, caps)
    omitted = len(evidence) - len(kept) + unexamined
    if omitted:
        lines.append(left_out(omitted, "item"))
    return Rendered(items=tuple(kept), text="\n".join(lines), omitted=omitted)
