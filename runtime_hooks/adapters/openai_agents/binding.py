"""The run boundary: the run's trusted identity and its :class:`RunRecall`, bound around the
SDK's runner (the SDK runs hooks in copied contexts)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from plugin.errors import RecallboundError, RunIdentityError
from runtime_hooks._extras import missing_extra
from runtime_hooks.hooks import RecallHooks

from ..batch import RunRecall, RunRecalls
from ..invocation import Invocation

with missing_extra("openai-agents", "runtime_hooks.adapters.openai_agents"):
    from agents import Agent, Runner, RunResult, RunResultStreaming


class RunNotBoundError(RecallboundError, RuntimeError):
    """A recall hook ran outside a run bound by :class:`RecallRunner` (no trusted identity)."""


current_run: contextvars.ContextVar[RunRecall | None] = contextvars.ContextVar(
    "recallbound_agents_run", default=None
)
current_invocation: contextvars.ContextVar[Invocation | None] = contextvars.ContextVar(
    "recallbound_agents_invocation", default=None
)


def bound_run(where: str) -> RunRecall:
    """The run bound by :class:`RecallRunner`; raises :class:`RunNotBoundError` outside one,
    and after it ended.

    A task a tool of the run started inherits the binding and may run after the run returned
    (a follow-up scheduled in the background). The SDK gives the recall pieces no handle on
    which run a request belongs to, so a request or a search made once the bound run ended is
    refused, before anything is reserved: it is never served the ended turn's context or its
    round. Started with ``recall.run`` instead, the follow-up is the next turn.
    """
    run = current_run.get()
    if run is None:
        raise RunNotBoundError(
            f"{where} ran outside a bound run: start the agent with RecallRunner.run() or "
            ".run_streamed() (AgentsRecall.run), which bind the run's trusted identity"
        )
    invocation = current_invocation.get()
    if invocation is not None and invocation.ended:
        raise RunNotBoundError(
            f"{where} ran after the run bound by RecallRunner had ended (a run a tool left "
            "going, or scheduled for later): start it with RecallRunner.run() or "
            ".run_streamed() (AgentsRecall.run), the next turn"
        )
    return run


@attrs.define(eq=False)
class RecallRunner:
    """Runs an agent with the run bound: the permit holder and the run's :class:`RunRecall`.

    One ``RunRecall`` per run id is kept (the last ``max_runs``), so continuing or resuming a
    run reuses the answers its batches stored.
    """

    hooks: RecallHooks
    max_runs: int = 1024
    _runs: RunRecalls = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._runs = RunRecalls(self.hooks, RunIdentityError, self.max_runs)

    def recall_for(self, run_id: str, *, scope: str, principal: str) -> RunRecall:
        """The run's ``RunRecall``; raises :class:`RunIdentityError` if the identity changed."""
        return self._runs.get(run_id, scope=scope, principal=principal)

    @contextmanager
    def bind(self, run_id: str, *, scope: str, principal: str) -> Iterator[Invocation]:
        """Bind the run for everything started inside (the SDK copies this context); yields
        the run's invocation, which the caller ends when the run ends."""
        run = self.recall_for(run_id, scope=scope, principal=principal)
        with self.hooks.bind_run():
            token = current_run.set(run)
            invocation = Invocation()  # this run's alone
            bound = current_invocation.set(invocation)
            try:
                yield invocation
            finally:
                current_invocation.reset(bound)
                current_run.reset(token)

    async def run(
        self, agent: Agent[Any], input: Any, *, run_id: str, scope: str, principal: str,
        **kwargs: Any,
    ) -> RunResult:
        """``Runner.run`` with the run bound; ``kwargs`` go to the SDK unchanged."""
        with self.bind(run_id, scope=scope, principal=principal) as invocation:
            try:
                return await Runner.run(agent, input, **kwargs)
            finally:
                invocation.end()

    def run_streamed(
        self, agent: Agent[Any], input: Any, *, run_id: str, scope: str, principal: str,
        **kwargs: Any,
    ) -> RunResultStreaming:
        """``Runner.run_streamed`` with the run bound.

        The SDK starts the run as a task, which copies the bound context as it is created; the
        binding therefore outlives this call for as long as the stream runs.
        """
        with self.bind(run_id, scope=scope, principal=principal) as invocation:
            try:
                result = Runner.run_streamed(agent, input, **kwargs)
            except BaseException:
                invocation.end()
                raise
        task = getattr(result, "run_loop_task", None)
        if isinstance(task, asyncio.Task):  # the run ends with its task, however it ends
            task.add_done_callback(lambda _: invocation.end())
        return result
