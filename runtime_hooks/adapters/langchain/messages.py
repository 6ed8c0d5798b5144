"""How LangChain messages map to search calls, results and the system message."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

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


def not_dispatched(call_id: str) -> ToolResult:
    """The answer of a call no batch dispatched: nothing was searched, and the model is
    told which piece is missing."""
    return ToolResult(
        call_id=call_id, status="failed",
        content="This search call was not dispatched by the recall hook, so no search was run "
        "(install RecallMiddleware, or run the tools through RecallToolNode).",
    )


def pending_search_calls(messages: Sequence[AnyMessage]) -> list[ToolCall]:
    """The last ``AIMessage``'s search calls that have no ``ToolMessage`` after it yet."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            answered = {m.tool_call_id for m in messages[index + 1:]
                        if isinstance(m, ToolMessage)}
            return [
                ToolCall(call_id=call["id"], arguments=call["args"])
                for call in message.tool_calls
                if call["name"] == SEARCH_TOOL.name and call["id"] is not None
                and call["id"] not in answered
            ]
    return []


def system_with_context(system: SystemMessage | None, block: str) -> SystemMessage:
    """The system message with the rendered recall block appended (or made of it)."""
    if system is None:
        return SystemMessage(content=block)
    if isinstance(system.content, str):
        return SystemMessage(content=f"{system.content}\n\n{block}" if system.content else block)
    return SystemMessage(content=[*system.content, {"type": "text", "text": block}])
