"""A call is claimed in the ledger before it searches: the same call sent twice at once, sent
again after it was cancelled mid-search, or sent to a pruned run never searches a second time.

Two hooks objects over one ledger stand for two processes (nothing but the ledger is shared);
SQLite and PostgreSQL, both loops.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from plugin import Evidence, ManualClock, SimpleRetriever
from plugin.control import SqliteLedger
from plugin.errors import LedgerLockedError, LedgerUnavailableError
from runtime_hooks import RecallHooks, ToolCall
from runtime_hooks.adapters.batch import RunRecalls

from ._calls_env import MEMORIES, WALL, Counting, P, S, ledger_openers, recall_hooks

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["sqlite", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    with ledger_openers(request.param, tmp_path, "claims") as opened:
        yield opened

class Held(Counting):
    """A retriever whose searches wait until ``release`` is set (``started`` says one began)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = anyio.Event()
        self.release = anyio.Event()
        self.retriever = SimpleRetriever(self.search, get=self.get)

    async def search(self, request: Any) -> list[Evidence]:
        self.searches += 1
        self.started.set()
        await self.release.wait()
        return list(MEMORIES.values())


@contextlib.asynccontextmanager
async def _hooks(opener: Callable[[], Any], clock: ManualClock,
                 retriever: Counting) -> AsyncIterator[RecallHooks]:
    async with opener() as ledger:
        yield recall_hooks(ledger, clock, retriever)


CALL = ToolCall(call_id="c1", arguments={"query": "cutover"})


async def _counts(hooks: RecallHooks) -> tuple[int, int]:
    usage = await hooks.allowance.ledger.usage("r")
    return usage.rounds, usage.reserved


async def test_the_same_call_sent_twice_at_once_searches_once(
    opener: Callable[[], Any],
) -> None:
    clock, retriever = ManualClock(wall=WALL, monotonic=1.0), Counting()
    answers: list[Any] = []
    async with _hooks(opener, clock, retriever) as hooks:

        async def send() -> None:
            answers.extend(await hooks.dispatch([CALL], run_id="r", scope=S, principal=P))

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            tg.start_soon(send)
        assert retriever.searches == 1 and await _counts(hooks) == (1, 1)
    # in one process the second waits for the first and answers with its outcome
    assert [(a.status, a.slot) for a in answers] == [("ok", 1), ("ok", 1)]
    assert [e.id for e in answers[0].evidence] == [e.id for e in answers[1].evidence]


async def test_the_same_call_sent_to_two_processes_at_once_searches_once(
    opener: Callable[[], Any],
) -> None:
    clock, first, second = ManualClock(wall=WALL, monotonic=1.0), Held(), Counting()
    async with _hooks(opener, clock, first) as one, _hooks(opener, clock, second) as two:
        answers: dict[str, Any] = {}

        async def send(name: str, hooks: RecallHooks) -> None:
            (answers[name],) = await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, "one", one)
            await first.started.wait()  # the first is searching when the second arrives
            await send("two", two)
            first.release.set()
        assert (first.searches, second.searches) == (1, 0)
        assert await _counts(two) == (1, 1)
        assert (answers["one"].status, answers["one"].slot) == ("ok", 1)
        late = answers["two"]
        assert (late.status, late.failure, late.slot) == ("failed", "in_flight", None)
        assert "not searched again" in late.content and "not evidence" in late.content
        # once the first has answered, the call replays its outcome everywhere
        (again,) = await two.dispatch([CALL], run_id="r", scope=S, principal=P)
        assert (again.status, again.slot, second.searches) == ("ok", 1, 0)


async def test_an_adapter_never_keeps_an_in_flight_answer(opener: Callable[[], Any]) -> None:
    clock, first, second = ManualClock(wall=WALL, monotonic=1.0), Held(), Counting()
    async with _hooks(opener, clock, first) as one, _hooks(opener, clock, second) as two:
        recall = RunRecalls(two).get("r", scope=S, principal=P)
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(one.dispatch, [CALL], run_id="r", scope=S,
                                            principal=P))
            await first.started.wait()
            (late,) = await recall.dispatch_batch([CALL])
            assert late.failure == "in_flight"
            assert (await recall.recorded(CALL.call_id, CALL.arguments)).failure == "in_flight"
            first.release.set()
        (again,) = await recall.dispatch_batch([CALL])  # asked again: the outcome is there
        assert (again.status, again.slot, second.searches) == ("ok", 1, 0)


async def test_a_batch_of_other_calls_is_not_held_up_by_a_batch_still_searching(
    opener: Callable[[], Any],
) -> None:
    """An adapter waits only for a batch that shares a call with its own: a later turn's
    search runs while an earlier turn's (left running by its framework after the host
    cancelled it) still searches; the same batch sent again meanwhile waits and searches
    nothing."""
    clock, retriever = ManualClock(wall=WALL, monotonic=1.0), Held()
    async with _hooks(opener, clock, retriever) as hooks:
        recall = RunRecalls(hooks).get("r", scope=S, principal=P)
        later = ToolCall(call_id="c2", arguments={"query": "rollback"})
        firsts: list[Any] = []

        async def first_batch() -> None:
            firsts.extend(await recall.dispatch_batch([CALL]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(first_batch)
            await retriever.started.wait()
            retriever.started = anyio.Event()
            tg.start_soon(first_batch)  # the same batch again: it waits for the first
            with anyio.fail_after(30):  # a guard only: the search below is not held
                searching = anyio.Event()

                async def later_batch() -> None:
                    (answer,) = await recall.dispatch_batch([later])
                    assert (answer.status, answer.slot) == ("ok", 2)
                    searching.set()

                tg.start_soon(later_batch)
                await retriever.started.wait()  # the later call is searching, the first too
                assert retriever.searches == 2 and not firsts
                retriever.release.set()
                await searching.wait()
        assert [(a.status, a.slot) for a in firsts] == [("ok", 1), ("ok", 1)]
        assert retriever.searches == 2 and await _counts(hooks) == (2, 2)


async def test_a_made_up_call_sent_again_is_not_searched_again(
    opener: Callable[[], Any],
) -> None:
    made_up = ToolCall.with_new_id({"query": "cutover"})
    clock, retriever = ManualClock(wall=WALL, monotonic=1.0), Counting()
    async with _hooks(opener, clock, retriever) as hooks:
        answers: list[Any] = []

        async def send(call: ToolCall) -> None:
            answers.extend(await hooks.dispatch([call], run_id="r", scope=S, principal=P))

        async with anyio.create_task_group() as tg:  # the same object twice at once
            tg.start_soon(send, made_up)
            tg.start_soon(send, made_up)
        await send(copy.copy(made_up))  # and again later, as a copy
        assert retriever.searches == 1 and await _counts(hooks) == (1, 1)
    assert [(a.status, a.slot) for a in answers] == [("ok", 1)] * 3


@pytest.mark.parametrize("made_up", [False, True])
async def test_a_call_cancelled_mid_search_is_not_searched_again(
    opener: Callable[[], Any], made_up: bool
) -> None:
    call = ToolCall.with_new_id(CALL.arguments) if made_up else CALL
    clock, held = ManualClock(wall=WALL, monotonic=1.0), Held()
    async with _hooks(opener, clock, held) as hooks:
        async with anyio.create_task_group() as tg:

            async def send() -> None:
                await hooks.dispatch([call], run_id="r", scope=S, principal=P)

            tg.start_soon(send)
            await held.started.wait()
            tg.cancel_scope.cancel()
        held.release.set()
        (again,) = await hooks.dispatch([call], run_id="r", scope=S, principal=P)
        assert held.searches == 1 and await _counts(hooks) == (1, 1)
        assert (again.status, again.failure) == ("failed", "in_flight")
    fresh = Counting()
    rebuilt = ToolCall(call_id=call.call_id, arguments=call.arguments)
    async with _hooks(opener, clock, fresh) as hooks:  # another process, later
        (later,) = await hooks.dispatch([rebuilt], run_id="r", scope=S, principal=P)
        assert (later.status, later.failure, fresh.searches) == ("failed", "in_flight", 0)
        report = await hooks.allowance.ledger.admin().check()
        assert report.ok, report


async def test_a_pruned_run_opens_no_round_for_a_clock_that_is_behind(
    opener: Callable[[], Any],
) -> None:
    clock, retriever = ManualClock(wall=WALL, monotonic=1.0), Counting()
    async with _hooks(opener, clock, retriever) as hooks:
        await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
        clock.advance(20.0)
        late = ToolCall(call_id="c2", arguments={"query": "deploy"})
        (refused,) = await hooks.dispatch([late], run_id="r", scope=S, principal=P)
        assert refused.status == "refused"
        report = await hooks.allowance.ledger.admin().prune(
            before_wall=WALL + 30, now_wall=WALL + 30, dry_run=False)
        assert report.run_ids == ("r",)
    behind = ManualClock(wall=WALL + 5, monotonic=1.0)
    again = Counting()
    async with _hooks(opener, behind, again) as hooks:
        results = await hooks.dispatch(
            [CALL, ToolCall(call_id="c3", arguments={"query": "kickoff"})],
            run_id="r", scope=S, principal=P)
        assert [r.status for r in results] == ["refused", "refused"]
        assert again.searches == 0
        report = await hooks.allowance.ledger.admin().check()  # refusals of a tombstone: sound
        assert report.ok, report


_KILLED_WORKER = """
import sys, anyio
from plugin import Evidence, ManualClock, SimpleRetriever
from plugin.control import SqliteLedger
from plugin.errors import LedgerLockedError, LedgerUnavailableError
from runtime_hooks import ToolCall
from tests._calls_env import WALL, Counting, P, S, recall_hooks

class Stuck(Counting):
    async def search(self, request):
        print("searching", flush=True)
        await anyio.sleep_forever()

async def main():
    async with SqliteLedger(sys.argv[1]) as ledger:
        hooks = recall_hooks(ledger, ManualClock(wall=WALL, monotonic=1.0), Stuck())
        await hooks.dispatch([ToolCall(call_id="c1", arguments={"query": "cutover"})],
                             run_id="r", scope=S, principal=P)

anyio.run(main)
"""


@pytest.mark.slow
async def test_a_call_whose_process_was_killed_mid_search_is_not_searched_again(
    tmp_path: Path,
) -> None:
    ledger_file = tmp_path / "ledger.sqlite3"
    with subprocess.Popen([sys.executable, "-c", _KILLED_WORKER, str(ledger_file)],
                          stdout=subprocess.PIPE, text=True,
                          cwd=Path(__file__).parent.parent) as worker:
        try:
            assert worker.stdout is not None and worker.stdout.readline() == "searching\n"
        finally:
            worker.kill()  # SIGKILL: nothing of the call's outcome is written
            worker.wait()
    fresh = Counting()
    async with _hooks(lambda: SqliteLedger(ledger_file),
                      ManualClock(wall=WALL, monotonic=1.0), fresh) as hooks:
        (again,) = await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
        assert (again.status, again.failure, fresh.searches) == ("failed", "in_flight", 0)
        assert await _counts(hooks) == (1, 1)  # the killed attempt's round, and no other
        # its trace was never committed: reserved, not executed (the slot stays spent)
        assert (await hooks.allowance.ledger.usage("r")).executed == 0
        report = await hooks.allowance.ledger.admin().check()
        assert report.ok, report


class _Failing:
    """A ledger whose next reservation fails as if the database were gone (all else passes)."""

    def __init__(self, ledger: Any) -> None:
        self._ledger, self.fail_next = ledger, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail_next:
            self.fail_next = False
            raise LedgerUnavailableError("the database went away")
        return await self._ledger.reserve(*args, **kwargs)


class _Stalling(Counting):
    """A retriever that, while ``stall`` is set, waits in ``named_people``: after the call was
    claimed and before its round is reserved."""

    def __init__(self) -> None:
        super().__init__()
        self.stall, self.stalled = False, anyio.Event()
        counting = self

        class Retriever(SimpleRetriever):
            async def named_people(self, prepared: Any) -> Any:
                if counting.stall:
                    counting.stalled.set()
                    await anyio.sleep_forever()
                return await super().named_people(prepared)

        self.retriever = Retriever(self.search, get=self.get)


@pytest.mark.parametrize("failure", ["cancelled", "ledger"])
async def test_a_call_that_failed_before_its_round_was_granted_runs_when_sent_again(
    opener: Callable[[], Any], failure: str
) -> None:
    # Nothing searched and nothing was reserved: the call's claim is withdrawn, so it is not
    # answered in_flight for ever, here or in another process.
    clock, retriever = ManualClock(wall=WALL, monotonic=1.0), _Stalling()
    async with opener() as opened:
        ledger = _Failing(opened)
        hooks = recall_hooks(ledger, clock, retriever)
        if failure == "cancelled":
            retriever.stall = True
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(hooks.dispatch, [CALL], run_id="r", scope=S,
                                                principal=P))
                await retriever.stalled.wait()
                tg.cancel_scope.cancel()
            retriever.stall = False
        else:
            ledger.fail_next = True
            with pytest.raises(LedgerUnavailableError):
                await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
        assert retriever.searches == 0 and await _counts(hooks) == (0, 0)
    fresh = Counting()
    async with _hooks(opener, clock, fresh) as hooks:  # another process, later
        (again,) = await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
        assert (again.status, again.slot, fresh.searches) == ("ok", 1, 1)
        assert await _counts(hooks) == (1, 1)
        report = await hooks.allowance.ledger.admin().check()
        assert report.ok, report


async def test_a_claim_withdrawn_while_another_sender_claims_is_never_searched_twice(
    opener: Callable[[], Any],
) -> None:
    # B claims the call and fails before its round, so it withdraws its claim. A sent the
    # call meanwhile: its claim wrote nothing (B's was there) and its read-back comes after
    # B's withdrawal. A must claim again rather than search with no claim in the ledger, or a
    # third sender C claims afresh and searches a second time.
    clock = ManualClock(wall=WALL, monotonic=1.0)
    a_wrote, b_withdrew, b_claimed = anyio.Event(), anyio.Event(), anyio.Event()
    first, second, third = Held(), Counting(), Counting()
    async with opener() as one, opener() as two, opener() as three:
        read_a, claim_b, release_b = one.recorded_calls, two.claim_calls, two.release_calls

        async def a_reads(run_id: str, ids: Any) -> Any:
            a_wrote.set()
            await b_withdrew.wait()
            return await read_a(run_id, ids)

        async def b_claims(run_id: str, calls: Any) -> Any:
            held = await claim_b(run_id, calls)
            b_claimed.set()
            return held

        async def b_fails(*args: Any, **kwargs: Any) -> Any:
            await a_wrote.wait()
            raise LedgerUnavailableError("the database went away")

        async def b_withdraws(run_id: str, calls: Any) -> None:
            await release_b(run_id, calls)
            b_withdrew.set()

        one.recorded_calls = a_reads
        two.claim_calls, two.reserve, two.release_calls = b_claims, b_fails, b_withdraws
        a, b, c = (recall_hooks(one, clock, first), recall_hooks(two, clock, second),
                   recall_hooks(three, clock, third))
        answers: dict[str, Any] = {}

        async def send_b() -> None:
            with pytest.raises(LedgerUnavailableError):
                await b.dispatch([CALL], run_id="r", scope=S, principal=P)

        async def send_a() -> None:
            await b_claimed.wait()
            (answers["a"],) = await a.dispatch([CALL], run_id="r", scope=S, principal=P)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_b)
            tg.start_soon(send_a)
            await first.started.wait()  # A searches, under a claim of its own
            (answers["c"],) = await c.dispatch([CALL], run_id="r", scope=S, principal=P)
            first.release.set()
        assert (first.searches, second.searches, third.searches) == (1, 0, 0)
        assert (answers["c"].status, answers["c"].failure) == ("failed", "in_flight")
        assert answers["a"].status == "ok" and await _counts(c) == (1, 1)


@pytest.mark.parametrize("failure", ["locked", "cancelled"])
async def test_a_claim_whose_read_back_failed_is_withdrawn(
    opener: Callable[[], Any], failure: str
) -> None:
    # The claim was written, then reading it back failed or was cancelled: nothing ran, so
    # the claim goes and the call sent again runs.
    clock, retriever = ManualClock(wall=WALL, monotonic=1.0), Counting()
    async with opener() as ledger:
        read, reading, armed = ledger.recorded_calls, anyio.Event(), [True]

        async def reads(run_id: str, call_ids: Any) -> Any:
            if armed.pop() if armed else False:
                if failure == "locked":
                    raise LedgerLockedError("database is locked")
                reading.set()
                await anyio.sleep_forever()
            return await read(run_id, call_ids)

        ledger.recorded_calls = reads
        hooks = recall_hooks(ledger, clock, retriever)
        if failure == "locked":
            with pytest.raises(LedgerLockedError):
                await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
        else:
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(hooks.dispatch, [CALL], run_id="r", scope=S,
                                                principal=P))
                await reading.wait()
                tg.cancel_scope.cancel()
        assert await read("r", ["c1"]) == [] and retriever.searches == 0
        (again,) = await hooks.dispatch([CALL], run_id="r", scope=S, principal=P)
        assert (again.status, again.slot, retriever.searches) == ("ok", 1, 1)
