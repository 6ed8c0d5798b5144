"""The ``search_memory`` tool and its guardrail: a call's stored result, never a search."""

from __future__ import annotations

import json
from typing import Any

from plugin.control import BudgetRefusal, RefusalReason
from plugin.errors import RunIdentityError
from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import ToolResult

from ..batch import RunRecall
from ..tool import SEARCH_TOOL
from .binding import bound_run

with missing_extra("openai-agents", "runtime_hooks.adapters.openai_agents"):
    from agents import (
        AgentsException,
        FunctionTool,
        ToolGuardrailFunctionOutput,
        ToolInputGuardrail,
        ToolInputGuardrailData,
    )
    from agents.tool_context import ToolContext


class _ToolRunIdentityError(RunIdentityError, AgentsException):
    """A :class:`~plugin.errors.RunIdentityError` met in the tool or its guardrail (a resumed
    run replays its calls there before any other hook runs). The SDK wraps any other error of a
    tool in its ``UserError`` but passes its own on as they are, so the host catches the
    ``RunIdentityError`` every other hook raises."""


async def _stored(run: RunRecall, call_id: str, arguments: str) -> ToolResult:
    """The stored result of a call; a call this run never dispatched is refused, not searched.

    With :class:`RecallRunHooks` installed, a call reaches its tool without a stored result
    only in a run resumed in a new process (a ``RunState`` restored from JSON): the ledger
    recorded its outcome where the batch ran, and it is replayed from there. A call the ledger
    never recorded is refused (``closed``): dispatching it here would reserve it a second
    time. (Without the hooks, e.g. ``RecallRunner.run`` instead of ``AgentsRecall.run``, every
    call lands here: nothing is searched, and the model is told so.)
    """
    result = run.result(call_id, arguments)
    if result is None:
        try:
            result = await run.recorded(call_id, arguments)
        except RunIdentityError as exc:
            raise _ToolRunIdentityError(*exc.args) from exc
    if result is not None:
        return result
    usage = await run.usage()
    refusal = BudgetRefusal(reason=RefusalReason.CLOSED, run_id=run.run_id,
                            reserved=usage.reserved, executed=usage.executed)
    return ToolResult(call_id=call_id, status="refused", content=refusal.message,
                      refusal=refusal)


def _json(result: ToolResult) -> str:
    return json.dumps(result.as_dict(), ensure_ascii=False)


async def _guard(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
    result = await _stored(bound_run("the search_memory guardrail"),
                           data.context.tool_call_id, data.context.tool_arguments)
    if result.status == "ok":
        return ToolGuardrailFunctionOutput.allow()
    # The model reads this message as the call's output: the typed refusal, visibly.
    return ToolGuardrailFunctionOutput.reject_content(_json(result), output_info=result.status)


async def _invoke(context: ToolContext[Any], arguments: str) -> str:
    # The search ran in the batch (on_llm_end); the arguments were validated there.
    return _json(await _stored(bound_run("the search_memory tool"), context.tool_call_id,
                               arguments))


def is_search_tool(tool: object) -> bool:
    """Whether ``tool`` is a ``search_memory`` tool of this adapter (:func:`search_tool`, or a
    copy of one the host put in a tool namespace)."""
    return isinstance(tool, FunctionTool) and tool.on_invoke_tool is _invoke


def search_tool() -> FunctionTool:
    """The ``search_memory`` function tool, rendered from :data:`SEARCH_TOOL`, with its guardrail.

    Not strict: the schema has an optional ``scope`` and length bounds, which the SDK's strict
    mode would rewrite; the hooks validate every call anyway.
    """
    return FunctionTool(
        name=SEARCH_TOOL.name,
        description=SEARCH_TOOL.description,
        params_json_schema=SEARCH_TOOL.json_schema(),
        on_invoke_tool=_invoke,
        strict_json_schema=False,
        tool_input_guardrails=[
            ToolInputGuardrail(guardrail_function=_guard, name="recallbound_search")
        ],
    )
