"""A scripted pydantic-ai model: ``Agent(ScriptedModel(...), ...)``, no API key (extra
``pydantic-ai``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from runtime_hooks._extras import missing_extra

from . import ModelRequest, Script, Step

with missing_extra("pydantic-ai", "runtime_hooks.testing.pydantic_ai"):
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

__all__ = ["ScriptedModel"]


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _request(messages: list[ModelMessage], info: AgentInfo) -> ModelRequest:
    results = {
        part.tool_call_id: _text(part.content)
        for message in messages for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    return ModelRequest(instructions=info.instructions or "", tool_results=results)


class ScriptedModel(FunctionModel):
    """A ``FunctionModel`` that answers from a script (:mod:`runtime_hooks.testing`).

    ``ScriptedModel(searches("cutover date"), "The cutover is on Friday.")``: the first model
    request gets one ``search_memory`` call, the second the final text. ``requests`` lists
    what each model request carried. Works under ``run``, ``iter`` and ``run_stream``.
    """

    def __init__(self, *steps: Step, on_request: Callable[[int], None] | None = None) -> None:
        self.script = Script(steps, on_request)
        super().__init__(self._respond, stream_function=self._stream)

    @property
    def requests(self) -> list[ModelRequest]:
        """What each model request carried, in order."""
        return self.script.requests

    async def _respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = self.script.answer(_request(messages, info))
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        return ModelResponse(parts=[
            ToolCallPart(call.name, dict(call.arguments), tool_call_id=call.call_id)
            for call in step
        ])

    async def _stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        step = self.script.answer(_request(messages, info))
        if isinstance(step, str):
            yield step
            return
        yield {
            i: DeltaToolCall(call.name, json.dumps(dict(call.arguments)),
                             tool_call_id=call.call_id)
            for i, call in enumerate(step)
        }
