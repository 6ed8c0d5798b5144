"""What the pydantic-ai invocation tests share: two users, each with a private note."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from plugin import Clock, Evidence, SimpleRetriever
from runtime_hooks import RecallHooks
from runtime_hooks.adapters.pydantic_ai import RunIdentity
from runtime_hooks.bootstrap import RecallConfig, open_hooks

ANA = RunIdentity(run_id="run-ana", scope="atlas", principal="ana")
BOB = RunIdentity(run_id="run-bob", scope="atlas", principal="bob")


async def _search(request: Any) -> list[Evidence]:
    """Each principal's own memory, named after its owner."""
    return [Evidence(id=f"{request.principal}-1", text=f"{request.principal}'s private note")]


@contextlib.asynccontextmanager
async def private_note_hooks(tmp_path: Path, clock: Clock) -> AsyncIterator[RecallHooks]:
    """Hooks over a SQLite ledger whose retriever finds each principal's own note."""
    config = RecallConfig(ledger_path=tmp_path / "ledger.db")
    async with open_hooks(config, clock=clock, retriever=SimpleRetriever(_search)) as hooks:
        yield hooks
