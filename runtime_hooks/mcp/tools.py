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

from plugin.control.policy import AllowancePolicy
from plugin.control.refusal import BudgetRefusal
from plugin.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LedgerError,
    RecallboundError,
    RunIdentityError,
)
from plugin.memory.safe_text import one_line
from plugin.memory.state import WorkingState
from plugin.memory.store.errors import InvalidMemoryError, MemoryConflictError
from plugin.memory.store.values import check_memory_id
from runtime_hooks.adapters.tool import SEARCH_TOOL
from runtime_hooks.calls import shown_name
from runtime_hooks.hooks import PreparedContext, ToolResult

from .errors import McpSessionError
from .identity import CALL_ID_META_KEY, RUN_ID_META_KEY

SEARCH_MEMORY = SEARCH_TOOL.name
RECALL_CONTEXT = "recall_context"
REMEMBER = "remember"
FORGET = "forget"

MAX_STATE_BYTES = 64 * 1024
"""The largest working state read by ``recall_context`` (UTF-8 bytes of its JSON form)."""

INSTRUCTIONS = (
    "Long-term memory with a bounded recall allowance per run. A refusal that says recall was "
    "bounded is not evidence that no memory exists."
)


def run_words(policy: AllowancePolicy) -> str:
    """What a call gets, for the model: the run it belongs to and that run's allowance."""
    searches = "search" if policy.max_searches == 1 else "searches"
    rounds = "round" if policy.max_rounds == 1 else "rounds"
    return (
        f" Each run gets at most {policy.max_searches} {searches} in at most "
        f"{policy.max_rounds} {rounds} (the parallel calls of one response share a round), "
        f"within {policy.deadline_s:g} s of its first search. Calls belong to the run the client "
        f"names in the request's _meta key {RUN_ID_META_KEY!r}; without one, to this client's "
        "current run, which ends at its deadline (the next call then starts a new run). When "
        "the allowance is spent the tool says recall was bounded: that is not evidence that "
        "no memory exists."
    )


CALL_WORDS = (
    f" A call named by the _meta key {CALL_ID_META_KEY!r} and sent again (same run, same "
    "arguments) returns its recorded result without searching again."
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


_STATUS = {"type": "string", "enum": ["ok", "refused", "invalid", "failed"]}
_ERROR = {"type": "string", "description": "The error type (status invalid or failed)."}
_REFUSAL = {
    "type": "object",
    "description": "Why recall was bounded (status refused).",
    "properties": {
        "reason": {"type": "string"}, "reserved": {"type": "integer"},
        "executed": {"type": "integer"}, "message": {"type": "string"},
    },
    "required": ["reason"],
}
SEARCH_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": _STATUS,
        "content": {**_TEXT, "description": "What the model reads (evidence or why not)."},
        "evidence_ids": _TEXTS,
        "refusal": _REFUSAL,
        "error": _ERROR,
    },
    "required": ["status", "content"],
}
CONTEXT_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": _STATUS,
        "context": {**_TEXT, "description": "The context to add before the next model call."},
        "evidence_ids": _TEXTS,
        "correction_ids": _TEXTS,
        "notice": _REFUSAL,
        "content": _TEXT,
        "error": _ERROR,
    },
    "required": ["status"],
}


REMEMBER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "text": {**_TEXT, "description": "The memory, in plain words (one fact or decision)."},
        "id": {"type": ["string", "null"],
               "description": "Optional; an id you got from remember or a search: that "
                              "memory is replaced. Absent or null: a new memory."},
    },
    "required": ["text"],
    "additionalProperties": False,
}
FORGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {**_TEXT, "description": "The memory's id."}},
    "required": ["id"],
    "additionalProperties": False,
}
WRITE_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": _STATUS, "id": _TEXT, "forgotten": {"type": "boolean"},
        "content": _TEXT, "error": _ERROR,
    },
    "required": ["status", "content"],
}


def write_tools(max_memory_bytes: int) -> list[types.Tool]:
    """``remember`` and ``forget`` (listed when the server has a memory store to write)."""
    return [
        types.Tool(
            name=REMEMBER,
            description=(
                "Store one memory for later recall (for this user and project). Returns the "
                "memory's id; giving an id replaces that memory. At most "
                f"{max_memory_bytes} bytes of text. Takes nothing from the recall allowance."
            ),
            input_schema=REMEMBER_SCHEMA,
            output_schema=WRITE_OUTPUT,
        ),
        types.Tool(
            name=FORGET,
            description=("Delete one memory by its id, so that no later recall returns it. "
                         "Says whether it was there. Takes nothing from the recall allowance."),
            input_schema=FORGET_SCHEMA,
            output_schema=WRITE_OUTPUT,
        ),
    ]


def _only(arguments: Mapping[str, Any], required: str, *optional: str) -> None:
    """Only these names, each a string; an optional one may be absent or null (clients fill
    optional fields with null)."""
    unknown = sorted(set(arguments) - {required, *optional})
    if unknown:
        raise InvalidToolArgumentsError(f"unknown argument {shown_name(unknown[0])}")
    for name in (required, *optional):
        given = name == required or arguments.get(name) is not None
        if given and not isinstance(arguments.get(name), str):
            raise InvalidToolArgumentsError(f"{name!r} must be a string")


def remember_arguments(arguments: Mapping[str, Any], max_bytes: int) -> tuple[str, str | None]:
    """``remember``'s text and id, checked (the text at most ``max_bytes`` UTF-8 bytes)."""
    _only(arguments, "text", "id")
    text: str = arguments["text"]
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidToolArgumentsError("'text' is not valid Unicode text") from None
    if size > max_bytes:
        raise InvalidToolArgumentsError(
            f"'text' is {size} bytes; a memory holds at most {max_bytes}")
    return text, arguments.get("id")


def forget_argument(arguments: Mapping[str, Any]) -> str:
    """``forget``'s id, checked by the rule ``remember`` holds ids to (an id no memory can
    have is an invalid call, never echoed back whole)."""
    _only(arguments, "id")
    try:
        return check_memory_id(arguments["id"])
    except InvalidMemoryError as exc:
        raise InvalidToolArgumentsError(str(exc)) from None


def remembered_result(memory_id: str) -> types.CallToolResult:
    text = f"Remembered as {memory_id!r}."
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"status": "ok", "id": memory_id, "content": text},
        is_error=False,
    )


def forgot_result(memory_id: str, forgotten: bool) -> types.CallToolResult:
    text = (f"Forgot {memory_id!r}." if forgotten
            else f"There was no memory {one_line(memory_id, limit=80)!r} to forget.")
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"status": "ok", "id": memory_id, "forgotten": forgotten,
                            "content": text},
        is_error=False,
    )


def tools(policy: AllowancePolicy | None = None) -> list[types.Tool]:
    """The tools the server lists; their descriptions state ``policy``'s allowance."""
    words = run_words(policy or AllowancePolicy())
    return [
        types.Tool(
            name=SEARCH_MEMORY,
            description=SEARCH_TOOL.description + words + CALL_WORDS,
            input_schema=SEARCH_TOOL.json_schema(),
            output_schema=SEARCH_OUTPUT,
        ),
        types.Tool(
            name=RECALL_CONTEXT,
            description=(
                "Prepare recalled memory for the next model call from the agent's working "
                "state (one automatic recall round). Returns the context to add, or a notice "
                "that recall was bounded." + words
            ),
            input_schema=STATE_SCHEMA,
            output_schema=CONTEXT_OUTPUT,
        ),
    ]


def working_state(arguments: Mapping[str, Any]) -> WorkingState:
    """The working state in ``recall_context``'s arguments (bounded in size first)."""
    try:
        # a lone surrogate counts as its three bytes here; the state's own check names it
        size = len(json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
                   .encode("utf-8", "surrogatepass"))  # compact: as a client may send it
    except (TypeError, ValueError):  # pragma: no cover - the SDK hands parsed JSON
        raise InvalidArgumentError("the working state is not JSON") from None
    if size > MAX_STATE_BYTES:
        raise InvalidArgumentError(
            f"the working state is larger than {MAX_STATE_BYTES} bytes of UTF-8 JSON"
        )
    return WorkingState.from_dict(arguments)


def search_result(result: ToolResult) -> types.CallToolResult:
    """A search call's result: evidence, the typed refusal, or why the call was rejected.

    The bounded sentence appears once in each form: the text block says it, and so does the
    structured content's ``content`` (its ``refusal`` keeps the reason and the counts only).
    Every error result names its error.
    """
    structured = result.as_dict()
    refusal = structured.get("refusal")
    if isinstance(refusal, dict):
        structured["refusal"] = {k: v for k, v in refusal.items() if k not in ("message", "status")}
    if result.status == "invalid":
        structured["error"] = "InvalidSearchCall"
    elif result.status == "failed":
        structured["error"] = "SearchFailed"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.content)],
        structured_content=structured,
        is_error=result.status in ("invalid", "failed"),
    )


def refused_result(refusal: BudgetRefusal) -> types.CallToolResult:
    """A search refused before any round (the caller's runs per hour): data, not an error."""
    return search_result(ToolResult(call_id="", status="refused", content=refusal.message,
                                    refusal=refusal))


def context_result(context: PreparedContext) -> types.CallToolResult:
    """The automatic round's rendered context, or its bounded notice."""
    structured: dict[str, Any] = {
        "status": "ok" if context.notice is None else "refused",
        "context": context.render(),
        "evidence_ids": [item.id for item in context.evidence],
        "correction_ids": [item.id for item in context.corrections],
    }
    if context.notice is not None:
        # the notice's sentence is in "context" already: said once
        structured["notice"] = {
            "reason": context.notice.reason.value, "reserved": context.notice.reserved,
            "executed": context.notice.executed,
        }
    if context.bounded:
        structured["bounded"] = [part.as_dict() for part in context.bounded]
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=structured["context"] or "(nothing)")],
        structured_content=structured,
        is_error=False,
    )


class InvalidToolArgumentsError(RecallboundError, ValueError):
    """A write tool's arguments are not what its schema says (nothing was written)."""


_INVALID: tuple[type[Exception], ...] = (
    InvalidArgumentError, InvalidArgumentTypeError, McpSessionError,
    RunIdentityError, InvalidToolArgumentsError, InvalidMemoryError, MemoryConflictError,
)


def error_result(exc: Exception) -> types.CallToolResult:
    """A typed error result: ``invalid`` for a request the server will not run, ``failed``
    when the server could not run it (a ledger fault: fail closed, nothing was searched)."""
    if isinstance(exc, MemoryConflictError):  # never says whether, or whose, the id is
        status, text = "invalid", ("Request rejected: this memory id cannot be used here; "
                                   "leave the id out to store a new memory.")
    elif isinstance(exc, _INVALID):
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


def unknown_tool(name: str, offered: list[str]) -> types.CallToolResult:
    text = (f"Unknown tool {one_line(name, limit=80)!r}: this server offers "
            f"{', '.join(repr(tool) for tool in offered)}.")
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"status": "invalid", "error": "UnknownTool", "content": text},
        is_error=True,
    )
