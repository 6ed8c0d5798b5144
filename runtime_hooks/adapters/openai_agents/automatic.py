"""The automatic round: a ``call_model_input_filter`` that adds the rendered context."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from plugin.memory.state import WorkingState
from runtime_hooks._extras import missing_extra

from .binding import bound_run, current_invocation

with missing_extra("openai-agents", "runtime_hooks.adapters.openai_agents"):
    from agents.run_config import CallModelData, ModelInputData

StateSource = Callable[[CallModelData[Any]], "WorkingState | Awaitable[WorkingState]"]
"""The host's working state for a model request (default: :func:`latest_user_request`)."""


def _text(content: object) -> str:
    """The text of a message's content: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = [part.get("text") for part in content if isinstance(part, Mapping)]
        return "\n".join(text for text in texts if isinstance(text, str))
    return ""


def latest_user_request(data: CallModelData[Any]) -> WorkingState:
    """The default working state: the latest user message as ``current_request``."""
    for item in reversed(data.model_data.input):
        if isinstance(item, Mapping) and item.get("role") == "user":
            return WorkingState(_text(item.get("content")))
    return WorkingState("")


@attrs.frozen
class RecallInputFilter:
    """A ``call_model_input_filter``: the automatic round, its context added to the instructions.

    ``then`` is the host's own filter, applied first, so the rendered context is never trimmed
    away by it. The state comes from ``state`` (the host's), never from what the model wrote.
    ``per_request=False`` (default): the round runs once per invocation (the bound run) and
    every later request of it gets the same context; ``True``: a round before every request.
    """

    state: StateSource = latest_user_request
    then: Callable[[CallModelData[Any]], Any] | None = None
    per_request: bool = False

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        if self.then is not None:
            updated = self.then(data)
            if inspect.isawaitable(updated):
                updated = await updated
            data = dataclasses.replace(data, model_data=updated)
        run = bound_run("the recall input filter")

        async def prepare() -> str:
            state = self.state(data)
            if inspect.isawaitable(state):
                state = await state
            return (await run.prepare(state)).render()

        invocation = None if self.per_request else current_invocation.get()
        rendered = await (prepare() if invocation is None else invocation.context(prepare))
        model_data = data.model_data
        if not rendered:
            return model_data
        base = model_data.instructions
        instructions = f"{base}\n\n{rendered}" if base else rendered
        return ModelInputData(input=model_data.input, instructions=instructions)
