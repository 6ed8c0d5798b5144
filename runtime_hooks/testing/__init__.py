"""Scripted models for tests and examples: agents with recall, no API key, no network.

A *script* is the model's answers, one step per model request: a string is a final text
answer; a sequence of :class:`ScriptedCall` is one model response asking for those tool calls
(in parallel). Each framework has a model built from the same steps, in its own module (which
imports that framework; this one imports none):

* ``runtime_hooks.testing.pydantic_ai``: :class:`~runtime_hooks.testing.pydantic_ai.ScriptedModel`,
  a pydantic-ai ``FunctionModel`` (``run``, ``iter`` and ``run_stream``);
* ``runtime_hooks.testing.langchain``: :class:`~runtime_hooks.testing.langchain.ScriptedChatModel`,
  a LangChain chat model for ``create_agent`` and hand-built graphs (``ainvoke`` and ``invoke``);
* ``runtime_hooks.testing.openai_agents``:
  :class:`~runtime_hooks.testing.openai_agents.ScriptedAgentsModel`, an Agents SDK ``Model``.

Each records what it was sent, one :class:`ModelRequest` per model request: the instructions
(where the automatic context goes) and the answers to earlier tool calls, so a test asserts
what the model saw.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from plugin.errors import RecallboundError
from runtime_hooks.adapters.tool import SEARCH_TOOL

__all__ = [
    "ModelRequest",
    "Script",
    "ScriptExhaustedError",
    "ScriptedCall",
    "Step",
    "search",
    "searches",
]


class ScriptExhaustedError(RecallboundError, RuntimeError):
    """The model was asked for more responses than its script has steps."""


@attrs.frozen
class ScriptedCall:
    """One tool call of a scripted model response."""

    name: str
    arguments: Mapping[str, Any]
    call_id: str


def search(query: str, *, call_id: str, **arguments: Any) -> ScriptedCall:
    """A ``search_memory`` call (``arguments``: its other fields, such as ``scope``)."""
    return ScriptedCall(SEARCH_TOOL.name, {"query": query, **arguments}, call_id)


def searches(*queries: str, prefix: str = "call") -> tuple[ScriptedCall, ...]:
    """One response's parallel ``search_memory`` calls, ids ``{prefix}-0``, ``{prefix}-1``, ..."""
    return tuple(search(query, call_id=f"{prefix}-{i}") for i, query in enumerate(queries))


Step: TypeAlias = "str | Sequence[ScriptedCall]"
"""One model response: a final text, or the tool calls to make."""


@attrs.frozen
class ModelRequest:
    """What one model request carried, as the model read it."""

    instructions: str
    """The system instructions (the automatic recall context is added here)."""
    tool_results: Mapping[str, str]
    """The output of every tool call answered so far in the conversation, by call id."""

    def answers(self) -> dict[str, Any]:
        """The tool results parsed from JSON (a text that is not JSON is kept as text)."""
        parsed: dict[str, Any] = {}
        for call_id, text in self.tool_results.items():
            try:
                parsed[call_id] = json.loads(text)
            except ValueError:
                parsed[call_id] = text
        return parsed


@attrs.define(eq=False)
class Script:
    """The steps a scripted model answers with, in order, and the requests it was sent."""

    steps: tuple[Step, ...]
    on_request: Callable[[int], None] | None = None
    """Called with each request's number (from 1) before it is answered: a test's way to
    let time pass while "the model thinks" (advance a ``ManualClock`` here)."""
    requests: list[ModelRequest] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        for step in self.steps:
            if isinstance(step, str):
                continue
            if not all(isinstance(call, ScriptedCall) for call in step):
                raise TypeError(
                    "a script step is a str (a final answer) or a sequence of ScriptedCall "
                    f"(tool calls), got {step!r}"
                )

    def answer(self, request: ModelRequest) -> Step:
        """Record ``request`` and return the next step."""
        self.requests.append(request)
        if self.on_request is not None:
            self.on_request(len(self.requests))
        if len(self.requests) > len(self.steps):
            raise ScriptExhaustedError(
                f"the model was asked for response {len(self.requests)} but its script has "
                f"{len(self.steps)} steps"
            )
        return self.steps[len(self.requests) - 1]

    @property
    def remaining(self) -> int:
        """Steps not yet answered."""
        return max(0, len(self.steps) - len(self.requests))
