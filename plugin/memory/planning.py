"""Query planning: which query a round uses, decided on every call.

:class:`QueryPlanner` picks the strategy per call: the ``task_context`` experiment needs the
release admission on *every* call, and anything short of a timely ``True`` gives the baseline.
The query value lives in :mod:`plugin.memory.query` and the composers in
:mod:`plugin.memory.compose`; their names are importable from here as well.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import attrs

from plugin.control.logs import log_event
from plugin.control.validate import finite, number_text
from plugin.memory.state import WorkingState

from .compose import (
    DEFAULT_MAX_BYTES,
    MAX_CONSTRAINTS,
    MAX_ENTITIES,
    MAX_QUESTIONS,
    MAX_TASKS,
    TASK_WINDOW,
    _baseline,
    _check_state,
    _check_trusted,
    compose_baseline,
    compose_search_call,
    compose_task_context,
)
from .detached import within
from .query import BaselineReason, FragmentRole, QueryStrategy, RecallQuery

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_CONSTRAINTS",
    "MAX_ENTITIES",
    "MAX_QUESTIONS",
    "MAX_TASKS",
    "TASK_WINDOW",
    "Admission",
    "BaselineReason",
    "FragmentRole",
    "QueryPlanner",
    "QueryStrategy",
    "RecallQuery",
    "compose_baseline",
    "compose_search_call",
    "compose_task_context",
]

_log = logging.getLogger("recallbound.memory")

Admission = Callable[[str], Awaitable[bool]]
"""Release admission: awaited with the experiment's name, answers ``True`` to admit it."""


def _strategy(value: QueryStrategy | str) -> QueryStrategy:
    if isinstance(value, QueryStrategy):
        return value
    if isinstance(value, str):
        try:
            return QueryStrategy(value)
        except ValueError:
            raise ValueError(
                f"QueryPlanner.strategy must be one of "
                f"{', '.join(s.value for s in QueryStrategy)}, got {value!r}"
            ) from None
    raise TypeError(f"QueryPlanner.strategy must be a QueryStrategy, got {type(value).__name__}")


def _admission(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not callable(value):
        raise TypeError(
            f"QueryPlanner.admission must be an async callable or None, got {type(value).__name__}"
        )


def _timeout(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"QueryPlanner.admission_timeout_s must be a number, got {type(value).__name__}"
        )
    if not finite(value) or value <= 0:
        raise ValueError(f"QueryPlanner.admission_timeout_s must be finite and > 0, got "
                         f"{number_text(value)}")


def _holds_a_stop(error: BaseException) -> bool:
    """Whether ``error`` is a stop (KeyboardInterrupt, SystemExit), or a group holding one."""
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        return True
    inner = getattr(error, "exceptions", None)  # an exception group's
    return isinstance(inner, tuple) and any(_holds_a_stop(each) for each in inner)


@attrs.frozen
class QueryPlanner:
    """Forms the round's query with the configured strategy.

    ``admission`` is an async callable taking the experiment name (``"task_context"``) and
    returning a ``bool``; ``None`` means admission is unavailable. It is awaited on every
    :meth:`plan` call with the ``task_context`` strategy, never cached. ``strategy`` also
    accepts its string value (``"task_context"``).
    """

    strategy: QueryStrategy = attrs.field(default=QueryStrategy.BASELINE, converter=_strategy)
    admission: Admission | None = attrs.field(default=None, validator=_admission)
    admission_timeout_s: float = attrs.field(default=0.25, validator=_timeout)

    async def plan(
        self, state: WorkingState, *, scope: str | None = None, principal: str | None = None
    ) -> RecallQuery:
        """The query for this round.

        With ``TASK_CONTEXT``, admission is asked now; an answer of ``True`` within
        ``admission_timeout_s`` gives :func:`compose_task_context`, anything else (``False``,
        no admission, an exception, a non-bool answer, no answer in time) gives the baseline
        with the matching :class:`BaselineReason`. Cancellation of the caller propagates.
        """
        _check_state(state)
        _check_trusted(scope, principal)
        if self.strategy is QueryStrategy.BASELINE:
            return _baseline(state, scope, principal, BaselineReason.DEFAULT)
        refused = await self._admit()
        if refused is not None:
            return _baseline(state, scope, principal, refused)
        return compose_task_context(state, scope=scope, principal=principal)

    def plan_recent(
        self, state: WorkingState, *, scope: str | None = None, principal: str | None = None
    ) -> RecallQuery:
        """The query for recent-candidate selection: the baseline, whatever the strategy.

        This is the frozen control (``baseline_reason`` ``FROZEN_CONTROL``); admission is not
        asked. Its fingerprint equals that of :func:`compose_baseline` for the same arguments.
        """
        _check_state(state)
        _check_trusted(scope, principal)
        return _baseline(state, scope, principal, BaselineReason.FROZEN_CONTROL)

    async def _admit(self) -> BaselineReason | None:
        """None when the experiment is admitted, else why the baseline is used."""
        admission = self.admission
        if admission is None:
            return BaselineReason.ADMISSION_UNAVAILABLE
        # Run apart: an admission that does not take a cancellation (a blocking thread, a
        # shield) cannot hold the plan past its timeout.
        deadline = anyio.current_time() + self.admission_timeout_s
        outcome = await within(lambda: admission(QueryStrategy.TASK_CONTEXT.value),
                               self.admission_timeout_s)
        if outcome is None or anyio.current_time() >= deadline:
            # No answer in time, or a late one: it blocked the loop past the timeout (which
            # could not be delivered while it blocked).
            return BaselineReason.ADMISSION_TIMEOUT
        if outcome.error is not None:
            cancelled = isinstance(outcome.error, anyio.get_cancelled_exc_class())
            if _holds_a_stop(outcome.error):
                raise outcome.error  # a stop is no failure (a GeneratorExit leaked is one)
            # Its message may hold anything (a host's secrets): only its type is logged.
            error = "a cancellation of its own" if cancelled else type(outcome.error).__name__
            log_event(_log, logging.WARNING, "planning.admission_failed", error=error)
            return BaselineReason.ADMISSION_FAILED
        answer = outcome.value
        if answer is True:
            return None
        if answer is False:
            return BaselineReason.ADMISSION_WITHDRAWN
        log_event(_log, logging.WARNING, "planning.admission_failed",
                  error=f"answered {type(answer).__name__}, not bool")
        return BaselineReason.ADMISSION_FAILED
