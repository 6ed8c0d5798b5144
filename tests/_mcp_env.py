"""Helpers shared by the MCP server's test modules: a seeded server and call helpers."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp import Client

from plugin import AllowancePolicy, Clock
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, seed
from runtime_hooks.mcp import Caller, RecallServer
from runtime_hooks.mcp.identity import ledger_run_id

from ._hooks_env import store_of

ANA = Caller(principal=PRINCIPAL, scope=SCOPE)
QUERIES = (
    "invoice backfill dry-run", "currency rounding rule", "rollback runbook",
    "billing migration kickoff", "cutover date", "deploy window",
)


def config(folder: Path, **policy: Any) -> RecallConfig:
    return RecallConfig(ledger_path=folder / "ledger.db", store_path=folder / "store.db",
                        policy=AllowancePolicy(**policy))


@asynccontextmanager
async def recall_server(
    folder: Path, *, clock: Clock | None = None, seeded: bool = True, window_s: float = 0.005,
    caller: Caller | None = ANA, **policy: Any,
) -> AsyncIterator[RecallServer]:
    """A server over a ledger and a store in ``folder`` (seeded with the demo's memories)."""
    fresh = not (folder / "store.db").exists()
    async with open_hooks(config(folder, **policy), clock=clock) as hooks:
        if seeded and fresh:
            await seed(store_of(hooks))
        yield RecallServer(hooks, caller=caller, window_s=window_s)


@asynccontextmanager
async def server_process(folder: Path, backend: str) -> AsyncIterator[Process]:
    """``recallbound mcp`` on stdio, in a process of its own on ``backend``, over a ledger and
    the seeded store in ``folder``; its input is closed and it is waited for on the way out."""
    async with recall_server(folder):
        pass  # seeded
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLBOUND_")}
    env.update(RECALLBOUND_LEDGER=str(folder / "ledger.db"),
               RECALLBOUND_STORE=str(folder / "store.db"))
    process = await anyio.open_process(
        [sys.executable, "-m", "runtime_hooks", "mcp", "--principal", ANA.principal,
         "--scope", ANA.scope, "--backend", backend], env=env, cwd=str(folder))
    try:
        yield process
    finally:
        if process.stdin is not None:
            await process.stdin.aclose()
        with anyio.fail_after(30):
            await process.wait()
        await process.aclose()


def ledger_id(run_id: str, caller: Caller = ANA) -> str:
    """The ledger's id of the run ``caller`` names ``run_id``."""
    return ledger_run_id(run_id, principal=caller.principal, scope=caller.scope)


def structured(result: types.CallToolResult) -> Mapping[str, Any]:
    assert result.structured_content is not None
    return result.structured_content


async def search(
    client: Client, query: object, *, run_id: str | None = None, **extra: object
) -> Mapping[str, Any]:
    meta = {"recallbound/run_id": run_id} if run_id is not None else None
    result = await client.call_tool("search_memory", {"query": query, **extra}, meta=meta)
    return structured(result)
