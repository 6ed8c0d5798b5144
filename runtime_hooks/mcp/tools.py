"""The server's two tools and how their results read on the wire.

``search_memory`` is the adapters' tool (:data:`~runtime_hooks.adapters.tool.SEARCH_TOOL`):
same name, same schema, same refusals; its description adds how the run is chosen.
``recall_context`` takes the working state as structured arguments (the fields of
:class:`~plugin.WorkingState`) and runs the automatic round. Neither takes a principal, a
scope of its own choosing or a run id: those come from the server (see
:mod:`runtime_hooks.mcp.trust` and :mod:`runtime_hooks.mcp.identity`).

Every result carries a text block for the model and ``structuredContent`` with a ``status``:
``ok``, ``refused`` (recall was bounded: data, not an error), ``invalid`` or ``failed``
(``isError`` set; nothing was searched unless the status says the search failed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import mcp_types as types

from plugin.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LedgerError,
    RecallboundError,
    RunIdentityError,
)
from plugin.memory.safe_text import one_line
from plugin.memory.state import WorkingState
from runtime_hooks.adapters.tool import SEARCH_TOOL
from runtime_hooks.hooks import PreparedContext, ToolResult

from .errors import McpSessionError
from .identity import RUN_ID_META_KEY

SEARCH_MEMORY = SEARCH_TOOL.name
RECALL_CONTEXT = "recall_context"

MAX_STATE_CHARS = 64 * 1024
"""The longest working state read by ``recall_context`` (characters of its JSON form)."""

_RUN_WORDS = (
    f" The run is the one the client names in the request's _meta key {RUN_ID_META_KEY!r}; "
    "without it, this whole client session is one run and shares one allowance."
)

_TEXT = {"type": "string"}
_TEXTS = {"type": "array", "items": _TEXT}
STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "current_request": {**_TEXT, "description": "The user's current message."},
        "objective": {**_TEXT, "description": "What the work as a whole is for."},
        "next_action": {**_TEXT, "description": "What the agent is about to do."},
        "tasks": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"text": _TEXT, "done": {"type": "boolean"}},
                "required": ["text"],
                "additionalProperties": False,
            },
        },
        "open_questions": _TEXTS,
        "constraints": _TEXTS,
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"text": _TEXT, "entities": _TEXTS},
                "required": ["text"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["current_request"],
    "additionalProperties": False,
}


def tools() -> list[types.Tool]:
    """The tools the server lists."""
    return [
        types.Tool(
            name=SEARCH_MEMORY,
            description=SEARCH_TOOL.description + _RUN_WORDS,
            input_schema=SEARCH_TOOL.json_schema(),
        ),
        types.Tool(
            name=RECALL_CONTEXT,
            description=(
                "Prepare recalled memory for the next model call from the agent's working "
                "state (one automatic recall round). Returns the context to add, or a notice "
                "that recall was bounded, which is not evidence that no memory exists."
                + _RUN_WORDS
            ),
            input_schema=STATE_SCHEMA,
        ),
    ]


def working_state(arguments: Mapping[str, Any]) -> WorkingState:
    """The working state in ``recall_context``'s arguments (bounded in size first)."""
    try:
        size = len(json.dumps(arguments, ensure_ascii=False))
    except (TypeError, ValueError):  # pragma: no cover - the SDK hands parsed JSON
        raise InvalidArgumentError("the working state is not JSON") from None
    if size > MAX_STATE_CHARS:
        raise InvalidArgumentError(
            f"the working state is longer than {MAX_STATE_CHARS} characters"
        )
    return WorkingState.from_dict(arguments)


def search_result(result: ToolResult) -> types.CallToolResult:
    """A search call's result: evidence, the typed refusal, or why the call was rejected."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.content)],
        structured_content=result.as_dict(),
        is_error=result.status in ("invalid", "failed"),
    )


def context_result(context: PreparedContext) -> types.CallToolResult:
    """The automatic round's rendered context, or its bounded notice."""
    structured: dict[str, Any] = {
        "status": "ok" if context.notice is None else "refused",
        "context": context.render(),
        "evidence_ids": [item.id for item in context.evidence],
        "correction_ids": [item.id for item in context.corrections],
    }
    if context.notice is not None:
        structured["notice"] = {
            "reason": context.notice.reason.value, "message": context.notice.message,
        }
    if context.bounded:
        structured["bounded"] = [part.as_dict() for part in context.bounded]
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=structured["context"] or "(nothing)")],
        structured_content=structured,
        is_error=False,
    )


_INVALID: tuple[type[RecallboundError], ...] = (
    InvalidArgumentError, InvalidArgumentTypeError, McpSessionError, RunIdentityError,
)


def error_result(exc: Exception) -> types.CallToolResult:
    """A typed error result: ``invalid`` for a request the server will not run, ``failed``
    when the server could not run it (a ledger fault: fail closed, nothing was searched)."""
    if isinstance(exc, _INVALID):
        status, text = "invalid", f"Request rejected: {one_line(str(exc), limit=300)}."
    elif isinstance(exc, LedgerError):
        status = "failed"
        text = ("Recall is unavailable: the allowance ledger is locked or could not be reached, "
                "so nothing was searched. This is not evidence that no memory exists.")
    elif isinstance(exc, RecallboundError):
        status, text = "failed", f"Recall failed: {one_line(str(exc), limit=300)}."
    else:
        status, text = "failed", f"Recall failed ({type(exc).__name__})."
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"status": status, "error": type(exc).__name__, "content": text},
        is_error=True,
    )


def unknown_tool(name: str) -> types.CallToolResult:
    text = f"Unknown tool {one_line(name, limit=80)!r}: this server offers " \
           f"{SEARCH_MEMORY!r} and {RECALL_CONTEXT!r}."
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"status": "invalid", "error": "UnknownTool", "content": text},
        is_error=True,
    )
