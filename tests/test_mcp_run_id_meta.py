"""A run id a client sends in ``_meta["recallbound/run_id"]`` that is no run id (empty, blank,
with a NUL, past 512 UTF-8 bytes, a lone surrogate, not a string) is an invalid call that names
the ``_meta`` key it came from (the tools have no ``run_id`` argument), never echoes the id
whole, binds and opens nothing (the caller's runs per hour are untouched), and the server keeps
serving. In process (the SDK's in-memory client), on asyncio and trio."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
from mcp import Client

from runtime_hooks.mcp import RecallServer

from ._mcp_env import ANA, ledger_id, recall_server, search, structured

pytestmark = pytest.mark.anyio

KEY = "_meta['recallbound/run_id']"


def _rows(folder: Path) -> tuple[int, int]:
    with contextlib.closing(sqlite3.connect(folder / "ledger.db")) as conn:
        return (int(conn.execute("SELECT count(*) FROM run_identity").fetchone()[0]),
                int(conn.execute("SELECT count(*) FROM run_opens").fetchone()[0]))


@pytest.mark.parametrize("run_id", [
    "", "   ", "run\x00id", "r" * 513, "é" * 257, "\ud800", 7, 1.5, True, ["run"], {"id": "r"},
], ids=["empty", "blank", "nul", "513-bytes", "514-bytes-of-two", "surrogate", "int", "float",
        "bool", "list", "object"])
async def test_a_bad_run_id_names_its_meta_key_and_writes_nothing(
    tmp_path: Path, run_id: object
) -> None:
    async with recall_server(tmp_path) as plain:
        server = RecallServer(plain.hooks, caller=ANA, max_runs_per_hour=1)
        async with Client(server.server) as client:
            before = _rows(tmp_path)
            for tool, arguments in (("search_memory", {"query": "cutover date"}),
                                    ("recall_context", {"current_request": "cutover date"})):
                result = await client.call_tool(tool, arguments,
                                                meta={"recallbound/run_id": run_id})
                answer = structured(result)
                assert result.is_error and answer["status"] == "invalid", answer
                assert KEY in answer["content"], answer["content"]
                assert len(answer["content"]) < 400  # the id is not echoed back whole
            assert _rows(tmp_path) == before
            # nothing was counted: the caller's one run this hour is still to open
            assert (await search(client, "cutover date", run_id="good"))["status"] == "ok"


async def test_a_run_id_of_exactly_512_bytes_is_a_run(tmp_path: Path) -> None:
    longest = "é" * 256  # 512 UTF-8 bytes
    async with recall_server(tmp_path) as server, Client(server.server) as client:
        assert (await search(client, "cutover date", run_id=longest))["status"] == "ok"
        assert (await search(client, "deploy window", run_id=longest))["status"] == "ok"
        third = await search(client, "rollback runbook", run_id=longest)
        assert third["refusal"]["reason"] == "rounds"  # one run: its two rounds are used
        usage = await server.hooks.allowance.ledger.usage(ledger_id(longest))
        assert (usage.rounds, usage.reserved) == (2, 2)
