"""The bootstrap on a PostgreSQL ledger: ``open_hooks(RecallConfig(ledger_path="postgresql://…"))``.

A turn runs end to end (prepare, then dispatch) with the ledger in a schema of its own on the
test server (tests/_pg.py; dropped afterwards; no skip) and the reference store in a temporary
SQLite file, on asyncio and trio. The ledger is judged by the server's clock, as a fleet's is;
the hooks' own clock is a ManualClock (never advanced: no deadline passes by it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plugin import PostgresLedger
from plugin.control import ManualClock
from plugin.control.postgres_admin import PostgresAdmin
from plugin.errors import LedgerUnavailableError
from plugin.memory.pipeline import MemoryRetriever
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed
from runtime_hooks.hooks import ToolCall

from . import _pg

pytestmark = pytest.mark.anyio


@pytest.fixture
def schema() -> Iterator[str]:
    with _pg.fresh_schema("boot") as name:
        yield name



def _calls(*queries: str) -> list[ToolCall]:
    return [ToolCall(call_id=f"c{i}", arguments={"query": q}) for i, q in enumerate(queries)]


async def test_a_turn_runs_end_to_end_on_a_postgres_ledger(
    schema: str, tmp_path: Path, clock: ManualClock
) -> None:
    config = RecallConfig(ledger_path=f"{_pg.DSN}?schema={schema}",
                          store_path=tmp_path / "memory.db")
    async with open_hooks(config, clock=clock) as hooks:
        ledger = hooks.allowance.ledger
        assert isinstance(ledger, PostgresLedger) and ledger.schema == schema
        assert ledger.time_source == "server"
        assert isinstance(hooks.retriever, MemoryRetriever)
        await seed(hooks.retriever.store)
        with hooks.bind_run():
            context = await hooks.prepare(STATE, run_id="turn", scope=SCOPE,
                                          principal=PRINCIPAL)
            assert context.slots and context.evidence  # the automatic round searched
            results = await hooks.dispatch(
                _calls("invoice backfill", "rounding rule", "cutover date", "deploy window"),
                run_id="turn", scope=SCOPE, principal=PRINCIPAL)
        statuses = [r.status for r in results]
        ok_slots = sorted(r.slot for r in results if r.status == "ok" and r.slot is not None)
        # 4 searches per run: the automatic round took len(context.slots) reserved slots of its
        # 2; the deliberate round gets the 2 left, and the other calls are refused.
        assert ok_slots == [3, 4] and statuses.count("refused") == 2
        usage = await ledger.usage("turn")
        assert (usage.rounds, usage.reserved, usage.refused) == (2, 4, 2)
        assert usage.executed == len(context.slots) + 2
        summary = await ledger.admin().run("turn")
        assert summary is not None and (summary.rounds, summary.reserved) == (2, 4)
    # What the turn committed is on the server, for any other worker or operator.
    async with PostgresLedger(_pg.DSN, schema=schema, create=False) as again:
        assert (await again.usage("turn")).reserved == 4
        assert isinstance(again.admin(), PostgresAdmin)
        assert (await again.admin().check()).ok
    assert (tmp_path / "memory.db").exists()


async def test_the_configuration_names_a_postgres_ledger(
    schema: str, tmp_path: Path, clock: ManualClock
) -> None:
    (tmp_path / "recallbound.toml").write_text('ledger = "unused.db"\nstore = "memory.db"\n')
    env = {"RECALLBOUND_LEDGER": f"{_pg.DSN}?schema={schema}"}
    config = RecallConfig.from_sources(tmp_path / "recallbound.toml", env=env)
    async with open_hooks(config, clock=clock) as hooks:
        assert isinstance(hooks.allowance.ledger, PostgresLedger)
        results = await hooks.dispatch(_calls("deploy window"), run_id="r", scope=SCOPE,
                                       principal=PRINCIPAL)
        assert [r.status for r in results] == ["ok"]
    assert not (tmp_path / "unused.db").exists()


async def test_an_unreachable_ledger_fails_the_bootstrap_closed(
    tmp_path: Path, clock: ManualClock
) -> None:
    config = RecallConfig(ledger_path="postgresql://u:s3cr3t@127.0.0.1:1/test?schema=x",
                          store_path=tmp_path / "memory.db")
    with pytest.raises(LedgerUnavailableError) as caught:
        async with open_hooks(config, clock=clock):
            pytest.fail("no hooks without a ledger")  # pragma: no cover
    assert "s3cr3t" not in str(caught.value) and "\n" not in str(caught.value)
