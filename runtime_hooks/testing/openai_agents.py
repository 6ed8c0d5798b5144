"""A scripted OpenAI Agents SDK ``Model``, no API key (extra ``openai-agents``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from runtime_hooks._extras import missing_extra

from . import ModelRequest, Step

with missing_extra("openai-agents", "runtime_hooks.testing.openai_agents"):
    from agents.items import ModelResponse, TResponseOutputItem, TResponseStreamEvent
    from agents.testing import ModelCall, ScriptedModel, assistant_message, function_call

__all__ = ["ScriptedAgentsModel"]


def _items(step: Step) -> list[TResponseOutputItem]:
    if isinstance(step, str):
        return [assistant_message(step)]
    return [function_call(call.name, dict(call.arguments), call_id=call.call_id)
            for call in step]


def _output(output: Any) -> str:
    if isinstance(output, str):
        return output
    texts = [part.get("text") for part in output if isinstance(part, Mapping)]
    return "\n".join(text for text in texts if isinstance(text, str))


def _request(call: ModelCall) -> ModelRequest:
    items = call.input if isinstance(call.input, list) else []
    results = {
        item["call_id"]: _output(item.get("output"))
        for item in items
        if isinstance(item, Mapping) and item.get("type") == "function_call_output"
    }
    return ModelRequest(instructions=call.system_instructions or "", tool_results=results)


class ScriptedAgentsModel(ScriptedModel):
    """The SDK's ``agents.testing.ScriptedModel``, built from a recallbound script.

    ``Agent(name=..., model=ScriptedAgentsModel(searches("cutover date"), "Friday."), ...)``;
    ``requests`` lists what each model request carried (the instructions hold the automatic
    context). A request past the script's end raises the SDK's ``UnexpectedModelCall``.
    """

    def __init__(self, *steps: Step, on_request: Callable[[int], None] | None = None) -> None:
        super().__init__([_items(step) for step in steps])
        self.on_request = on_request
        self._requested = 0

    def _requesting(self) -> None:
        self._requested += 1
        if self.on_request is not None:
            self.on_request(self._requested)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self._requesting()
        return await super().get_response(*args, **kwargs)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        self._requesting()
        return super().stream_response(*args, **kwargs)

    @property
    def requests(self) -> list[ModelRequest]:
        """What each model request carried, in order."""
        return [_request(call) for call in self.calls]
