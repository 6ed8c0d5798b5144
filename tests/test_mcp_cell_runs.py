"""Stateless HTTP: a caller's current run is its (principal, scope)'s, kept in the ledger, so
every server that shares the ledger (behind a load balancer) gives the caller the same run,
judged by the ledger's own clock. Two in-process servers on one ledger, on both loops; the
calls carry a bearer token's caller and no session id, as stateless HTTP requests do."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from plugin import ManualClock
from runtime_hooks.mcp import RecallServer
from runtime_hooks.mcp.identity import CurrentRun
from runtime_hooks.mcp.session import Session, ToolRequest
from runtime_hooks.mcp.trust import PRINCIPAL_CLAIM, SCOPE_CLAIM
from runtime_hooks.mcp.window import BatchWindow

from ._mcp_env import recall_server

pytestmark = pytest.mark.anyio


class _Request:
    """What the SDK hands the server for an authenticated stateless HTTP request."""

    def __init__(self, principal: str, scope: str) -> None:
        token = AccessToken(token="t", client_id="c", scopes=[],
                            claims={PRINCIPAL_CLAIM: principal, SCOPE_CLAIM: scope})
        self.scope = {"user": AuthenticatedUser(token)}
        self.headers: dict[str, str] = {}


class _Stateless:
    def __init__(self, server: RecallServer, session: Session) -> None:
        self.server, self.session = server, session

    async def search(self, query: str) -> str:
        result = await self.server.call_tool(ToolRequest(
            name="search_memory", arguments={"query": query}, meta=None,
            session=self.session, request=_Request("ana", "atlas")))
        found: dict[str, Any] = dict(result.structured_content or {})
        return str(found["refusal"]["reason"]) if found["status"] == "refused" else "ok"


@asynccontextmanager
async def _server(folder: Path, clock: ManualClock, per_hour: int) -> AsyncIterator[_Stateless]:
    async with recall_server(folder, clock=clock) as plain:
        server = RecallServer(plain.hooks, window_s=0.001, max_runs_per_hour=per_hour)
        window = BatchWindow(plain.hooks, 0.001)
        async with window.running():
            yield _Stateless(server, Session(window=window, current=CurrentRun("session")))


async def test_two_servers_give_a_caller_one_current_run_through_its_rate_cap(
    tmp_path: Path,
) -> None:
    clock = ManualClock(wall=1_700_000_000.0, monotonic=1000.0)
    async with _server(tmp_path, clock, 2) as one, _server(tmp_path, clock, 2) as two:
        for server in (one, two, one):  # one run: two rounds across both servers
            await server.search("cutover date")
        clock.advance(11)  # its deadline passes: the next call opens the next run
        assert [await s.search("deploy window") for s in (two, one, two)] == [
            "ok", "ok", "rounds"]
        clock.advance(11)
        assert [await s.search("rollback runbook") for s in (one, two)] == [
            "run_rate", "run_rate"]  # two runs this hour: the cap refuses a third
        clock.advance(3600)  # an hour later: one new run, whichever server opens it
        assert [await s.search("invoice backfill") for s in (one, two, one, two)] == [
            "ok", "ok", "rounds", "rounds"]


async def test_a_wall_clock_stepped_back_never_revives_the_callers_ended_run(
    tmp_path: Path,
) -> None:
    clock = ManualClock(wall=1_700_000_000.0, monotonic=1000.0)
    async with _server(tmp_path, clock, 60) as server:
        assert await server.search("cutover date") == "ok"  # a run, its deadline 10 s on
        clock.advance(11)
        assert await server.search("deploy window") == "ok"  # the next run
        clock.advance(11)  # it has ended too
        clock.step_wall(-5)  # an NTP step back: by the wall clock it would still be live
        assert [await server.search(q) for q in ("rollback runbook", "invoice backfill")] == [
            "ok", "ok"]  # the next run's two rounds


async def test_a_call_refused_by_the_hourly_cap_stores_nothing(tmp_path: Path) -> None:
    """A caller over its cap sends request after request: no row of theirs piles up."""
    import contextlib
    import sqlite3

    clock = ManualClock(wall=1_700_000_000.0, monotonic=1000.0)
    async with _server(tmp_path, clock, 1) as server:
        assert await server.search("cutover date") == "ok"
        clock.advance(11)

        def bindings() -> int:
            with contextlib.closing(sqlite3.connect(tmp_path / "ledger.db")) as conn:
                return int(conn.execute("SELECT count(*) FROM run_identity").fetchone()[0])

        before = bindings()
        assert [await server.search("deploy window") for _ in range(5)] == ["run_rate"] * 5
        assert bindings() == before
