"""What the call-record tests share: three memories, a retriever that counts what it is asked,
and hooks over a given ledger on a manual clock."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from plugin import (
    AllowancePolicy,
    Evidence,
    ManualClock,
    QueryPlanner,
    QueryPreparation,
    RecallAllowance,
    SimpleRetriever,
)
from plugin.control import Ledger, PostgresLedger, SqliteLedger
from runtime_hooks import RecallHooks

P, S = "u1", "proj"
WALL = 1_800_000_000.0
MEMORIES = {f"m{i}": Evidence(id=f"m{i}", text=f"cutover note {i}", principal=P, scope=S)
            for i in range(3)}


class Counting:
    """A retriever that counts its searches and re-reads."""

    def __init__(self) -> None:
        self.searches = 0
        self.reads = 0
        self.retriever = SimpleRetriever(self.search, get=self.get)

    async def search(self, request: Any) -> list[Evidence]:
        self.searches += 1
        return list(MEMORIES.values())

    async def get(self, evidence_id: str, *, principal: str, scope: str) -> Evidence | None:
        self.reads += 1
        return MEMORIES.get(evidence_id)


def recall_hooks(ledger: Ledger, clock: ManualClock, retriever: Counting,
                 **policy: Any) -> RecallHooks:
    """Hooks over ``ledger`` with the baseline planner and ``retriever``."""
    allowance = RecallAllowance(ledger, policy=AllowancePolicy(**policy), clock=clock)
    return RecallHooks(allowance=allowance, preparer=QueryPreparation(QueryPlanner()),
                       retriever=retriever.retriever)


@contextlib.contextmanager
def ledger_openers(kind: str, folder: Path, name: str) -> Iterator[Callable[[], Any]]:
    """Unopened ledgers over one store (a SQLite file in ``folder``, or a fresh PostgreSQL
    schema named after ``name``): each one is what another process would open."""
    from ._pg import DSN, fresh_schema

    if kind == "sqlite":
        yield lambda: SqliteLedger(folder / "ledger.sqlite3")
    else:
        with fresh_schema(name) as schema:
            yield lambda: PostgresLedger(DSN, schema=schema, time_source="caller")
