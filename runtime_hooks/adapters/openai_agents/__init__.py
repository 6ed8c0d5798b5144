"""Bounded recall for the OpenAI Agents SDK (extra ``openai-agents``; asyncio only).

Four thin pieces translate the SDK's hooks into :class:`~runtime_hooks.adapters.RunRecall`
calls, and :func:`agents_recall` builds them all::

    recall = agents_recall(hooks)                        # hooks: from open_hooks(...)
    agent = Agent(name="assistant", instructions="...", tools=[recall.tool])
    result = await recall.run(agent, "Continue", run_id=..., scope=..., principal=...)

* **Automatic round** (:class:`RecallInputFilter`, a ``RunConfig.call_model_input_filter``):
  once per invocation (one ``Runner.run`` or ``Runner.run_streamed``, its handoffs included),
  before its first model request, ``RunRecall.prepare(state)``; the rendered context is
  appended to the instructions of that request and of every later request of the invocation
  (a handoff's specialist included), which take no round of their own. With
  ``automatic="per_request"`` a round runs before every model request instead.
* **Deliberate round** (:class:`RecallRunHooks.on_llm_end`): the one hook that sees every
  function call of a model response before any guardrail or tool runs (under ``Runner.run``
  and ``Runner.run_streamed``). All ``search_memory`` calls of the response go to
  ``RunRecall.dispatch_batch`` together, so parallel calls take distinct slots of ONE round.
  The SDK invokes each tool separately; a dispatch per tool would open a round per call and
  lose calls to the ``rounds`` limit.
* **Tool and guardrail** (:func:`search_tool`): the tool rendered from
  :data:`~runtime_hooks.adapters.SEARCH_TOOL`; its input guardrail answers a refused, invalid
  or failed call with ``reject_content`` carrying the typed result as JSON (the model reads it
  as the call's output), and the tool returns a successful call's stored result, looked up by
  ``ToolContext.tool_call_id`` and the call's arguments (a call is its id AND its
  arguments). Neither ever reserves.
* **Run boundary** (:class:`RecallRunner`): the SDK runs hooks in copied contexts, so the run
  is bound around ``Runner.run`` / ``Runner.run_streamed``: ``RecallHooks.bind_run()`` and
  the run's :class:`RunRecall`, whose run id, scope and principal the host passes in, never
  the model. The ``RunRecall`` of a run id is kept, so a continued or resumed run (a
  ``RunState`` after an approval, ``result.to_input_list()`` fed to a new run) reuses the
  stored answers and never reserves a call twice. Each bound run is one invocation: the
  context its automatic round prepared ends with it.

Split by the question each part answers: :mod:`.binding` (the run boundary),
:mod:`.automatic` (the automatic round), :mod:`.deliberate` (the deliberate round),
:mod:`.guardrail` (the tool and its guardrail) and :mod:`.recall` (all of it together).
"""

from __future__ import annotations

from plugin.errors import RunIdentityError as RunIdentityError

from .automatic import RecallInputFilter as RecallInputFilter
from .automatic import StateSource as StateSource
from .automatic import latest_user_request as latest_user_request
from .binding import RecallRunner as RecallRunner
from .binding import RunNotBoundError as RunNotBoundError
from .deliberate import RecallRunHooks as RecallRunHooks
from .deliberate import search_calls as search_calls
from .guardrail import search_tool as search_tool
from .recall import AgentsRecall as AgentsRecall
from .recall import agents_recall as agents_recall

__all__ = [
    "AgentsRecall",
    "RecallInputFilter",
    "RecallRunHooks",
    "RecallRunner",
    "RunNotBoundError",
    "RunIdentityError",
    "StateSource",
    "agents_recall",
    "latest_user_request",
    "search_calls",
    "search_tool",
]
