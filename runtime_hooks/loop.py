"""A minimal reference agent loop: where the two hooks go.

No LLM: a :class:`ScriptedModel` plays back the steps it is given (tool calls or an answer)
and records what it was shown, so the loop is deterministic and testable. A real integration
has the same shape: bind the run at its boundary, call :meth:`RecallHooks.prepare` before each
model call, and route the model's search calls through :meth:`RecallHooks.dispatch`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal, Protocol

import attrs

from plugin.memory.state import WorkingState

from .hooks import PreparedContext, RecallHooks, ToolCall, ToolResult


@attrs.frozen(kw_only=True)
class Message:
    """One message of the conversation the model sees."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    call_id: str | None = None


@attrs.frozen(kw_only=True)
class ModelStep:
    """What the model does at one call: emit search calls, or answer."""

    tool_calls: tuple[ToolCall, ...] = ()
    answer: str | None = None


class Model(Protocol):
    """The model side of the loop."""

    async def respond(self, messages: Sequence[Message]) -> ModelStep:
        """The model's next step given the conversation so far."""
        ...


@attrs.define
class ScriptedModel:
    """Plays back ``steps`` in order and records every conversation it was shown."""

    steps: list[ModelStep]
    shown: list[tuple[Message, ...]] = attrs.Factory(list)

    async def respond(self, messages: Sequence[Message]) -> ModelStep:
        self.shown.append(tuple(messages))
        if not self.steps:
            return ModelStep(answer="(the script has no more steps)")
        return self.steps.pop(0)


@attrs.frozen(kw_only=True)
class Preparation:
    """A preparation phase as the transcript records it."""

    context: PreparedContext


@attrs.frozen(kw_only=True)
class Dispatch:
    """A tool-dispatch phase as the transcript records it."""

    calls: tuple[ToolCall, ...]
    results: tuple[ToolResult, ...]


@attrs.frozen(kw_only=True)
class Transcript:
    run_id: str
    events: tuple[Preparation | Dispatch, ...]
    answer: str | None


@attrs.define(eq=False)
class AgentLoop:
    """The reference loop. ``automatic_recall=False`` models a host without the preparation hook."""

    hooks: RecallHooks
    model: Model
    automatic_recall: bool = True
    max_steps: int = 8

    async def run(
        self, state: WorkingState, *, run_id: str, scope: str, principal: str
    ) -> Transcript:
        """Run the model until it answers (or ``max_steps`` calls)."""
        events: list[Preparation | Dispatch] = []
        messages: list[Message] = [Message(role="user", content=state.current_request)]
        with self.hooks.bind_run():  # the run boundary: tools in copied contexts see permits
            for _ in range(self.max_steps):
                shown = messages
                if self.automatic_recall:  # preparation: before the model is called
                    context = await self.hooks.prepare(
                        state, run_id=run_id, scope=scope, principal=principal
                    )
                    events.append(Preparation(context=context))
                    shown = [Message(role="system", content=context.render()), *messages]
                step = await self.model.respond(shown)
                if not step.tool_calls:
                    return Transcript(run_id=run_id, events=tuple(events), answer=step.answer)
                # tool dispatch: the model's search calls of this turn
                results = await self.hooks.dispatch(
                    step.tool_calls, run_id=run_id, scope=scope, principal=principal
                )
                events.append(Dispatch(calls=step.tool_calls, results=tuple(results)))
                messages.append(Message(
                    role="assistant",
                    content=json.dumps([
                        {"id": c.call_id, "arguments": c.arguments} for c in step.tool_calls
                    ]),
                ))
                messages.extend(
                    Message(role="tool", content=json.dumps(r.as_dict()), call_id=r.call_id)
                    for r in results
                )
        return Transcript(run_id=run_id, events=tuple(events), answer=None)
