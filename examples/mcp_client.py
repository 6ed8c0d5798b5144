"""Launch ``recallbound mcp`` over stdio, as an MCP client would, and call it offline.

It seeds a memory store in a temporary folder, starts the server as a subprocess (the
``mcp`` extra), asks ``recall_context`` for context (the automatic round: two of the run's
four slots), then sends six parallel ``search_memory`` calls of the same run: two get
evidence, four the typed refusal, and so does a search sent after them (the run's rounds are
spent). Which reason a call of the burst is refused for (no slot left in the shared round, or
no round left once that round closed full) depends on when the server read it, so the burst
shows only the status; the later search shows what the model reads.

    python examples/mcp_client.py            # server and client on asyncio
    python examples/mcp_client.py trio       # the server runs under trio
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from runtime_hooks.bootstrap import RecallConfig
from runtime_hooks.demo import seed_store

QUERIES = ("invoice backfill dry-run", "currency rounding rule", "rollback runbook",
           "billing migration kickoff", "cutover date", "deploy window")


async def main(backend: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        ledger, store = Path(folder, "ledger.db"), Path(folder, "store.db")
        await seed_store(RecallConfig(ledger_path=ledger, store_path=store))
        server = StdioServerParameters(
            command=sys.executable,
            args=["-m", "runtime_hooks", "mcp", "--principal", "ana", "--scope", "atlas",
                  "--backend", backend, "--window-ms", "50"],
            env={**os.environ, "RECALLBOUND_LEDGER": str(ledger),
                 "RECALLBOUND_STORE": str(store)},
        )
        meta = {"recallbound/run_id": f"example-{uuid.uuid4()}"}  # a fresh run each time
        async with Client(server) as client:
            tools = [tool.name for tool in (await client.list_tools()).tools]
            print(f"server tools: {tools}")
            context = await client.call_tool(
                "recall_context",
                {"current_request": "How do I run the invoice backfill dry-run?",
                 "next_action": "Run the invoice backfill dry-run"},
                meta=meta,
            )
            print("\nrecall_context (the automatic round, 2 slots):")
            print(_indent(context.content[0].text))  # type: ignore[union-attr]

            results: dict[str, Any] = {}

            async def one(query: str) -> None:
                answer = await client.call_tool("search_memory", {"query": query}, meta=meta)
                results[query] = answer.structured_content

            async with anyio.create_task_group() as tg:
                for query in QUERIES:
                    tg.start_soon(one, query)
            later = await client.call_tool("search_memory", {"query": "anything else"},
                                           meta=meta)
        print("\nsix parallel search_memory calls (2 slots left):")
        for query in QUERIES:
            found = results[query]
            shown = f"evidence {found['evidence_ids']}" if found["status"] == "ok" else "refused"
            print(f"- {query!r}: {shown}")
        refusal = later.structured_content
        assert refusal is not None
        print(f"\na search after them: {refusal['status']} ({refusal['refusal']['reason']}); "
              f"what the model reads:")
        print(_indent(refusal["content"]))


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "asyncio")
