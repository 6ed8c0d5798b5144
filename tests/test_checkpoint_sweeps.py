"""A fault at every checkpoint of the public operations, then a retry of the same operation.

For each operation and each fault of :mod:`tests._checkpoints` (cancellation from outside, the
monotonic clock stepped past the deadline or back, the ledger, the retriever or the store's
connection raising), the operation is cut at its 1st, 2nd, ... checkpoint. After the cut and
after a retry (same run, same call ids, no fault) the run holds: at most 4 searches in at most
2 rounds, the deadline of its first reservation, no call with a recorded outcome searched
again, an outcome for every call (a result, a typed error or the cancellation: never an
internal error, never a hang), usage that adds up; a memory write is there whole or not at all,
and its retry converges.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from plugin import (
    AllowancePolicy,
    Evidence,
    ManualClock,
    QueryPlanner,
    QueryPreparation,
    RecallAllowance,
    WorkingState,
)
from plugin.control import SqliteLedger
from plugin.control.ledger import PENDING
from plugin.errors import LedgerError, MemoryStoreError
from plugin.memory import MemoryStore
from runtime_hooks import RecallHooks, ToolCall, ToolResult
from runtime_hooks.adapters.batch import RunRecalls
from runtime_hooks.adapters.invocation import Invocation
from runtime_hooks.mcp import Caller, RecallServer
from runtime_hooks.mcp.identity import ledger_run_id
from runtime_hooks.mcp.session import ToolRequest

from ._checkpoints import (
    CANCELLED,
    FAULTS,
    Checkpoints,
    CountingConnection,
    CountingLedger,
    CountingRetriever,
    SteppingClock,
    run_cut,
    sweep,
)
from ._fakes import MemoryLedger

pytestmark = pytest.mark.anyio

P, S = "u1", "proj"
WALL = 1_800_000_000.0
POLICY = AllowancePolicy()
MEMORIES = {
    f"m{i}": Evidence(id=f"m{i}", text=f"cutover note {i}", principal=P, scope=S) for i in range(3)
}
QUERIES = ("cutover date", "deploy window", "rollback runbook")
STATUSES = {"ok", "refused", "failed", "in_flight"}


def _clock() -> SteppingClock:
    return SteppingClock(ManualClock(wall=WALL, monotonic=100.0))


def _calls(n: int) -> list[ToolCall]:
    return [ToolCall(call_id=f"c{i}", arguments={"query": QUERIES[i]}) for i in range(n)]


class Env:
    """Hooks over a counting in-memory ledger and a counting retriever, on ``points``."""

    def __init__(self, points: Checkpoints, ledger: Any = None) -> None:
        self.points = points
        self.ledger = MemoryLedger() if ledger is None else ledger
        self.retriever = CountingRetriever(MEMORIES, points)
        allowance = RecallAllowance(
            CountingLedger(self.ledger, points),  # type: ignore[arg-type]
            policy=POLICY,
            clock=points.clock,
        )
        self.hooks = RecallHooks(
            allowance=allowance,
            preparer=QueryPreparation(QueryPlanner()),
            retriever=self.retriever.retriever,
        )

    async def check(self, run_id: str, cut: object) -> None:
        """The run's bounds hold and ``cut`` is an outcome a user can act on. What the
        allowance still owes the ledger (a record the ledger failed) is written first."""
        if isinstance(cut, BaseException):
            assert self.points.fault == "raise" and isinstance(cut, LedgerError), (
                self.points.fired,
                repr(cut),
            )
        await self.hooks.allowance.flush()
        usage = await self.ledger.usage(run_id)
        assert len(self.retriever.searched) <= POLICY.max_searches
        assert usage.rounds <= POLICY.max_rounds
        assert usage.executed <= usage.reserved <= POLICY.max_searches
        assert len(self.retriever.searched) <= usage.executed, (self.points.fired, usage)
        assert usage.deadline_wall in (None, WALL + POLICY.deadline_s), self.points.fired

    async def outcomes(self, run_id: str, calls: Sequence[ToolCall]) -> dict[str, str]:
        """The recorded outcome (status) of each call that has one."""
        records = await self.ledger.recorded_calls(run_id, [c.call_id for c in calls])
        return {r.call_id: r.status for r in records if r.status != PENDING}

    async def retry(
        self, run_id: str, calls: Sequence[ToolCall], recorded: dict[str, str]
    ) -> list[ToolResult]:
        """Dispatch ``calls`` again (no fault): a recorded call is answered as recorded, and
        never searched again."""
        before = len(self.retriever.searched)
        again = await run_cut(
            self.points,
            lambda: self.hooks.dispatch(list(calls), run_id=run_id, scope=S, principal=P),
        )
        assert isinstance(again, list), (self.points.fired, repr(again))
        searched = self.retriever.searched[before:]
        for call, result in zip(calls, again, strict=True):
            assert result.status in STATUSES
            if call.call_id in recorded:
                assert result.status == recorded[call.call_id], (self.points.fired, result)
                assert not any(QUERIES[int(call.call_id[1:])] in text for text in searched), (
                    self.points.fired,
                    call.call_id,
                )
        return again


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("n", [1, 3])
async def test_a_dispatch_cut_at_any_checkpoint(fault: str, n: int) -> None:
    async def attempt(points: Checkpoints) -> None:
        env, calls = Env(points), _calls(n)
        cut = await run_cut(
            points, lambda: env.hooks.dispatch(calls, run_id="r", scope=S, principal=P)
        )
        if isinstance(cut, list):
            assert [r.status in STATUSES for r in cut] == [True] * n
        await env.check("r", cut)
        await env.retry("r", calls, await env.outcomes("r", calls))
        await env.check("r", None)

    assert await sweep(fault, attempt, _clock) > 0


@pytest.mark.parametrize("fault", ["cancel", "raise"])
async def test_a_dispatch_over_sqlite_cut_at_any_checkpoint(tmp_path: Path, fault: str) -> None:
    """The same over the real SQLite ledger (its worker threads, its shielded commits), whose
    own connection checkpoints too: faults inside its methods. (The clock faults are the
    same as on the in-memory ledger; the machine's disk makes each one slow.)"""

    async def attempt(points: Checkpoints) -> None:
        async with SqliteLedger(tmp_path / f"ledger-{points.at}.db") as ledger:
            # A failure the ledger can get past (its records stay owed, not dropped).
            ledger._conn = CountingConnection(ledger._conn, points, "database is locked")
            env, calls = Env(points, ledger), _calls(3)
            cut = await run_cut(
                points, lambda: env.hooks.dispatch(calls, run_id="r", scope=S, principal=P)
            )
            await env.check("r", cut)
            await env.retry("r", calls, await env.outcomes("r", calls))
            await env.check("r", None)

    assert await sweep(fault, attempt, _clock) > 0


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_replay_cut_at_any_checkpoint(fault: str) -> None:
    async def attempt(points: Checkpoints) -> None:
        points.armed = False
        first, calls = Env(points), _calls(2)
        ran = await first.hooks.dispatch(calls, run_id="r", scope=S, principal=P)
        recorded = await first.outcomes("r", calls)
        assert set(recorded) == {"c0", "c1"}
        points.armed = True
        env = Env(points, first.ledger)  # another process over the same ledger
        cut = await run_cut(
            points, lambda: env.hooks.replay(calls, run_id="r", scope=S, principal=P)
        )
        if isinstance(cut, list):
            assert [r.status if r else None for r in cut] == [r.status for r in ran]
        await env.check("r", cut)
        await env.retry("r", calls, recorded)
        assert env.retriever.searched == []
        await env.check("r", None)

    assert await sweep(fault, attempt, _clock) > 0


@pytest.mark.parametrize("fault", FAULTS)
async def test_the_automatic_round_cut_at_any_checkpoint(fault: str) -> None:
    state = WorkingState(
        current_request="Continue",
        objective="ship the cutover",
        open_questions=("when is the deploy window?",),
    )

    async def attempt(points: Checkpoints) -> None:
        env = Env(points)

        async def prepare() -> Any:
            return await env.hooks.prepare(state, run_id="r", scope=S, principal=P)

        cut = await run_cut(points, prepare)
        await env.check("r", cut)
        again = await run_cut(points, prepare)
        assert not isinstance(again, BaseException) and again != CANCELLED, repr(again)
        await env.check("r", None)
        calls = _calls(3)  # the deliberate round still fits the run's bounds
        await env.retry("r", calls, await env.outcomes("r", calls))
        await env.check("r", None)

    assert await sweep(fault, attempt, _clock) > 0


@pytest.mark.parametrize("fault", FAULTS)
async def test_an_invocations_automatic_round_cut_at_any_checkpoint(fault: str) -> None:
    """The adapters' path: the invocation prepares once; a retry of the invocation and the
    model's batch after it stay within the run's bounds."""
    state = WorkingState(current_request="Continue", objective="ship the cutover")

    async def attempt(points: Checkpoints) -> None:
        env = Env(points)
        run = RunRecalls(env.hooks).get("r", scope=S, principal=P)
        invocation = Invocation()

        async def context() -> str:
            return (await run.prepare(state)).rendered

        cut = await run_cut(points, lambda: invocation.context(context))
        await env.check("r", cut)
        again = await run_cut(points, lambda: invocation.context(context))
        assert isinstance(again, str), repr(again)
        assert invocation.prepared
        calls = _calls(3)
        batch = await run_cut(points, lambda: run.dispatch_batch(calls))
        assert isinstance(batch, list) and {r.status for r in batch} <= STATUSES, repr(batch)
        await env.check("r", None)

    assert await sweep(fault, attempt, _clock) > 0


ANA = Caller(principal=P, scope=S)


@pytest.mark.parametrize("fault", FAULTS)
async def test_an_mcp_search_cut_at_any_checkpoint(fault: str) -> None:
    run_id = ledger_run_id("r", principal=P, scope=S)

    async def attempt(points: Checkpoints) -> None:
        env = Env(points)
        server = RecallServer(env.hooks, caller=ANA, window_s=0.001)
        meta = {"recallbound/run_id": "r", "recallbound/call_id": "c0"}
        async with server._lifespan(server.server) as session:
            request = ToolRequest(
                name="search_memory", arguments={"query": QUERIES[0]}, meta=meta, session=session
            )
            cut = await run_cut(points, lambda: server.call_tool(request))
            # The batch window may still run the cut call's round: the retry waits for it.
            again = await run_cut(points, lambda: server.call_tool(request))
        assert cut == CANCELLED or not isinstance(cut, BaseException), repr(cut)
        assert not isinstance(again, (BaseException, str)), repr(again)
        assert len(env.retriever.searched) <= 1, points.fired  # one call id, one search
        await env.check(run_id, None)

    assert await sweep(fault, attempt, _clock) > 0


OLD, NEW = "Ana owns the schema review.", "Bruno took over the billing migration."


async def _seeded(path: Path, points: Checkpoints, seed: bool) -> MemoryStore:
    store = MemoryStore(path, clock=points.clock)
    await store.__aenter__()
    if seed:
        await store.remember(OLD, principal=P, scope=S, id="n1")
    db = store._db
    db._conn = CountingConnection(db.connection(), points)  # type: ignore[assignment]
    return store


async def _state(store: MemoryStore) -> str | None:
    """n1's text, once the listing and the full-text arm agree on it (no half write)."""
    texts = [
        m.text for m in [m async for m in store.memories(principal=P, scope=S)] if m.id == "n1"
    ]
    text = texts[0] if texts else None
    for words, this in (("schema review", OLD), ("billing migration", NEW)):
        found = [e.id for e in await store.sparse_candidates(words, principal=P, scope=S, limit=5)]
        assert ("n1" in found) == (text == this), (words, text, found)
    return text


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("write", ["remember", "update", "forget"])
async def test_a_memory_write_cut_at_any_checkpoint(tmp_path: Path, fault: str, write: str) -> None:
    async def attempt(points: Checkpoints) -> None:
        points.armed = False
        store = await _seeded(tmp_path / f"store-{points.at}.db", points, write != "remember")
        try:
            points.armed = True

            async def operation() -> object:
                if write == "forget":
                    return await store.forget("n1", principal=P, scope=S)
                return await store.remember(NEW, principal=P, scope=S, id="n1")

            cut = await run_cut(points, operation)
            if isinstance(cut, BaseException):
                assert fault == "raise" and isinstance(cut, MemoryStoreError), repr(cut)
            before = OLD if write != "remember" else None
            after = None if write == "forget" else NEW
            assert await _state(store) in (before, after)
            again = await run_cut(points, operation)
            assert again in ("n1", True, False), repr(again)
            assert await _state(store) == after
        finally:
            await store.aclose()

    assert await sweep(fault, attempt, _clock) > 0
