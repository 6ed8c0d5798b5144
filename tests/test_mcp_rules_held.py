"""MCP server rules that no other test held on its own, in process (asyncio and trio)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from runtime_hooks.mcp import RecallServer
from runtime_hooks.mcp.trust import Caller

from ._mcp_env import ANA, ledger_id, recall_server, search, structured

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


async def test_a_server_without_a_caller_serves_no_one_in_process(tmp_path: Path) -> None:
    """Principal and scope come from the server's configuration on stdio and in process:
    without one, every call is refused with the auth error, and nothing is searched or
    written under a made-up identity."""
    async with recall_server(tmp_path, caller=None) as server, Client(server.server) as client:
        calls = [("search_memory", {"query": "cutover date"}),
                 ("recall_context", {"current_request": "When is the cutover?"}),
                 ("remember", {"text": "Nobody's memory."})]
        for name, arguments in calls:
            result = await client.call_tool(name, arguments)
            assert result.is_error, (name, result)
            assert structured(result)["error"] == "McpAuthError", (name, result)
