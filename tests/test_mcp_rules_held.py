"""MCP server rules that no other test held on its own, in process (asyncio and trio)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from runtime_hooks.mcp import RecallServer
from runtime_hooks.mcp.trust import Caller

from ._mcp_env import ANA, ledger_id, recall_server, search

pytestmark = pytest.mark.anyio

ANA_ELSEWHERE = Caller(principal=ANA.principal, scope="personal")


async def test_a_run_id_sent_in_another_scope_names_another_run(tmp_path: Path) -> None:
    """Run ids are namespaced by the scope too: one principal's two projects never share,
    or collide on, a run named the same."""
    async with recall_server(tmp_path) as ana:
        elsewhere = RecallServer(ana.hooks, caller=ANA_ELSEWHERE)
        async with Client(ana.server) as client:
            assert (await search(client, "cutover date", run_id="run-1"))["status"] == "ok"
        async with Client(elsewhere.server) as client:
            found = await search(client, "cutover date", run_id="run-1")
            assert found["status"] == "ok", found
        assert ledger_id("run-1", ANA) != ledger_id("run-1", ANA_ELSEWHERE)
        ledger = ana.hooks.allowance.ledger
        assert (await ledger.usage(ledger_id("run-1", ANA_ELSEWHERE))).rounds == 1
        assert (await ledger.usage(ledger_id("run-1", ANA))).rounds == 1
