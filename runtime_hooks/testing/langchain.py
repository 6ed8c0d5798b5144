"""A scripted LangChain chat model for ``create_agent`` and hand-built LangGraph graphs, no API
key (extra ``langchain``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from runtime_hooks._extras import missing_extra

from . import ModelRequest, Script, Step

with missing_extra("langchain", "runtime_hooks.testing.langchain"):
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from pydantic import ConfigDict

__all__ = ["ScriptedChatModel"]


def _request(messages: Sequence[BaseMessage]) -> ModelRequest:
    instructions = "\n\n".join(
        str(message.text) for message in messages if isinstance(message, SystemMessage)
    )
    results = {
        message.tool_call_id: str(message.text) for message in messages
        if isinstance(message, ToolMessage)
    }
    return ModelRequest(instructions=instructions, tool_results=results)


def _message(step: Step) -> AIMessage:
    if isinstance(step, str):
        return AIMessage(content=step)
    return AIMessage(content="", tool_calls=[
        {"name": call.name, "args": dict(call.arguments), "id": call.call_id,
         "type": "tool_call"}
        for call in step
    ])


class ScriptedChatModel(BaseChatModel):
    """A chat model that answers from a script (:mod:`runtime_hooks.testing`).

    ``ScriptedChatModel(searches("cutover date"), "The cutover is on Friday.")``; ``requests``
    lists what each model request carried (the system message holds the automatic context).
    Sync and async: ``agent.invoke`` and ``agent.ainvoke`` both work. ``bind_tools`` accepts
    any tools and changes nothing: the script decides the calls.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    script: Script

    def __init__(
        self, *steps: Step, on_request: Callable[[int], None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(script=Script(steps, on_request), **kwargs)  # type: ignore[call-arg]

    @property
    def requests(self) -> list[ModelRequest]:
        """What each model request carried, in order."""
        return self.script.requests

    @property
    def _llm_type(self) -> str:
        return "recallbound-scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: list[str] | None = None,
        run_manager: Any = None, **kwargs: Any,
    ) -> ChatResult:
        reply = _message(self.script.answer(_request(messages)))
        return ChatResult(generations=[ChatGeneration(message=reply)])

    async def _agenerate(
        self, messages: list[BaseMessage], stop: list[str] | None = None,
        run_manager: Any = None, **kwargs: Any,
    ) -> ChatResult:
        return self._generate(messages, stop)
