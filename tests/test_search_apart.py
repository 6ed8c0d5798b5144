"""A search runs in its attempt, in a task of its own: what that must not change.

The slot is taken and the retriever called in that task, and the caller waits for it until the
deadline and a grace. These attacks check what the caller's own task used to give for free: a
trace for every attempt (written while the round is open, whatever happens to the hooks after),
a cancellation the search brings on itself kept to its own call, and Ctrl-C on trio.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from plugin import AllowancePolicy, Evidence, SearchRequest, SimpleRetriever, WorkingState
from plugin.control import SqliteLedger
from plugin.memory.protocol import Found
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.hooks import ToolCall

P, S = "ana", "work"


async def _outcomes(ledger: Path, run_id: str) -> list[str]:
    """The run's attempt outcomes by slot, read from the ledger file once the hooks closed."""
    async with SqliteLedger(ledger) as opened:
        return [trace.outcome.value for trace in sorted(await opened.attempts(run_id),
                                                  key=lambda trace: trace.slot)]


def _call(call_id: str, query: str = "cutover") -> ToolCall:
    return ToolCall(call_id=call_id, arguments={"query": query})


async def test_a_search_left_past_its_deadline_is_traced_deadline_though_the_hooks_closed(
    anyio_backend: object, tmp_path: Path
) -> None:
    # The caller stops waiting a grace after the deadline and records the attempt then, in
    # the round still open: the search that ends later, after the ledger closed, owes nothing.
    release, ended = anyio.Event(), anyio.Event()

    async def search(request: SearchRequest) -> list[Evidence]:
        try:
            with anyio.CancelScope(shield=True):
                await release.wait()
            return [Evidence(id="m-late", text="cutover at noon")]
        finally:
            ended.set()

    ledger, run_id = tmp_path / "ledger.db", f"run-{uuid.uuid4()}"
    config = RecallConfig(ledger_path=ledger, policy=AllowancePolicy(deadline_s=0.3))
    async with open_hooks(config, retriever=SimpleRetriever(search)) as hooks:
        (result,) = await hooks.dispatch([_call("c1")], run_id=run_id, scope=S, principal=P)
    assert result.status == "refused" and "m-late" not in result.content
    release.set()
    with anyio.fail_after(5):
        await ended.wait()
    await anyio.sleep(0.05)  # what the late search's task does after it returns
    assert await _outcomes(ledger, run_id) == ["deadline"]


async def test_a_search_the_host_cancels_ends_its_attempt_before_the_caller_goes_on(
    anyio_backend: object, tmp_path: Path
) -> None:
    # A cooperative search takes the host's cancellation at once: its attempt is traced
    # cancelled before the turn unwinds, never left in flight when the hooks close.
    started = anyio.Event()

    async def search(request: SearchRequest) -> list[Evidence]:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    ledger = tmp_path / "ledger.db"
    runs = [f"run-{uuid.uuid4()}" for _ in range(5)]
    async with open_hooks(RecallConfig(ledger_path=ledger),
                          retriever=SimpleRetriever(search)) as hooks:
        for run_id in runs:
            async with anyio.create_task_group() as tg:
                async def prepare(run_id: str = run_id) -> None:
                    await hooks.prepare(WorkingState("cutover"), run_id=run_id, scope=S,
                                        principal=P)

                tg.start_soon(prepare)
                await started.wait()
                tg.cancel_scope.cancel()
            started = anyio.Event()
    assert [await _outcomes(ledger, run_id) for run_id in runs] == [["cancelled"]] * 5


async def test_a_search_that_cancels_itself_fails_its_own_call_only(
    anyio_backend: str, tmp_path: Path
) -> None:
    searched: list[str] = []

    async def search(request: SearchRequest) -> list[Evidence]:
        searched.append(request.text)
        if request.text == "bad":
            if anyio_backend == "trio":
                import trio

                caught: BaseException | None = None
                with trio.CancelScope() as own:
                    own.cancel()
                    try:
                        await trio.sleep(0)
                    except trio.Cancelled as exc:
                        caught = exc
                assert caught is not None
                raise caught
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)
        return [Evidence(id="m1", text="cutover on friday")]

    calls = [_call("c0", "bad"), _call("c1", "good one"), _call("c2", "good two")]
    async with open_hooks(RecallConfig(ledger_path=tmp_path / "ledger.db"),
                          retriever=SimpleRetriever(search)) as hooks:
        results = await hooks.dispatch(calls, run_id="r", scope=S, principal=P)
    assert [(r.status, r.failure) for r in results] == [
        ("failed", "raised"), ("ok", None), ("ok", None)]
    assert sorted(searched) == ["bad", "good one", "good two"]


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_ctrl_c_reaches_a_search_on_trio(anyio_backend: str, tmp_path: Path) -> None:
    # A trio system task is shielded from KeyboardInterrupt unless it says otherwise; the
    # search's task says so, so Ctrl-C stops a search that blocks the loop as it would in the
    # caller's own task.
    import trio

    protected: list[bool] = []

    async def search(request: SearchRequest) -> list[Evidence]:
        protected.append(trio.lowlevel.currently_ki_protected())
        return [Evidence(id="m1", text="cutover on friday")]

    async with open_hooks(RecallConfig(ledger_path=tmp_path / "ledger.db"),
                          retriever=SimpleRetriever(search)) as hooks:
        (result,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
    assert result.status == "ok"
    assert protected == [False]


class _StubbornBeliefs:
    """A retriever whose searches name Priya and read her beliefs nested, and whose belief
    read will not be cancelled until the test releases it."""

    def __init__(self) -> None:
        self.release = anyio.Event()

    def searchable(self, prepared: Any) -> bool:
        return True

    async def named_people(self, prepared: Any) -> tuple[str, ...]:
        return ("Priya",)

    async def search(self, prepared: Any, handle: Any, *, caps: Any,
                     nested_beliefs: bool) -> Found:
        if nested_beliefs:
            await handle.nested(("Priya",))
        return Found(evidence=(), people=("Priya",))

    async def read_beliefs(self, people: Any, handle: Any, *, principal: str, scope: str,
                           caps: Any) -> tuple[Evidence, ...]:
        with anyio.CancelScope(shield=True):
            await self.release.wait()
        return ()

    async def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:
        return ()

    async def revalidate(self, ids: Any, *, principal: str,
                         scope: str) -> tuple[Evidence, ...]:
        return ()


@pytest.mark.parametrize("ends", ["deadline", "host"])
async def test_a_nested_read_that_will_not_end_ends_with_its_search(
    anyio_backend: object, tmp_path: Path, ends: str
) -> None:
    # The nested reads' attempts are the search's: when its caller gives up on it (the
    # deadline's grace, the host's cancellation), they are ended and traced with it, never
    # left in flight in the ledger once the hooks closed.
    retriever = _StubbornBeliefs()
    ledger, run_id = tmp_path / "ledger.db", f"run-{uuid.uuid4()}"
    policy = AllowancePolicy(max_searches=4, deadline_s=0.3 if ends == "deadline" else 10.0)
    async with open_hooks(RecallConfig(ledger_path=ledger, policy=policy),
                          retriever=retriever) as hooks:
        with anyio.move_on_after(30 if ends == "deadline" else 0.2):
            await hooks.dispatch([_call("c0", "Priya cutover"), _call("c1", "Priya plan")],
                                 run_id=run_id, scope=S, principal=P)
    retriever.release.set()
    await anyio.sleep(0.2)  # the released reads end, in tasks of their own
    expected = "deadline" if ends == "deadline" else "cancelled"
    assert await _outcomes(ledger, run_id) == [expected] * 4
