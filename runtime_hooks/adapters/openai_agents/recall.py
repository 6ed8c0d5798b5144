"""All of it, in a few lines: :func:`agents_recall` builds the tool, the run hooks, the input
filter and the runner."""

from __future__ import annotations

import dataclasses
from typing import Any

import attrs

from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import RecallHooks

from .._options import deprecated_alias
from ..batch import AutomaticMode, automatic_mode
from .automatic import RecallInputFilter, StateSource, latest_user_request
from .binding import RecallRunner
from .deliberate import RecallRunHooks
from .guardrail import search_tool

with missing_extra("openai-agents", "runtime_hooks.adapters.openai_agents"):
    from agents import Agent, FunctionTool, RunConfig, RunHooks, RunResult, RunResultStreaming


@attrs.frozen
class AgentsRecall:
    """The adapter's pieces for one set of hooks; see :func:`agents_recall`."""

    runner: RecallRunner
    tool: FunctionTool
    input_filter: RecallInputFilter | None
    """None when automatic recall is off."""

    def run_hooks(self, inner: RunHooks[Any] | None = None) -> RecallRunHooks:
        """Run hooks for one run, passing every event on to the host's ``inner`` hooks."""
        if isinstance(inner, RecallRunHooks):
            return inner  # already installed: one batch per response is enough
        return RecallRunHooks(inner)

    def run_config(self, base: RunConfig | None = None) -> RunConfig:
        """``base`` (or a default config) with the recall input filter installed.

        The host's own ``call_model_input_filter`` runs first, then the automatic round.
        """
        base = base if base is not None else RunConfig()
        if self.input_filter is None or isinstance(
            base.call_model_input_filter, RecallInputFilter
        ):
            return base  # off, or already installed: never two automatic rounds a request
        return dataclasses.replace(
            base,
            call_model_input_filter=attrs.evolve(
                self.input_filter, then=base.call_model_input_filter
            ),
        )

    def _kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs["hooks"] = self.run_hooks(kwargs.get("hooks"))
        kwargs["run_config"] = self.run_config(kwargs.get("run_config"))
        return kwargs

    async def run(
        self, agent: Agent[Any], input: Any, *, run_id: str, scope: str, principal: str,
        **kwargs: Any,
    ) -> RunResult:
        """``Runner.run`` with recall: bound run, batching hooks, automatic round."""
        return await self.runner.run(agent, input, run_id=run_id, scope=scope,
                                     principal=principal, **self._kwargs(kwargs))

    def run_streamed(
        self, agent: Agent[Any], input: Any, *, run_id: str, scope: str, principal: str,
        **kwargs: Any,
    ) -> RunResultStreaming:
        """``Runner.run_streamed`` with recall (see :meth:`run`)."""
        return self.runner.run_streamed(agent, input, run_id=run_id, scope=scope,
                                        principal=principal, **self._kwargs(kwargs))


def agents_recall(
    hooks: RecallHooks, *, automatic: bool | str = True,
    working_state: StateSource = latest_user_request,
    state: StateSource | None = None,
) -> AgentsRecall:
    """Build the tool, the run hooks, the input filter and the runner for ``hooks``.

    ``automatic=True`` (default): one automatic round per invocation (one ``Runner.run``, its
    handoffs included), before its first model request; ``"per_request"``: a round before
    every model request; ``False``: no automatic round (only the model's search calls recall).
    ``working_state`` gives the working state for each model request (default: the latest
    user message; ``state=`` is its deprecated alias); run id, scope and principal are passed
    to :meth:`AgentsRecall.run` by the host.
    """
    if state is not None:
        working_state = deprecated_alias("state", "working_state", state, working_state,
                                         latest_user_request)
    mode: AutomaticMode = automatic_mode(automatic)
    return AgentsRecall(
        runner=RecallRunner(hooks),
        tool=search_tool(),
        input_filter=(None if mode == "off"
                      else RecallInputFilter(working_state, per_request=mode == "per_request")),
    )
