"""What the pydantic-ai adapter reads from the framework: a response's search calls, the run's
deadline and its end strategy."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import anyio

from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import ToolCall

from .tool import SEARCH_TOOL

with missing_extra("pydantic-ai", "runtime_hooks.adapters.pydantic_ai"):
    from pydantic_ai import RunContext
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.tools import DeferredToolResult, ToolApproved


@contextmanager
def until_framework_deadline(ctx: RunContext[Any]) -> Iterator[anyio.CancelScope]:
    """A cancel scope ending at the run's own deadline (``run(timeout=)``), if it has one.

    The permit's attempts open their own scopes at the allowance's deadline inside this one,
    so recall ends at whichever comes first; neither deadline is moved.
    """
    left = ctx.remaining_time()
    deadline = math.inf if left is None else anyio.current_time() + left
    with anyio.CancelScope(deadline=deadline) as scope:
        yield scope


def framework_deadline_passed(ctx: RunContext[Any]) -> bool:
    left = ctx.remaining_time()
    return left is not None and left <= 0


def may_skip_function_tools(ctx: RunContext[Any]) -> bool:
    """Whether pydantic-ai may leave a response's function tools unrun: only under
    ``end_strategy="early"``, once an output call (or another final output) of the response
    succeeds; under ``"graceful"`` and ``"exhaustive"`` every function tool runs."""
    return getattr(ctx.agent, "end_strategy", None) == "early"


def _pending(part: ToolCallPart, answered: Mapping[str, DeferredToolResult | str] | None) -> bool:
    """Whether a call of the response still runs in this node (an approved one does)."""
    if answered is None or part.tool_call_id not in answered:
        return True
    return isinstance(answered[part.tool_call_id], ToolApproved)


def search_calls(
    response: ModelResponse, answered: Mapping[str, DeferredToolResult | str] | None = None
) -> list[ToolCall]:
    """The search calls of ``response`` that still run (an answered one, as on an approval
    resume, does not); none when the response repeats a call id, which pydantic-ai refuses
    (none of its calls runs)."""
    ids = [part.tool_call_id for part in response.tool_calls]
    if len(ids) != len(set(ids)):
        return []
    return [
        ToolCall(call_id=part.tool_call_id, arguments=arguments_of(part.args))
        for part in response.tool_calls
        if part.tool_name == SEARCH_TOOL.name and _pending(part, answered)
    ]


def arguments_of(arguments: str | dict[str, Any] | None) -> Mapping[str, object] | str:
    return {} if arguments is None else arguments
