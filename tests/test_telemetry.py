"""OpenTelemetry: spans per round and attempt, parented right, and the five metrics; both loops."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import anyio.to_thread
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from plugin import (
    AllowancePolicy,
    AttemptKind,
    ManualClock,
    RecallAllowance,
    RecallBudgetExceeded,
    RefusalReason,
    RoundKind,
)
from plugin.control import observe
from runtime_hooks import telemetry

from ._fakes import MemoryLedger

pytestmark = pytest.mark.anyio

FINGERPRINT = "f" * 64
SECRET_QUERY = "what did Alice say about the merger"


class Otel:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.observer = telemetry.install(
            tracer_provider=tracer_provider,
            meter_provider=MeterProvider(metric_readers=[self.reader]),
        )

    def finished(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    def points(self, metric: str) -> dict[tuple[tuple[str, object], ...], float]:
        """Each data point of ``metric``: its attributes -> value (histograms: count)."""
        data = self.reader.get_metrics_data()
        found: dict[tuple[tuple[str, object], ...], float] = {}
        if data is None:  # nothing was ever recorded
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name != metric:
                        continue
                    for point in m.data.data_points:
                        key = tuple(sorted((point.attributes or {}).items()))
                        found[key] = getattr(point, "value", None) or point.count  # type: ignore[union-attr]
        return found


@pytest.fixture
def otel() -> Iterator[Otel]:
    installed = Otel()
    try:
        yield installed
    finally:
        telemetry.uninstall(installed.observer)


@pytest.fixture
def allowance() -> RecallAllowance:
    return RecallAllowance(MemoryLedger(), clock=ManualClock(wall=1_000_000.0, monotonic=5.0))


async def test_attempts_in_child_tasks_threads_and_outside_nurseries_parent_to_their_round(
    otel: Otel, allowance: RecallAllowance
) -> None:
    async with anyio.create_task_group() as outside:  # a nursery the round did not open
        async with allowance.round("r1", RoundKind.DELIBERATE, slots=4) as permit:

            async def search() -> None:
                async with permit.attempt(
                    AttemptKind.DELIBERATE, strategy="task_context", fingerprint=FINGERPRINT
                ):
                    await anyio.sleep(0)

            def in_thread() -> None:
                with permit.attempt_sync(AttemptKind.DELIBERATE, fingerprint=FINGERPRINT):
                    assert threading.current_thread() is not threading.main_thread()

            async with anyio.create_task_group() as inner:
                inner.start_soon(search)
                inner.start_soon(search)
                inner.start_soon(anyio.to_thread.run_sync, in_thread)
            done = anyio.Event()

            async def outside_search() -> None:
                await search()
                done.set()

            outside.start_soon(outside_search)
            await done.wait()

    (round_span,) = otel.finished("recallbound.round")
    attempts = otel.finished("recallbound.attempt")
    assert len(attempts) == 4
    assert round_span.context is not None
    for span in attempts:
        assert span.parent is not None
        assert span.parent.span_id == round_span.context.span_id
        assert span.context is not None
        assert span.context.trace_id == round_span.context.trace_id
    assert sorted(s.attributes["recallbound.slot"] for s in attempts) == [1, 2, 3, 4]  # type: ignore[index]
    for span in attempts:
        attrs = dict(span.attributes or {})
        assert attrs["recallbound.run_id"] == "r1"
        assert attrs["recallbound.round"] == 1
        assert attrs["recallbound.kind"] == "deliberate"
        assert attrs["recallbound.query.fingerprint"] == FINGERPRINT
        assert attrs["recallbound.outcome"] == "ok"
        assert attrs["recallbound.reserved"] == 4
        assert 1 <= attrs["recallbound.executed"] <= 4  # type: ignore[operator]
    assert {s.attributes.get("recallbound.strategy") for s in attempts} == {  # type: ignore[union-attr]
        "task_context", None}
    r = dict(round_span.attributes or {})
    assert (r["recallbound.run_id"], r["recallbound.round"], r["recallbound.kind"],
            r["recallbound.reserved"], r["recallbound.executed"], r["recallbound.outcome"]) == (
        "r1", 1, "deliberate", 4, 4, "ok")


async def test_spans_never_carry_the_query_text(otel: Otel, allowance: RecallAllowance) -> None:
    async with allowance.round("r1", RoundKind.AUTOMATIC) as permit:
        async with permit.attempt(AttemptKind.BASE, strategy="baseline",
                                  fingerprint=FINGERPRINT):
            pass
    for span in otel.spans.get_finished_spans():
        for value in (span.attributes or {}).values():
            assert SECRET_QUERY not in str(value)


async def test_metrics_count_rounds_slots_searches_refusals_and_latency(
    otel: Otel, allowance: RecallAllowance
) -> None:
    async with allowance.round("r1", RoundKind.AUTOMATIC) as permit:  # 2 slots
        async with permit.attempt(AttemptKind.BASE):
            pass
        with pytest.raises(RuntimeError):
            async with permit.attempt(AttemptKind.DELTA):
                raise RuntimeError("retriever failed")
        with pytest.raises(RecallBudgetExceeded):
            async with permit.attempt(AttemptKind.DELTA):
                pass  # pragma: no cover - refused before the body
    async with allowance.round("r1", RoundKind.DELIBERATE, slots=5) as permit:  # 2 left
        async with permit.attempt():
            pass
    with pytest.raises(RecallBudgetExceeded) as refused:
        async with allowance.round("r1", RoundKind.DELIBERATE, slots=1):
            pass  # pragma: no cover
    assert refused.value.refusal.reason is RefusalReason.ROUNDS

    assert otel.points("recallbound.rounds") == {
        (("kind", "automatic"), ("outcome", "granted")): 1,
        (("kind", "deliberate"), ("outcome", "granted")): 1,
        (("kind", "deliberate"), ("outcome", "refused")): 1,
    }
    assert otel.points("recallbound.reserved_slots") == {
        (("kind", "automatic"),): 2, (("kind", "deliberate"),): 2}
    assert otel.points("recallbound.executed_searches") == {
        (("kind", "base"),): 1, (("kind", "delta"),): 1, (("kind", "deliberate"),): 1}
    assert otel.points("recallbound.refusals") == {
        (("kind", "delta"), ("reason", "slots"), ("what", "attempt")): 1,
        (("kind", "deliberate"), ("reason", "rounds"), ("what", "round")): 1,
    }
    assert otel.points("recallbound.attempt.duration") == {
        (("kind", "base"), ("outcome", "ok")): 1,
        (("kind", "delta"), ("outcome", "error")): 1,
        (("kind", "deliberate"), ("outcome", "ok")): 1,
    }
    refused_round = [s for s in otel.finished("recallbound.round")
                     if s.attributes and s.attributes["recallbound.outcome"] == "refused"]
    assert len(refused_round) == 1
    assert refused_round[0].attributes is not None
    assert refused_round[0].attributes["recallbound.refusal.reason"] == "rounds"
    assert refused_round[0].attributes["recallbound.run.reserved"] == 4


async def test_deadline_outcome_is_traced(otel: Otel) -> None:
    clock = ManualClock(wall=1_000_000.0, monotonic=5.0)
    allowance = RecallAllowance(
        MemoryLedger(), policy=AllowancePolicy(deadline_s=1.0), clock=clock)
    async with allowance.round("r1", RoundKind.AUTOMATIC) as permit:
        clock.advance(2.0)
        with pytest.raises(RecallBudgetExceeded):
            async with permit.attempt(AttemptKind.BASE):
                pass  # pragma: no cover
    assert otel.points("recallbound.refusals") == {
        (("kind", "base"), ("reason", "deadline"), ("what", "attempt")): 1}
    (round_span,) = otel.finished("recallbound.round")
    assert [e.name for e in round_span.events] == ["recallbound.refusal"]


async def test_round_span_is_current_in_the_body_and_restored_after(
    otel: Otel, allowance: RecallAllowance
) -> None:
    from opentelemetry import trace

    before = trace.get_current_span()
    async with allowance.round("r1", RoundKind.AUTOMATIC):
        inside = trace.get_current_span()
    assert trace.get_current_span() is before
    (round_span,) = otel.finished("recallbound.round")
    assert round_span.context is not None
    assert inside.get_span_context().span_id == round_span.context.span_id


async def test_uninstalled_observes_nothing(allowance: RecallAllowance) -> None:
    probe = Otel()
    telemetry.uninstall(probe.observer)
    assert observe.current_observer() is None
    async with allowance.round("r1", RoundKind.AUTOMATIC) as permit:
        async with permit.attempt(AttemptKind.BASE):
            pass
    assert probe.spans.get_finished_spans() == ()
    assert probe.points("recallbound.rounds") == {}


async def test_a_search_left_past_its_deadline_ends_its_span_without_an_error_log(
    otel: Otel, tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    # The search's attempt span was made current in the search's own task; the caller that
    # gives up on it ends the span in its task, where there is nothing to detach.
    import logging
    from pathlib import Path

    from opentelemetry import trace

    from plugin import Evidence, SearchRequest, SimpleRetriever
    from runtime_hooks.bootstrap import RecallConfig, open_hooks
    from runtime_hooks.hooks import ToolCall

    release = anyio.Event()

    async def search(request: SearchRequest) -> list[Evidence]:
        with anyio.CancelScope(shield=True):
            await release.wait()
        return []

    assert isinstance(tmp_path, Path)
    config = RecallConfig(ledger_path=tmp_path / "ledger.db",
                          policy=AllowancePolicy(deadline_s=0.2))
    before = trace.get_current_span()
    with caplog.at_level(logging.ERROR):
        async with open_hooks(config, retriever=SimpleRetriever(search)) as hooks:
            (result,) = await hooks.dispatch(
                [ToolCall(call_id="c1", arguments={"query": "cutover"})],
                run_id="run-late", scope="work", principal="ana")
            assert trace.get_current_span() is before
            release.set()
    assert result.status == "refused"
    (attempt,) = otel.finished("recallbound.attempt")
    assert attempt.attributes is not None
    assert attempt.attributes["recallbound.outcome"] == "deadline"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
