"""ProcessRetriever: the boundary for a retriever you do not trust is another process.

Real worker processes on both loops. The frame- and gc-walking probe below reaches permits
when it runs in-process (the honest threat model) and reaches nothing inside a worker, while
the run's slots hold and results arrive. A crashing, junk-returning or hung worker is that
call's ``failed`` result, and the next call gets a fresh worker.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from plugin import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ManualClock,
    ProcessRetriever,
    RefusalReason,
    SimpleRetriever,
    SystemClock,
    WorkingState,
)
from plugin.memory.process import ProcessRetriever as FromModule

from . import _process_factories as factories
from ._hooks_env import each_way, hooks_over, search_calls, usage_counts
from ._procs import running

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

P, S = "ana", "atlas"



@pytest.fixture
async def probing() -> AsyncIterator[ProcessRetriever]:
    async with ProcessRetriever(factories.probing) as retriever:
        yield retriever


def _probe(text: str) -> dict[str, int]:
    return {key: int(value) for key, value in (part.split("=") for part in text.split())}


async def test_a_walking_retriever_in_process_reaches_the_permit(clock: ManualClock) -> None:
    # The threat model, shown: in-process, frames and the gc lead to the run's permit.
    hooks = hooks_over(factories.probing(), clock)
    (result,) = await hooks.dispatch(search_calls("cutover"), run_id="r", scope=S, principal=P)
    probe = next(e for e in result.evidence if e.id == "probe")
    assert _probe(probe.text)["permits"] >= 1
    assert _probe(probe.text)["pid"] == os.getpid()


async def test_a_walking_retriever_in_a_worker_reaches_nothing_and_the_slots_hold(
    clock: ManualClock, probing: ProcessRetriever
) -> None:
    assert FromModule is ProcessRetriever
    hooks = hooks_over(probing, clock)
    results = await hooks.dispatch(search_calls("cutover", "deploy", "rounding", "backfill",
                                                "night"),
                                   run_id="r", scope=S, principal=P)
    assert [r.status for r in results] == ["ok", "ok", "ok", "ok", "refused"]
    assert results[4].refusal is not None and results[4].refusal.reason is RefusalReason.SLOTS
    expected = ["m-cutover", "m-deploy", "m-rounding", "m-backfill"]
    for result, memory in zip(results[:4], expected, strict=True):
        ids = [e.id for e in result.evidence]
        assert memory in ids
        probe = _probe(next(e for e in result.evidence if e.id == "probe").text)
        assert probe["permits"] == 0 and probe["allowances"] == 0
        assert probe["pid"] != os.getpid()
    assert await usage_counts(hooks, "r") == (1, 4, 4, 1)


async def test_the_automatic_round_runs_through_a_worker(
    clock: ManualClock, probing: ProcessRetriever
) -> None:

    hooks = hooks_over(probing, clock)
    context = await hooks.prepare(WorkingState("cutover friday"), run_id="r", scope=S,
                                  principal=P)
    assert "m-cutover" in [e.id for e in context.evidence]
    assert probing.started >= 1


async def test_a_crashing_worker_is_that_calls_failure_and_is_replaced(
    clock: ManualClock,
) -> None:
    async with ProcessRetriever(factories.crashing) as retriever:
        hooks = hooks_over(retriever, clock)
        results = await hooks.dispatch(search_calls("crash now", "fine one"), run_id="r",
                                       scope=S, principal=P)
        assert [r.status for r in results] == ["failed", "ok"]
        assert results[0].evidence == ()
        assert [e.id for e in results[1].evidence] == ["m-ok"]
        started = retriever.started
        (later,) = await hooks.dispatch(search_calls("fine again"), run_id="r", scope=S,
                                        principal=P)
        assert later.status == "ok"
        assert retriever.started <= started + 1
    assert await usage_counts(hooks, "r") == (2, 3, 3, 0)


async def test_junk_and_noise_from_a_worker_are_that_calls_failure(clock: ManualClock) -> None:
    async with ProcessRetriever(factories.junk) as retriever:
        hooks = hooks_over(retriever, clock)
        results = await hooks.dispatch(search_calls("junk please", "fine"), run_id="r",
                                       scope=S, principal=P)
    assert [r.status for r in results] == ["failed", "ok"]
    assert results[0].failure == "bad_result"  # as the same retriever in-process says


async def test_a_hung_worker_is_killed_at_the_deadline_and_replaced() -> None:
    # A real subprocess blocks in real time, so this test runs on the system clock with a
    # short deadline: the attempt's cancel scope is the only thing that ends the call.
    async with ProcessRetriever(factories.hanging) as retriever:
        await retriever.start()
        hooks = hooks_over(retriever, SystemClock(), deadline_s=1.0)
        (hung,) = await hooks.dispatch(search_calls("hang here"), run_id="r", scope=S,
                                       principal=P)
        assert hung.status == "refused"
        assert hung.refusal is not None and hung.refusal.reason is RefusalReason.DEADLINE
        assert retriever._idle == []  # the stuck worker was killed, not kept
        hooks = hooks_over(retriever, SystemClock(), deadline_s=5.0)
        (fine,) = await hooks.dispatch(search_calls("all fine"), run_id="r2", scope=S,
                                       principal=P)
        assert fine.status == "ok" and retriever.started == 2


async def test_a_worker_that_answers_junk_is_killed_and_the_next_call_gets_a_fresh_one() -> None:
    async with ProcessRetriever(factories.rogue, idle_workers=1) as retriever:
        hooks = hooks_over(retriever, SystemClock(), deadline_s=5.0)
        (junk,) = await hooks.dispatch(search_calls("nan please"), run_id="r1", scope=S,
                                       principal=P)
        assert junk.status == "failed" and junk.failure == "bad_evidence"
        (fine,) = await hooks.dispatch(search_calls("all fine"), run_id="r2", scope=S,
                                       principal="bo")
    assert fine.status == "ok" and [e.id for e in fine.evidence] == ["m-ok"]
    assert retriever.started == 2  # the junk-answering worker was not kept


async def test_a_line_a_worker_writes_out_of_turn_never_answers_another_call() -> None:
    async with ProcessRetriever(factories.rogue, idle_workers=1) as retriever:
        hooks = hooks_over(retriever, SystemClock(), deadline_s=5.0)
        (first,) = await hooks.dispatch(search_calls("answer twice"), run_id="r1", scope=S,
                                        principal=P)
        (second,) = await hooks.dispatch(search_calls("all fine"), run_id="r2", scope=S,
                                         principal="bo")
    assert first.status == "failed"  # its first line answered no request of the parent's
    assert second.status == "ok" and [e.id for e in second.evidence] == ["m-ok"]


async def test_a_worker_cuts_a_huge_result_to_the_caps_before_sending_it(
    clock: ManualClock,
) -> None:
    async with ProcessRetriever(factories.flood) as retriever:
        hooks = hooks_over(retriever, clock)
        (result,) = await hooks.dispatch(search_calls("cutover"), run_id="r", scope=S,
                                         principal=P)
    assert result.status == "ok" and {e.id for e in result.evidence} == {"m-same"}
    assert result.omitted >= 1  # more were left out, and the result says so


async def test_a_worker_cuts_long_texts_as_the_host_would_and_the_search_stands(
    clock: ManualClock,
) -> None:
    # The same retriever in process and in a worker: the same evidence and the same count of
    # what was left out (the texts cut in the worker, not a failed search).
    answers = []
    async for hooks in each_way(factories.long_texts_and_corrections, clock):
        (result,) = await hooks.dispatch(search_calls("cutover"), run_id="r", scope=S,
                                         principal=P)
        context = await hooks.prepare(WorkingState("cutover"), run_id="r2", scope=S,
                                      principal=P)
        assert result.status == "ok" and result.evidence, result.content
        assert result.omitted >= 73 and not context.notes  # the corrections were read
        answers.append(([e.id for e in result.evidence], context.corrections_omitted))
    assert answers[0] == answers[1]


async def test_long_notes_give_the_same_search_in_a_worker_as_in_process(
    clock: ManualClock,
) -> None:
    # Notes and arm names are cut in the worker as the host cuts them, so 20 MB of notes do
    # not push the answer past the pipe's cap and fail a search that stands in process.
    from . import _process_edge_factories as edge

    statuses = []
    async for hooks in each_way(edge.long_notes, clock):
        (result,) = await hooks.dispatch(search_calls("cutover"), run_id="r", scope=S,
                                         principal=P)
        statuses.append((result.status, [e.id for e in result.evidence]))
    assert statuses == [("ok", ["m-1"]), ("ok", ["m-1"])]


def _local_factory() -> SimpleRetriever:
    return factories.probing()


def test_the_factory_must_be_importable_by_name() -> None:
    def nested() -> SimpleRetriever:
        return factories.probing()

    with pytest.raises(InvalidArgumentError, match="module-level"):
        ProcessRetriever(nested)
    with pytest.raises(InvalidArgumentError, match="module-level"):
        ProcessRetriever(lambda: factories.probing())
    with pytest.raises(InvalidArgumentTypeError):
        ProcessRetriever("tests._process_factories:probing")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        ProcessRetriever(factories.probing, timeout_s=float("nan"))
    ProcessRetriever(_local_factory)  # module level in a test module: importable


async def test_a_worker_inherits_nothing_that_reaches_the_ledger(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its environment lacks the ledger's location and PostgreSQL's password; ``env=`` sets it
    whole and ``launcher=`` goes before its command (here ``env`` adding a variable)."""
    for name, value in (("RECALLBOUND_LEDGER", "ledger.db"), ("PGPASSWORD", "hunter2"),
                        ("DATABASE_URL", "postgresql://x"), ("RB_KEPT", "yes")):
        monkeypatch.setenv(name, value)

    async def seen(retriever: ProcessRetriever) -> str:
        hooks = hooks_over(retriever, clock)
        (result,) = await hooks.dispatch(search_calls("cutover"), run_id="r", scope=S,
                                         principal=P)
        return next(e.text for e in result.evidence if e.id == "env")

    async with ProcessRetriever(factories.environment) as retriever:
        assert await seen(retriever) == ("RECALLBOUND_LEDGER=- PGPASSWORD=- DATABASE_URL=- "
                                         "RB_LAUNCHED=- RB_KEPT=yes")
    given = {"PATH": os.environ["PATH"], "PGPASSWORD": "given"}
    async with ProcessRetriever(factories.environment, env=given,
                                launcher=("env", "RB_LAUNCHED=1")) as retriever:
        assert await seen(retriever) == ("RECALLBOUND_LEDGER=- PGPASSWORD=given "
                                         "DATABASE_URL=- RB_LAUNCHED=1 RB_KEPT=-")


@pytest.mark.parametrize(("option", "value"), [("env", {"A": 1}), ("env", ["A=1"]),
                                               ("launcher", "sudo -u x"), ("launcher", [1])])
def test_a_bad_env_or_launcher_is_a_typed_error(option: str, value: object) -> None:
    with pytest.raises(InvalidArgumentTypeError):
        ProcessRetriever(factories.environment, **{option: value})  # type: ignore[arg-type]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")
@pytest.mark.parametrize("launcher", [(), ("timeout", "3600")], ids=["plain", "a forking one"])
async def test_a_worker_cut_by_the_deadline_is_killed_through_its_launcher(
    tmp_path: Path, launcher: tuple[str, ...]
) -> None:
    """A launcher that forks and waits (``timeout``, ``sudo``, ``runuser``) is not the
    worker: the worker's whole process group is killed."""
    import anyio

    pidfile = tmp_path / "worker.pid"
    env = {**os.environ, "RB_PIDFILE": str(pidfile)}
    async with ProcessRetriever(factories.pid_then_hang, env=env,
                                launcher=launcher) as retriever:
        hooks = hooks_over(retriever, SystemClock(), deadline_s=1.0)
        (hung,) = await hooks.dispatch(search_calls("hang here"), run_id="r", scope=S,
                                       principal=P)
    assert hung.status == "refused"
    pid = int(pidfile.read_text())
    with anyio.fail_after(10):
        while running(pid):
            await anyio.sleep(0.05)


def test_a_launcher_given_as_an_iterator_is_kept() -> None:
    retriever = ProcessRetriever(factories.probing, launcher=iter(["env", "X=1"]))
    assert retriever._launcher == ("env", "X=1")


@pytest.mark.parametrize(("factory", "launcher"), [
    (factories.probing, ("false",)),  # a launcher that exits at once
    (factories.failing, ()),  # a factory that raises
])
async def test_start_says_typed_that_a_worker_cannot_start(
    factory: Any, launcher: tuple[str, ...]
) -> None:
    from plugin.errors import RetrieverFailedError

    async with ProcessRetriever(factory, launcher=launcher) as retriever:
        with pytest.raises(RetrieverFailedError):
            await retriever.start(workers=2)
        assert retriever._idle == []
