"""A replayed tool call: the outcome the ledger recorded, never a second search.

A call's identity is (run, call id, canonical arguments). The ledger keeps each dispatched
call's outcome (:class:`~plugin.control.ledger.CallRecord`); a replay of the identity, in this
process or another, answers from it:

- a search that ran answers with its evidence re-read under the run's validation bound
  (:meth:`RecallHooks.validate_retained`, kept in the ledger): what is gone is left out, and
  what the bound no longer lets be re-checked, or the memory backend cannot re-read, is said
  in the bounded wording (in ``bounded`` too: never "nothing found" for items the search did
  find), as is each part of the search the allowance cut short (kept in the record's
  ``reason``: never "nothing found" for a search that did not wholly run);
- a refused call keeps its refusal, a failed one its failure;
- a call claimed but without an outcome (still searching elsewhere, or interrupted before its
  outcome was written) is ``failed`` with the reason ``in_flight``: never searched again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, get_args

from plugin.control import BudgetRefusal, RefusalReason, wording
from plugin.control.ledger import PENDING, CallRecord
from plugin.memory.enforce import Bounded
from plugin.memory.pipeline import render
from plugin.memory.protocol import Part

from .results import ToolResult, failure_message, in_flight, search_content

if TYPE_CHECKING:
    from .hooks import RecallHooks


CUT_SHORT = "bounded:"
"""How an ``ok`` call's record keeps the parts the allowance cut short, as the model read
them: ``bounded:`` and a JSON list of ``[part, reason, message]`` in its ``reason``."""
_MESSAGE_LIMIT = 2048


def cut_short(parts: Sequence[Bounded]) -> str | None:
    """The ``reason`` an ``ok`` call's record keeps for ``parts`` (None when none)."""
    kept = [[part.part, part.reason, part.message] for part in parts]
    return CUT_SHORT + json.dumps(kept, ensure_ascii=False) if kept else None


def recorded_cut_short(reason: str | None) -> tuple[Bounded, ...]:
    """The parts an ``ok`` call's record says were cut short, worded as the model read them
    (what a damaged record holds beyond that is left out)."""
    if not reason or not reason.startswith(CUT_SHORT):
        return ()
    try:
        kept = json.loads(reason[len(CUT_SHORT):])
    except ValueError:
        return ()
    return tuple(Bounded(part=item[0], reason=item[1], message=item[2])
                 for item in (kept if isinstance(kept, list) else [])
                 if isinstance(item, list) and len(item) == 3
                 and all(isinstance(value, str) for value in item)
                 and item[0] in get_args(Part) and len(item[2]) <= _MESSAGE_LIMIT)


def recorded_refusal(record: CallRecord) -> BudgetRefusal | None:
    """The typed refusal a record kept, rebuilt (None when its reason is not a refusal's)."""
    try:
        reason = RefusalReason(record.reason)
    except ValueError:
        return None
    return BudgetRefusal(reason=reason, run_id=record.run_id, reserved=record.reserved,
                         executed=record.executed)


def _not_shown(count: int, why: str, reason: str) -> tuple[Bounded, ...]:
    """Items a replayed search found before but cannot show again, as a bounded part."""
    if not count:
        return ()
    return (Bounded(part="recheck", reason=reason, message=wording.bounded(
        f"{count} item(s) this search found before could not be {why}, so they are not "
        f"shown again")),)


async def replay_call(
    hooks: RecallHooks, record: CallRecord, *, scope: str, principal: str
) -> ToolResult:
    """The result of a replayed call, from its record; see the module docstring."""
    if record.status == PENDING:
        return in_flight(record.call_id)
    if record.status == "refused":
        refusal = recorded_refusal(record)
        if refusal is not None:
            return ToolResult(call_id=record.call_id, status="refused", content=refusal.message,
                              refusal=refusal)
    if record.status != "ok":
        reason = record.reason or "raised"
        return ToolResult(call_id=record.call_id, status="failed",
                          content=failure_message(reason), slot=record.slot, failure=reason)
    checks = (await hooks.validate_retained(
        list(record.evidence_ids), run_id=record.run_id, scope=scope, principal=principal)
        if record.evidence_ids else [])
    valid = [c.evidence for c in checks if c.status == "valid" and c.evidence is not None]
    unchecked = record.more + sum(1 for c in checks if c.status in ("bounded", "not_retained"))
    rendered = render(valid, hooks.caps)
    unread = sum(1 for c in checks if c.status == "failed")
    not_shown = (_not_shown(unchecked, "re-checked (the run's re-check bound is spent)",
                            "validation")
                 + _not_shown(unread, "re-read (the memory backend cannot re-read items, "
                                      "failed, or did not answer in time)", "reread"))
    bounded = recorded_cut_short(record.reason) + not_shown
    if not_shown and not rendered.text:  # it found items: never "nothing found" for them
        text = "\n".join(f"Note: {part.message}" for part in bounded)
    else:
        text = search_content(rendered.text, bounded)
    return ToolResult(call_id=record.call_id, status="ok", content=text, slot=record.slot,
                      evidence=tuple(rendered.items), bounded=bounded,
                      omitted=rendered.omitted)
