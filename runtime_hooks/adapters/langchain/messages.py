"""How LangChain messages map to search calls, results and the system message."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plugin.memory.state import WorkingState
from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import ToolCall, ToolResult

from ..tool import SEARCH_TOOL

with missing_extra("langchain", "runtime_hooks.adapters.langchain"):
    from langchain_core.messages import (
        AIMessage,
        AnyMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )


StateOf = Callable[[Sequence[AnyMessage]], WorkingState | None]


def latest_request(messages: Sequence[AnyMessage]) -> WorkingState | None:
    """The default working state: the latest user message as ``current_request``."""
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            text = str(message.text).strip()
            return WorkingState(text) if text else None
    return None


def tool_message(result: ToolResult) -> ToolMessage:
    """A search call's result as the model reads it; anything but ``ok`` is an error."""
    return ToolMessage(
        content=json.dumps(result.as_dict(), ensure_ascii=False),
        tool_call_id=result.call_id,
        name=SEARCH_TOOL.name,
        status="success" if result.status == "ok" else "error",
    )


def batch_answers(
    results: Sequence[ToolResult], edits: Mapping[str, Mapping[str, Any]]
) -> list[ToolMessage]:
    """The ``ToolMessage`` answers of a dispatched batch: none for a call a reviewer edited,
    which the tool node runs in its place (the tool answers it with the stored result)."""
    return [tool_message(result) for result in results if result.call_id not in edits]


def not_dispatched(call_id: str) -> ToolResult:
    """The answer of a call no batch dispatched: nothing was searched, and the model is
    told which piece is missing."""
    return ToolResult(
        call_id=call_id, status="failed",
        content="This search call was not dispatched by the recall hook, so no search was run "
        "(install RecallMiddleware, or run the tools through RecallToolNode).",
    )


REVIEWER_EDITS = "hitl_edited_tool_calls"
"""Where LangChain's ``HumanInTheLoopMiddleware`` keeps a reviewer's edits, by call id: the
model's call stays in its message, and the tool node runs the edited call in its place."""


def reviewer_edits(state: Mapping[str, object]) -> dict[str, Mapping[str, Any]]:
    """The reviewer's edited calls in the agent state (``{}`` without a review)."""
    edits = state.get(REVIEWER_EDITS)
    if not isinstance(edits, Mapping):
        return {}
    return {cid: edit for cid, edit in edits.items() if isinstance(edit, Mapping)}


def pending_search_calls(
    messages: Sequence[AnyMessage], edits: Mapping[str, Mapping[str, Any]] | None = None
) -> list[ToolCall]:
    """The last ``AIMessage``'s search calls that have no ``ToolMessage`` after it yet.

    A call a reviewer edited (``edits``, see :func:`reviewer_edits`) is searched with the
    reviewer's arguments, and not at all when the reviewer made it another tool's call."""
    edits = edits or {}
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            answered = {m.tool_call_id for m in messages[index + 1:]
                        if isinstance(m, ToolMessage)}
            found: list[ToolCall] = []
            for call in message.tool_calls:
                call_id, name, arguments = call["id"], call["name"], call["args"]
                if call_id is None or call_id in answered:
                    continue
                edit = edits.get(call_id, {})
                name, arguments = edit.get("name", name), edit.get("args", arguments)
                if name == SEARCH_TOOL.name:
                    found.append(ToolCall(call_id=call_id, arguments=arguments))
            return found
    return []


def system_with_context(system: SystemMessage | None, block: str) -> SystemMessage:
    """The system message with the rendered recall block appended (or made of it)."""
    if system is None:
        return SystemMessage(content=block)
    if isinstance(system.content, str):
        return SystemMessage(content=f"{system.content}\n\n{block}" if system.content else block)
    return SystemMessage(content=[*system.content, {"type": "text", "text": block}])
