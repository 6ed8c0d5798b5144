"""What the model reads: search results, the prepared context, and retained-evidence checks.

Every string here that came from a retriever or a store went through
:func:`~plugin.memory.safe_text.one_line` (a rendered line cannot open a section); whatever the
allowance cut short is said in the bounded wording (:mod:`plugin.control.wording`), and a
retriever's failure in words of its own that never pose as a budget refusal and never carry
the retriever's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs

from plugin.control import BoundedRecallNotice, BudgetRefusal
from plugin.control.wording import NOT_EVIDENCE, left_out
from plugin.memory.planning import RecallQuery
from plugin.memory.preparation import PreparedRecall, WithheldReason
from plugin.memory.protocol import Bounded
from plugin.memory.safe_text import one_line
from plugin.memory.store import Evidence
from plugin.memory.turn import correction_line as correction_line

NOTHING_FOUND = "No matching memory was found."
PARTLY_FOUND = "No memory was found by the parts of this search that ran."

_FAILURE_WORDS = {
    "raised": "raised an error",
    "bad_result": "returned something that is not a search result",
    "bad_evidence": "returned a malformed evidence item",
}


IN_FLIGHT = "in_flight"
"""The failure reason of a call sent again while its first dispatch had no outcome yet."""


def failure_message(reason: str) -> str:
    """What the model reads when the memory backend failed (not a budget refusal)."""
    if reason == IN_FLIGHT:
        return ("Memory search not run again: this call was already dispatched, and its search "
                "is still running elsewhere or was interrupted before its outcome was "
                f"recorded, so it is not searched again. {NOT_EVIDENCE}")
    words = _FAILURE_WORDS.get(reason, _FAILURE_WORDS["raised"])
    return (f"Memory search failed: the memory backend {words}, so nothing was recalled by "
            f"this search. {NOT_EVIDENCE}")


Status = Literal["ok", "refused", "invalid", "failed"]


def search_content(rendered: str, bounded: Sequence[Bounded]) -> str:
    """What the model reads for a search that ran: evidence, then what was cut short."""
    notes = [f"Note: {part.message}" for part in bounded]
    if rendered:
        return "\n".join([rendered, *notes])
    if notes:  # never "nothing found" when part of the search did not run
        return "\n".join([PARTLY_FOUND, *notes])
    return NOTHING_FOUND


def in_flight(call_id: str) -> ToolResult:
    """The result of a call whose first dispatch has no outcome in the ledger yet."""
    return ToolResult(call_id=call_id, status="failed", content=failure_message(IN_FLIGHT),
                      failure=IN_FLIGHT)


def rejected_call(call_id: str, error: Exception) -> ToolResult:
    """The ``invalid`` result of a search call that was not run (it got no slot)."""
    return ToolResult(call_id=call_id, status="invalid",
                      content=f"Search call rejected: {one_line(str(error), limit=200)}. "
                              f"No search was run.")


@attrs.frozen(kw_only=True)
class ToolResult:
    """The result of one search call, as the model reads it."""

    call_id: str
    status: Status
    content: str
    slot: int | None = None
    evidence: tuple[Evidence, ...] = ()
    refusal: BudgetRefusal | None = None
    notes: tuple[str, ...] = ()
    """Degradations for traces and logs (not shown to the model; ``bounded`` is)."""
    bounded: tuple[Bounded, ...] = ()
    """Parts of the search the allowance cut short, in the bounded wording (also in
    ``content``): a refused nested read, sources left unread, an arm not run."""
    omitted: int = 0
    """Evidence items found but left out by the context caps (said in ``content``)."""
    failure: str | None = None
    """For status ``failed``: how the memory backend failed (``raised``, ``bad_result``,
    ``bad_evidence``); never the backend's own text."""
    dropped: int = 0
    """Evidence items the retriever returned for another principal or scope, or with an id
    that is not a valid id (not shown)."""

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready form for a tool-result message."""
        result: dict[str, object] = {"status": self.status, "content": self.content}
        if self.refusal is not None:
            result["refusal"] = self.refusal.as_tool_result()
        if self.evidence:
            # The ids of the rendered items only: valid ids, each shown in ``content``, so
            # they are bounded by the context caps like the text.
            result["evidence_ids"] = [item.id for item in self.evidence]
        if self.bounded:
            result["bounded"] = [part.as_dict() for part in self.bounded]
        if self.omitted:
            result["omitted"] = self.omitted
        if self.failure is not None:
            result["failure"] = self.failure
        return result


def _corrections_block(corrections: Sequence[Evidence], omitted: int) -> str:
    lines = [correction_line(c) for c in corrections]
    if omitted:
        lines.append(left_out(omitted, "correction"))
    return "Current corrections:\n" + "\n".join(lines)


@attrs.frozen(kw_only=True)
class PreparedContext:
    """What preparation adds to the model's context for this turn."""

    run_id: str
    query: RecallQuery
    evidence: tuple[Evidence, ...] = ()
    rendered: str = ""
    corrections: tuple[Evidence, ...] = ()
    """Current corrections shown, newest first, within the context caps."""
    notice: BoundedRecallNotice | None = None
    slots: tuple[int, ...] = ()
    """Slots the round's attempts took (base, delta)."""
    notes: tuple[str, ...] = ()
    corrections_omitted: int = 0
    """Current corrections left out by the context caps (said in :meth:`render`)."""
    bounded: tuple[Bounded, ...] = ()
    """Parts of the round the allowance or the preparation bound cut short (bounded wording)."""
    failure: str | None = None
    """How the memory backend failed this round, if it did (said in :meth:`render`)."""
    dropped: int = 0
    """Evidence items and corrections the retriever returned for another principal or scope,
    or with a bad id (not shown)."""

    def render(self) -> str:
        """The context block: corrections first, then evidence, then what was bounded.

        Every stored string is rendered as one inert line (no newline, no control
        character), so stored text cannot open a section of its own.
        """
        parts: list[str] = []
        if self.corrections or self.corrections_omitted:
            parts.append(_corrections_block(self.corrections, self.corrections_omitted))
        if self.rendered:
            parts.append(f"Recalled memory:\n{self.rendered}")
        if self.failure is not None:
            parts.append(f"Note: {failure_message(self.failure)}")
        if self.notice is not None:
            parts.append(f"Note: {self.notice.message}")
        parts.extend(f"Note: {part.message}" for part in self.bounded)
        return "\n\n".join(parts)


@attrs.frozen(kw_only=True)
class Validation:
    """The re-check of one piece of retained deliberate evidence.

    ``failed``: the memory backend failed the re-read (it is neither valid nor gone).
    """

    evidence_id: str
    status: Literal["valid", "gone", "not_retained", "bounded", "failed"]
    evidence: Evidence | None = None


_PREPARATION_WORDS = {
    WithheldReason.PREPARATION_BOUND: "query preparation ran out of its time bound",
    WithheldReason.NO_SLOT: "no slot was expected to be left for it when it was prepared",
    WithheldReason.TOKEN_LIMIT: "the query is longer than the embedding model reads",
    WithheldReason.ADAPTER_FAILED: "the embedding model failed on the query",
}


def preparation_bounded(prepared: PreparedRecall) -> tuple[Bounded, ...]:
    """The semantic arm withheld where it should have run, as a bounded part (or nothing).

    A store with no embedding, or a query with no text to embed, has no semantic arm to miss,
    so nothing is said; a bound, a spent allowance, a query past the model's token limit or a
    failing model each leave that arm out of a search that would have had it, and say so.
    """
    reason = prepared.semantic.withheld_reason
    if reason is not None and reason in _PREPARATION_WORDS:
        return (Bounded.of("semantic_arm", reason.value, _PREPARATION_WORDS[reason]),)
    return ()
