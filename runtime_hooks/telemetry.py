"""OpenTelemetry for the allowance: a span per round and per attempt, and five metrics.

Needs the ``otel`` extra (``opentelemetry-api`` only: the host brings the SDK and exporters).
:func:`install` puts an :class:`OtelObserver` behind the control core's observer seam
(:mod:`plugin.control.observe`); without it the seam costs nothing measurable.

An attempt span is the child of its round's span even when the attempt runs in a task the
round spawned, in a nursery started elsewhere, or in a worker thread: the observer finds the
round by the attempt's permit (one object shared by every task of the phase), not by the
ambient context. Spans carry the query's fingerprint, never its text (it may hold user data).
Metric attributes never include the run id (unbounded cardinality).
"""

from __future__ import annotations

import threading
import weakref
from contextvars import Token

import attrs
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode

from plugin.control import observe
from plugin.control.ledger import AttemptOutcome, AttemptTrace
from plugin.control.observe import PermitView
from plugin.control.policy import AttemptKind, RoundKind
from plugin.control.refusal import BudgetRefusal, RecallBudgetExceeded

SCOPE = "recallbound"
"""The instrumentation scope name of the tracer and the meter."""


@attrs.define(eq=False)
class _RoundWatch:
    span: Span
    kind: RoundKind
    attached: Context
    token: Token[Context] | None


@attrs.define(eq=False)
class _AttemptWatch:
    span: Span
    attached: Context
    token: Token[Context] | None


def _attach(span: Span) -> tuple[Context, Token[Context]]:
    """``span`` made current: the context attached, and the token that detaches it."""
    attached = trace.set_span_in_context(span)
    return attached, otel_context.attach(attached)


def _detach(attached: Context, token: Token[Context] | None) -> None:
    """Detach where ``attached`` is still current: in the context that attached it. Elsewhere
    (a search's attempt ended by its caller, the search left in a task of its own) there is
    nothing to undo, and OpenTelemetry would log an error with a traceback."""
    if token is not None and otel_context.get_current() is attached:
        otel_context.detach(token)


class OtelObserver:
    """The :class:`~plugin.control.observe.Observer` that reports to OpenTelemetry.

    Spans: ``recallbound.round`` and its children ``recallbound.attempt``. Metrics (counters
    unless said): ``recallbound.rounds`` {kind, outcome}, ``recallbound.reserved_slots``
    {kind}, ``recallbound.executed_searches`` {kind}, ``recallbound.refusals`` {what, kind,
    reason}, and the histogram ``recallbound.attempt.duration`` (seconds) {kind, outcome}.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self._rounds = meter.create_counter(
            "recallbound.rounds", unit="{round}", description="Rounds granted or refused")
        self._reserved = meter.create_counter(
            "recallbound.reserved_slots", unit="{slot}",
            description="Search slots reserved by granted rounds (unused ones count)")
        self._executed = meter.create_counter(
            "recallbound.executed_searches", unit="{search}",
            description="Attempts that took a slot and started")
        self._refusals = meter.create_counter(
            "recallbound.refusals", unit="{refusal}",
            description="Refused rounds and attempts, by reason")
        self._latency = meter.create_histogram(
            "recallbound.attempt.duration", unit="s", description="Attempt wall time")
        self._lock = threading.Lock()
        self._round_spans: weakref.WeakKeyDictionary[PermitView, Span] = (
            weakref.WeakKeyDictionary()
        )

    # -- rounds ------------------------------------------------------------------------------

    def round_started(self, run_id: str, kind: RoundKind, requested: int) -> object:
        span = self._tracer.start_span(
            "recallbound.round",
            attributes={"recallbound.run_id": run_id, "recallbound.kind": kind.value,
                        "recallbound.requested": requested},
        )
        # Current while the round's body runs, so the host's own spans nest under it.
        attached, token = _attach(span)
        return _RoundWatch(span=span, kind=kind, attached=attached, token=token)

    def round_granted(self, token: object, permit: PermitView) -> None:
        assert isinstance(token, _RoundWatch)
        token.span.set_attributes({
            "recallbound.round": permit.round_index,
            "recallbound.slot": permit.first_slot,
            "recallbound.legacy": permit.legacy,
        })
        if not permit.legacy:
            token.span.set_attribute("recallbound.reserved", permit.slots)
            self._reserved.add(permit.slots, {"kind": token.kind.value})
        with self._lock:
            self._round_spans[permit] = token.span
        self._rounds.add(1, {"kind": token.kind.value, "outcome": "granted"})

    def round_ended(
        self, token: object, permit: PermitView | None, error: BaseException | None
    ) -> None:
        assert isinstance(token, _RoundWatch)
        span = token.span
        try:
            if permit is None:
                if isinstance(error, RecallBudgetExceeded):
                    refusal = error.refusal
                    span.set_attributes(_refusal_attributes(refusal))
                    span.set_attribute("recallbound.outcome", "refused")
                    self._rounds.add(1, {"kind": token.kind.value, "outcome": "refused"})
                    self._refusals.add(1, {"what": "round", "kind": token.kind.value,
                                           "reason": refusal.reason.value})
                else:
                    _failed(span, error)
                return
            if not permit.legacy:
                span.set_attribute("recallbound.executed", permit.slots - permit.remaining)
            if error is None:
                span.set_attribute("recallbound.outcome", "ok")
            else:
                _failed(span, error)
        finally:
            span.end()
            _detach(token.attached, token.token)

    # -- attempts ----------------------------------------------------------------------------

    def attempt_started(self, permit: PermitView, trace_: AttemptTrace) -> object:
        with self._lock:
            parent = self._round_spans.get(permit)
        attributes: dict[str, str | bool | int | float] = {
            "recallbound.run_id": trace_.run_id,
            "recallbound.round": trace_.round_index,
            "recallbound.slot": trace_.slot,
            "recallbound.kind": trace_.kind,
            "recallbound.legacy": trace_.legacy,
        }
        if trace_.strategy is not None:
            attributes["recallbound.strategy"] = trace_.strategy
        if trace_.fingerprint is not None:
            attributes["recallbound.query.fingerprint"] = trace_.fingerprint
        if not permit.legacy:
            attributes["recallbound.reserved"] = permit.slots
            attributes["recallbound.executed"] = permit.slots - permit.remaining
            self._executed.add(1, {"kind": trace_.kind})
        span = self._tracer.start_span(
            "recallbound.attempt",
            context=None if parent is None else trace.set_span_in_context(parent),
            attributes=attributes,
        )
        attached, token = _attach(span)
        return _AttemptWatch(span=span, attached=attached, token=token)

    def attempt_refused(
        self, permit: PermitView, kind: AttemptKind, refusal: BudgetRefusal
    ) -> None:
        self._refusals.add(1, {"what": "attempt", "kind": kind.value,
                               "reason": refusal.reason.value})
        with self._lock:
            parent = self._round_spans.get(permit)
        if parent is not None:
            parent.add_event("recallbound.refusal",
                             {"recallbound.kind": kind.value, **_refusal_attributes(refusal)})

    def attempt_ended(self, token: object, trace_: AttemptTrace) -> None:
        assert isinstance(token, _AttemptWatch)
        span = token.span
        try:
            span.set_attribute("recallbound.outcome", trace_.outcome.value)
            if trace_.outcome is AttemptOutcome.ERROR:
                span.set_status(Status(StatusCode.ERROR))
            if trace_.elapsed_s is not None:
                self._latency.record(
                    trace_.elapsed_s, {"kind": trace_.kind, "outcome": trace_.outcome.value})
        finally:
            span.end()
            _detach(token.attached, token.token)


def _refusal_attributes(refusal: BudgetRefusal) -> dict[str, str | bool | int | float]:
    return {
        "recallbound.refusal.reason": refusal.reason.value,
        "recallbound.run.reserved": refusal.reserved,
        "recallbound.run.executed": refusal.executed,
    }


def _failed(span: Span, error: BaseException | None) -> None:
    span.set_attribute("recallbound.outcome", "error")
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))


def install(
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> OtelObserver:
    """Report the allowance to OpenTelemetry (the global providers unless given); process-wide.

    Returns the observer; :func:`uninstall` removes it.
    """
    observer = OtelObserver(tracer_provider=tracer_provider, meter_provider=meter_provider)
    observe.set_observer(observer)
    return observer


def uninstall(observer: OtelObserver | None = None) -> None:
    """Stop reporting (only if ``observer``, when given, is the one installed)."""
    if observer is None or observe.current_observer() is observer:
        observe.set_observer(None)
