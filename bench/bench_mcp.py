"""What the MCP server adds to one ``search_memory`` call: in memory and over stdio.

Each figure is the median round trip of one deliberate search in a fresh run (one round, one
slot, a durable reservation), through the MCP server, beside the same search made through the
hooks directly (``RecallHooks.dispatch``), timed alternately in the same run, 300 times each
(the difference of two medians of a few milliseconds that an fsync spreads: fewer rounds leave
it a tenth of a millisecond either way from one run to the next). The in-memory
transport is the SDK's in-process client; stdio is ``recallbound mcp`` in a subprocess on the
same store and a ledger file of its own. Every call opens a run, so both servers allow more
runs an hour than a bench makes. Both servers run with the batch window off (``window_ms =
0``): a lone call waits the window for companions before its round opens (20 ms by default),
which is a chosen wait, not the server's work. Targets at the median: the in-memory transport
adds at most 0.5 ms, stdio at most 1 ms.

    python -m bench mcp
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from itertools import count
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from bench.bench_hooks import _median_pair
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, seed_store
from runtime_hooks.hooks import ToolCall
from runtime_hooks.mcp import RecallServer
from runtime_hooks.mcp.trust import Caller

QUERY = "invoice backfill dry-run"
ROUNDS = 300
RUNS_PER_HOUR = 1_000_000


def _report(name: str, mcp_us: float, direct_us: float) -> None:
    print(f"   {name:<10} mcp {mcp_us:8.0f} us   hooks {direct_us:8.0f} us   "
          f"ratio {mcp_us / direct_us:5.2f}x   adds {(mcp_us - direct_us) / 1000:6.2f} ms")


async def main() -> None:
    runs = count()
    with tempfile.TemporaryDirectory() as folder:
        ledger, store = Path(folder, "ledger.db"), Path(folder, "store.db")
        config = RecallConfig(ledger_path=ledger, store_path=store)
        await seed_store(config)
        async with open_hooks(config) as hooks:
            server = RecallServer(hooks, caller=Caller(principal=PRINCIPAL, scope=SCOPE),
                                  max_runs_per_hour=RUNS_PER_HOUR, window_s=0.0)

            async def direct() -> None:
                [result] = await hooks.dispatch(
                    [ToolCall(call_id="c0", arguments={"query": QUERY})],
                    run_id=f"direct-{next(runs)}", scope=SCOPE, principal=PRINCIPAL,
                )
                assert result.status == "ok"

            def through(client: Client) -> Callable[[], Awaitable[None]]:
                async def call() -> None:
                    result = await client.call_tool(
                        "search_memory", {"query": QUERY},
                        meta={"recallbound/run_id": f"mcp-{next(runs)}"},
                    )
                    assert result.structured_content is not None
                    assert result.structured_content["status"] == "ok"
                return call

            print(f"   one search_memory call in a fresh run, median of {ROUNDS}, alternating")
            async with Client(server.server) as client:
                _report("in-memory", *await _median_pair(through(client), direct, ROUNDS))
            settings = Path(folder, "recallbound.toml")
            settings.write_text(f"allow_looser_policy = true\n\n[mcp]\n"
                                f"max_runs_per_hour = {RUNS_PER_HOUR}\n")
            stdio = StdioServerParameters(
                command=sys.executable,
                args=["-m", "runtime_hooks", "mcp", "--principal", PRINCIPAL, "--scope", SCOPE,
                      "--window-ms", "0"],
                # its own ledger file: two processes on one SQLite file slow both sides
                env={**os.environ, "RECALLBOUND_LEDGER": str(Path(folder, "stdio-ledger.db")),
                     "RECALLBOUND_STORE": str(store), "RECALLBOUND_CONFIG": str(settings)},
            )
            async with Client(stdio) as client:
                _report("stdio", *await _median_pair(through(client), direct, ROUNDS))


if __name__ == "__main__":
    anyio.run(main)
