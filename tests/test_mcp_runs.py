"""Runs for MCP clients as they really are, in process (the SDK's in-memory client), on asyncio
and trio: a client that sends no run id gets the session's current run, which ends at its
deadline; run ids are the caller's own; and a caller opens at most ``max_runs_per_hour`` runs
an hour, counted in the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from mcp import Client

from plugin import ManualClock
from plugin.control.wording import NOT_EVIDENCE
from runtime_hooks.mcp import RecallServer

from ._mcp_env import ANA, QUERIES, ledger_id, recall_server, search, structured

pytestmark = pytest.mark.anyio

START = 1_800_000_000.0


async def burst(client: Client, queries: tuple[str, ...], **kw: Any) -> list[str]:
    found: list[Mapping[str, Any]] = []

    async def one(query: str) -> None:
        found.append(await search(client, query, **kw))

    async with anyio.create_task_group() as tg:
        for query in queries:
            tg.start_soon(one, query)
    return sorted(result["status"] for result in found)


async def test_without_a_run_id_the_session_gets_four_searches_then_a_fresh_run(
    tmp_path: Path,
) -> None:
    clock = ManualClock(wall=START, monotonic=0.0)
    async with recall_server(tmp_path, clock=clock, window_s=1.0) as server, \
            Client(server.server) as client:
        assert await burst(client, QUERIES[:2]) == ["ok", "ok"]
        clock.advance(3.0)
        assert await burst(client, QUERIES[2:4]) == ["ok", "ok"]
        refused = await search(client, QUERIES[4])
        assert refused["status"] == "refused" and refused["refusal"]["reason"] in (
            "rounds", "slots")
        clock.advance(7.5)  # 10.5 s after the run's first search: its deadline has passed
        fresh = await search(client, "invoice backfill dry-run")
        assert fresh["status"] == "ok" and "m-backfill" in fresh["evidence_ids"]
        assert await burst(client, QUERIES[:3]) == ["ok"] * 3  # the new run's slots


async def test_the_current_run_ends_at_its_deadline_not_before(tmp_path: Path) -> None:
    clock = ManualClock(wall=START, monotonic=0.0)
    async with recall_server(tmp_path, clock=clock) as server, Client(server.server) as client:
        assert (await search(client, QUERIES[0]))["status"] == "ok"
        clock.advance(9.9)
        assert (await search(client, QUERIES[1]))["status"] == "ok"
        clock.advance(0.05)
        third = await search(client, QUERIES[2])  # the same run: its two rounds are used
        assert third["status"] == "refused" and third["refusal"]["reason"] == "rounds"
        clock.advance(0.05)  # exactly at the deadline: the next call opens the next run
        assert (await search(client, QUERIES[3]))["status"] == "ok"


async def test_the_current_run_ends_when_its_time_is_up_though_the_wall_clock_stepped_back(
    tmp_path: Path,
) -> None:
    clock = ManualClock(wall=START, monotonic=0.0)
    async with recall_server(tmp_path, clock=clock) as server, Client(server.server) as client:
        assert (await search(client, QUERIES[0]))["status"] == "ok"
        clock.step_wall(-3600.0)  # an NTP step: the wall clock is an hour behind
        clock.advance(11.0)  # the run's ten seconds have really passed
        assert (await search(client, QUERIES[1]))["status"] == "ok"  # the next run


async def _run_rate(client: Client, **kw: Any) -> Mapping[str, Any]:
    result = await client.call_tool("search_memory", {"query": "cutover date"}, **kw)
    assert not result.is_error
    return structured(result)


async def test_runs_per_hour_are_capped_for_named_runs_across_servers(tmp_path: Path) -> None:
    clock = ManualClock(wall=START, monotonic=0.0)
    async with recall_server(tmp_path, clock=clock) as first:
        first = RecallServer(first.hooks, caller=ANA, max_runs_per_hour=2)
        second = RecallServer(first.hooks, caller=ANA, max_runs_per_hour=2)
        async with Client(first.server) as one, Client(second.server) as two:
            assert (await search(one, "cutover date", run_id="run-a"))["status"] == "ok"
            assert (await search(two, "cutover date", run_id="run-b"))["status"] == "ok"
            for client in (one, two):
                third = await _run_rate(client, meta={"recallbound/run_id": "run-c"})
                assert third["status"] == "refused"
                assert third["refusal"]["reason"] == "run_rate"
                assert "bounded" in third["content"] and NOT_EVIDENCE in third["content"]
                assert third["content"].count(NOT_EVIDENCE) == 1
                context = await client.call_tool(
                    "recall_context", {"current_request": "Continue"},
                    meta={"recallbound/run_id": "run-c"})
                assert structured(context)["notice"]["reason"] == "run_rate"
            # runs already opened go on; a nameless call is a new run too
            assert (await search(two, "deploy window", run_id="run-a"))["status"] == "ok"
            assert (await search(one, "deploy window"))["refusal"]["reason"] == "run_rate"
            clock.advance(3600.5)  # an hour after the first openings: room again
            assert (await search(one, "deploy window", run_id="run-c"))["status"] == "ok"


async def test_the_current_run_is_capped_too_and_opens_once_there_is_room(
    tmp_path: Path,
) -> None:
    clock = ManualClock(wall=START, monotonic=0.0)
    async with recall_server(tmp_path, clock=clock) as plain:
        server = RecallServer(plain.hooks, caller=ANA, max_runs_per_hour=1)
        async with Client(server.server) as client:
            assert (await search(client, QUERIES[0]))["status"] == "ok"
            clock.advance(11)
            assert (await search(client, QUERIES[1]))["refusal"]["reason"] == "run_rate"
            assert (await search(client, QUERIES[2]))["refusal"]["reason"] == "run_rate"
            clock.advance(3600)
            assert (await search(client, QUERIES[3]))["status"] == "ok"


async def test_recall_context_refused_for_run_rate_keeps_the_current_corrections(
    tmp_path: Path,
) -> None:
    """Current corrections take no slot: a ``recall_context`` refused for the caller's runs
    per hour shows them first, then the bounded notice, as a refusal for rounds does."""
    state = {"current_request": "Continue the invoice backfill"}
    async with recall_server(tmp_path) as plain:
        server = RecallServer(plain.hooks, caller=ANA, max_runs_per_hour=1)
        async with Client(server.server) as client:

            async def context(run_id: str) -> Mapping[str, Any]:
                return structured(await client.call_tool(
                    "recall_context", state, meta={"recallbound/run_id": run_id}))

            ok = await context("run-a")
            await context("run-a")
            by_rounds = await context("run-a")  # its two rounds are used
            by_rate = await context("run-b")  # a second run this hour
        assert (await plain.hooks.allowance.ledger.usage(ledger_id("run-b"))).rounds == 0
    assert ok["status"] == "ok" and ok["correction_ids"]
    assert by_rounds["notice"]["reason"] == "rounds"
    assert by_rate["notice"] == {"reason": "run_rate", "reserved": 0, "executed": 0}
    for refused in (by_rounds, by_rate):
        assert refused["status"] == "refused" and refused["evidence_ids"] == []
        assert refused["correction_ids"] == ok["correction_ids"]
        assert refused["context"].startswith("Current corrections:")
        assert refused["context"].count(NOT_EVIDENCE) == 1


def test_max_runs_per_hour_must_be_a_positive_int() -> None:
    for bad, error in ((0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="max_runs_per_hour"):
            RecallServer(None, max_runs_per_hour=bad)  # type: ignore[arg-type]


@attrs.define
class _SlowWrites:
    """A ledger whose identity and run-opening writes queue on one lock and take a while (a
    loaded disk): the bookkeeping a server does for a new run."""

    inner: Any
    lock: anyio.Lock = attrs.field(factory=anyio.Lock)
    writes: int = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _slow(self) -> None:
        async with self.lock:
            self.writes += 1
            await anyio.sleep(0.02)

    async def bind_identity(self, run_id: str, **kw: Any) -> None:
        if self.inner._identities.get(run_id) is None:
            await self._slow()
        await self.inner.bind_identity(run_id, **kw)

    async def open_run(self, run_id: str, **kw: Any) -> bool:
        await self._slow()
        opened: bool = await self.inner.open_run(run_id, **kw)
        return opened


@pytest.mark.parametrize("named", [True, False])
async def test_a_burst_of_a_new_run_is_one_round_however_slow_the_bookkeeping(
    tmp_path: Path, named: bool
) -> None:
    async with recall_server(tmp_path) as plain:
        slow = _SlowWrites(plain.hooks.allowance.ledger)
        hooks = attrs.evolve(plain.hooks, allowance=attrs.evolve(plain.hooks.allowance,
                                                                 ledger=slow))
        server = RecallServer(hooks, caller=ANA)  # the default window
        async with Client(server.server) as client:
            run_id = "run-burst" if named else None
            assert await burst(client, QUERIES[:3], run_id=run_id) == ["ok"] * 3
            assert slow.writes == 1  # one admission for the whole burst
            # one round for the burst, so the run still has its second round for the last slot
            last = await search(client, QUERIES[3], run_id=run_id)
            assert last["status"] == "ok"
        if named:
            usage = await plain.hooks.allowance.ledger.usage(ledger_id("run-burst"))
            assert (usage.rounds, usage.reserved) == (2, 4)


async def test_a_run_used_by_another_server_keeps_its_last_round_for_the_burst(
    tmp_path: Path,
) -> None:
    async with recall_server(tmp_path) as first, Client(first.server) as client:
        assert (await search(client, "cutover date", run_id="run-shared"))["status"] == "ok"
    # another server process (its own allowance) on the same ledger: the run has one round left
    async with recall_server(tmp_path, window_s=1.0) as second, \
            Client(second.server) as client:
        found: list[str] = []

        async def one(query: str, after: float) -> None:
            await anyio.sleep(after)  # the burst's calls arrive a little apart
            found.append((await search(client, query, run_id="run-shared"))["status"])

        async with anyio.create_task_group() as tg:
            for index, query in enumerate(QUERIES[:3]):
                tg.start_soon(one, query, 0.05 * index)
        assert found == ["ok"] * 3  # one shared last round, three slots
