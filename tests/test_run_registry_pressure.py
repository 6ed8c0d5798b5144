"""Run registries under pressure from other runs: many runs interleaved through one
:class:`RunRecalls` with the smallest bound, on both loops. What the registry forgets the
ledger still answers: a replayed call never searches again, a continued run gets no fresh
allowance, another principal stays refused, and memory stays at the bound."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from plugin import ManualClock
from plugin.control import SqliteLedger
from plugin.errors import RunIdentityError
from runtime_hooks import ToolCall
from runtime_hooks.adapters.batch import RunRecalls

from ._calls_env import WALL, Counting, P, S, recall_hooks

pytestmark = pytest.mark.anyio


def _call(call_id: str, query: str = "cutover") -> ToolCall:
    return ToolCall(call_id=call_id, arguments={"query": query})


@pytest.mark.parametrize("max_runs", [1, 2])
async def test_interleaved_runs_replay_from_the_ledger_and_keep_their_bounds(
    tmp_path: Path, max_runs: int
) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    retriever = Counting()
    runs_count = 6
    async with SqliteLedger(tmp_path / "ledger.db") as ledger:
        hooks = recall_hooks(ledger, clock, retriever)
        runs = RunRecalls(hooks, max_runs=max_runs)
        first: dict[str, list[tuple[str, int | None, tuple[str, ...]]]] = {}

        async def one(run_id: str) -> None:
            batch = [_call("c1"), _call("c2", "deploy window")]
            answered = await runs.get(run_id, scope=S, principal=P).dispatch_batch(batch)
            first[run_id] = [(r.status, r.slot, tuple(e.id for e in r.evidence))
                             for r in answered]
            await anyio.sleep(0)
            again = await runs.get(run_id, scope=S, principal=P).dispatch_batch(batch)
            assert [(r.status, r.slot, tuple(e.id for e in r.evidence)) for r in again] == \
                first[run_id]
            # The run goes on: a new batch takes what its allowance still has, no more.
            more = [_call(f"n{i}", f"query {i}") for i in range(4)]
            later = await runs.get(run_id, scope=S, principal=P).dispatch_batch(more)
            assert sorted(r.status for r in later) == ["ok", "ok", "refused", "refused"]
            last = await runs.get(run_id, scope=S, principal=P).dispatch_batch(
                [_call("z", "one more")])
            assert last[0].status == "refused"

        async with anyio.create_task_group() as group:
            for i in range(runs_count):
                group.start_soon(one, f"run-{i}")
        assert retriever.searches == runs_count * 4
        for i in range(runs_count):
            usage = await ledger.usage(f"run-{i}")
            assert (usage.rounds, usage.reserved, usage.executed) == (2, 4, 4)
        assert len(runs._runs) <= max_runs
        with pytest.raises(RunIdentityError):
            await runs.get("run-0", scope=S, principal="mallory").dispatch_batch([_call("c1")])
        assert retriever.searches == runs_count * 4


class _Gated(Counting):
    """A retriever whose searches wait for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.release = anyio.Event()
        self.started = anyio.Event()

    async def search(self, request: object) -> list:  # type: ignore[type-arg]
        self.started.set()
        await self.release.wait()
        return await super().search(request)


async def test_a_batch_in_flight_while_its_run_is_forgotten_is_searched_once(
    tmp_path: Path,
) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    retriever = _Gated()
    async with SqliteLedger(tmp_path / "ledger.db") as ledger:
        hooks = recall_hooks(ledger, clock, retriever)
        runs = RunRecalls(hooks, max_runs=1)
        batch = [_call("c1"), _call("c2", "deploy window")]
        answers: list[list[tuple[str, int | None, tuple[str, ...]]]] = []

        async def send() -> None:
            got = await runs.get("a", scope=S, principal=P).dispatch_batch(batch)
            answers.append([(r.status, r.slot, tuple(e.id for e in r.evidence)) for r in got])

        async with anyio.create_task_group() as group:
            group.start_soon(send)
            await retriever.started.wait()
            runs.get("b", scope=S, principal=P)  # forgets "a" while its batch searches
            group.start_soon(send)  # the framework sends the batch again meanwhile
            await anyio.sleep(0.05)
            with pytest.raises(RunIdentityError):
                await runs.get("a", scope=S, principal="mallory").dispatch_batch(batch)
            retriever.release.set()
        first, second = answers
        assert first == second and [s for s, _, _ in first] == ["ok", "ok"]
        assert retriever.searches == 2
        usage = await ledger.usage("a")
        assert (usage.rounds, usage.reserved, usage.executed) == (1, 2, 2)
