"""Exactly-once MCP tool calls, in process (the SDK's in-memory client) on asyncio and trio,
over SQLite and PostgreSQL ledgers.

A client names a call with ``_meta["recallbound/call_id"]``: re-sending that call (same run,
same call id, same arguments), after a reconnect or to another server process over the same
ledger, answers with the recorded outcome and never searches or reserves again. A call that the
server will not run (bad arguments, a bad call id) writes nothing durable: no run is bound or
opened, and it does not count against the caller's runs per hour.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from plugin import (
    ManualClock,
)
from plugin.control import PostgresLedger, SqliteLedger
from runtime_hooks.mcp import Caller, RecallServer
from runtime_hooks.mcp.identity import ledger_run_id

from ._calls_env import WALL, Counting, P, S, recall_hooks
from ._mcp_env import structured
from ._pg import DSN, connect, fresh_schema

pytestmark = pytest.mark.anyio

CALLER = Caller(principal=P, scope=S)
RUN_ID_META_KEY = "recallbound/run_id"
CALL_ID_META_KEY = "recallbound/call_id"
@pytest.fixture(params=["sqlite", "postgres"])
def ledger_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def where(ledger_kind: str, tmp_path: Path) -> Iterator[str]:
    """The ledger's location: a SQLite file, or a fresh PostgreSQL schema."""
    if ledger_kind == "sqlite":
        yield str(tmp_path / "ledger.sqlite3")
    else:
        with fresh_schema("mcpcalls") as schema:
            yield schema


@pytest.fixture
def opener(ledger_kind: str, where: str) -> Callable[[], Any]:
    """Unopened ledgers over one store: each one is what another server process would open."""
    if ledger_kind == "sqlite":
        return lambda: SqliteLedger(Path(where))
    return lambda: PostgresLedger(DSN, schema=where, time_source="caller")


@contextlib.asynccontextmanager
async def _server(opener: Callable[[], Any], retriever: Counting, *, wall: float = WALL,
                  **kw: Any) -> AsyncIterator[RecallServer]:
    clock = ManualClock(wall=wall, monotonic=1.0)
    async with opener() as ledger:
        yield RecallServer(recall_hooks(ledger, clock, retriever), caller=CALLER, **kw)


async def _search(client: Client, arguments: Any, *, run_id: str,
                  call_id: object = None) -> Mapping[str, Any]:
    meta: dict[str, Any] = {RUN_ID_META_KEY: run_id}
    if call_id is not None:
        meta[CALL_ID_META_KEY] = call_id
    return structured(await client.call_tool("search_memory", arguments, meta=meta))


async def _reserved(server: RecallServer, run_id: str) -> tuple[int, int, int]:
    usage = await server.hooks.allowance.ledger.usage(
        ledger_run_id(run_id, principal=P, scope=S))
    return usage.rounds, usage.reserved, usage.executed


async def test_a_resent_call_answers_from_the_ledger_in_another_server(
    opener: Callable[[], Any],
) -> None:
    first = Counting()
    async with _server(opener, first) as server, Client(server.server) as client:
        ran = await _search(client, {"query": "cutover"}, run_id="r1", call_id="c1")
        assert ran["status"] == "ok" and ran["evidence_ids"] == ["m0", "m1", "m2"]
        before = await _reserved(server, "r1")
    assert first.searches == 1 and before[1:] == (1, 1)
    again = Counting()  # a fresh server process over the same ledger: a reconnect
    async with _server(opener, again) as server, Client(server.server) as client:
        replayed = await _search(client, {"query": "cutover"}, run_id="r1", call_id="c1")
        assert replayed["status"] == "ok"
        assert replayed["evidence_ids"] == ran["evidence_ids"]
        assert await _reserved(server, "r1") == before
        assert again.searches == 0
        # The same call id with other arguments is another call: it searches.
        other = await _search(client, {"query": "deploy window"}, run_id="r1", call_id="c1")
        assert other["status"] == "ok" and again.searches == 1
        assert (await _reserved(server, "r1"))[1:] == (2, 2)


async def test_a_call_resent_to_a_run_opened_hours_ago_is_answered_and_opens_no_run(
    opener: Callable[[], Any],
) -> None:
    """A run opened more than an hour ago is no new run: a re-sent call of it answers from
    the record though the caller opened all its runs for this hour, and a re-send while
    there is room takes none of it."""
    async with _server(opener, Counting(), max_runs_per_hour=2) as server, \
            Client(server.server) as client:
        ran = await _search(client, {"query": "cutover"}, run_id="old", call_id="c1")
        assert ran["status"] == "ok"
    later = WALL + 2 * 3600.0
    retriever = Counting()
    async with _server(opener, retriever, wall=later, max_runs_per_hour=2) as server, \
            Client(server.server) as client:
        assert (await _search(client, {"query": "cutover"}, run_id="new-1"))["status"] == "ok"
        replayed = await _search(client, {"query": "cutover"}, run_id="old", call_id="c1")
        assert replayed == ran
        # the re-send took none of the hour's runs: the second new run still opens
        assert (await _search(client, {"query": "cutover"}, run_id="new-2"))["status"] == "ok"
        capped = await _search(client, {"query": "cutover"}, run_id="new-3")
        assert capped["refusal"]["reason"] == "run_rate"
    async with _server(opener, retriever, wall=later + 1, max_runs_per_hour=2) as server, \
            Client(server.server) as client:  # no room left, in a server that never saw it
        replayed = await _search(client, {"query": "cutover"}, run_id="old", call_id="c1")
        assert replayed == ran
    assert retriever.searches == 2


async def test_without_a_call_id_each_request_is_a_new_call(
    opener: Callable[[], Any],
) -> None:
    retriever = Counting()
    async with _server(opener, retriever) as server, Client(server.server) as client:
        for _ in range(2):
            found = await _search(client, {"query": "cutover"}, run_id="r2")
            assert found["status"] == "ok"
        assert retriever.searches == 2 and (await _reserved(server, "r2"))[1] == 2


@pytest.mark.parametrize("call_id", ["", "   ", 5, "a\nb", "x" * 300, ["c1"]])
async def test_a_bad_call_id_is_an_invalid_call(
    opener: Callable[[], Any], where: str, ledger_kind: str, call_id: object,
) -> None:
    retriever = Counting()
    async with _server(opener, retriever) as server, Client(server.server) as client:
        result = await client.call_tool(
            "search_memory", {"query": "cutover"},
            meta={RUN_ID_META_KEY: "r3", CALL_ID_META_KEY: call_id})
        assert result.is_error and structured(result)["status"] == "invalid"
        assert CALL_ID_META_KEY in structured(result)["content"]
    assert retriever.searches == 0
    assert _rows(ledger_kind, where) == 0


def _rows(ledger_kind: str, where: str) -> int:
    """Every row of every table of the ledger (its whole durable footprint; PostgreSQL's
    one-row schema version table aside)."""
    if ledger_kind == "sqlite":
        with contextlib.closing(sqlite3.connect(where)) as conn:
            tables = [name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%'")]
            assert tables
            return sum(int(conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0])
                       for name in tables)
    with connect() as conn:
        tables = [name for (name,) in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "AND table_name <> 'recallbound_meta'", (where,)).fetchall()]
        assert tables
        total = 0
        for name in tables:
            row = conn.execute(f'SELECT count(*) FROM "{where}"."{name}"').fetchone()
            assert row is not None
            total += int(row[0])
        return total


INVALID_SEARCHES: list[Any] = [
    {"query": ""}, {"query": "   "}, {"query": 5}, {"query": None}, {},
    {"query": "cutover", "extra": 1}, {"query": "x " * 3000},
    {"query": "cutover", "scope": "other"},
]
INVALID_STATES: list[Any] = [{}, {"current_request": 5}, {"current_request": "x", "bogus": 1},
                             {"current_request": "x" * (70 * 1024)}]


async def test_invalid_calls_with_fresh_run_ids_write_nothing_and_open_no_run(
    opener: Callable[[], Any], where: str, ledger_kind: str,
) -> None:
    retriever = Counting()
    async with _server(opener, retriever, max_runs_per_hour=2) as server, \
            Client(server.server) as client:
        runs = 0
        for rounds in range(2):
            for arguments in INVALID_SEARCHES:
                runs += 1
                found = await _search(client, arguments, run_id=f"bad-{runs}",
                                      call_id=f"c{rounds}")
                assert found["status"] == "invalid", (arguments, found)
            for arguments in INVALID_STATES:
                runs += 1
                result = await client.call_tool("recall_context", arguments,
                                                meta={RUN_ID_META_KEY: f"bad-{runs}"})
                assert result.is_error and structured(result)["status"] == "invalid"
        assert retriever.searches == 0
        assert _rows(ledger_kind, where) == 0
        # None of them counted against the runs per hour: two new runs still open.
        for run in ("good-1", "good-2"):
            found = await _search(client, {"query": "cutover"}, run_id=run)
            assert found["status"] == "ok", found
        capped = await _search(client, {"query": "cutover"}, run_id="good-3")
        assert capped["status"] == "refused" and capped["refusal"]["reason"] == "run_rate"


async def test_the_same_call_sent_twice_at_once_searches_once(opener: Callable[[], Any]) -> None:
    retriever = Counting()
    found: list[Mapping[str, Any]] = []

    async def one() -> None:
        found.append(await _search(client, {"query": "cutover"}, run_id="r4", call_id="c1"))

    async with _server(opener, retriever, window_s=0.5) as server, \
            Client(server.server) as client:
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(one)
        assert [f["status"] for f in found] == ["ok"] * 3, found
        assert all(f["evidence_ids"] == ["m0", "m1", "m2"] for f in found)
        assert retriever.searches == 1 and (await _reserved(server, "r4"))[1:] == (1, 1)


async def test_a_call_in_a_run_the_server_just_opened_reads_nothing_before_its_reservation(
    opener: Callable[[], Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run the server has just opened has used nothing, and a call that names no call id
    has an id the server made up, which no one can send again: neither its usage nor a record
    is read, and no claim is written (its reservation decides). A named call id is claimed
    and looked up, since it may have been sent before."""
    retriever = Counting()
    async with _server(opener, retriever) as server, Client(server.server) as client:
        ledger = server.hooks.allowance.ledger
        reads: list[str] = []
        for name in ("usage", "recorded_calls"):
            real = getattr(ledger, name)

            async def counted(*args: Any, _real: Any = real, _name: str = name,
                              **kw: Any) -> Any:
                reads.append(_name)
                return await _real(*args, **kw)

            monkeypatch.setattr(ledger, name, counted)
        found = await _search(client, {"query": "cutover"}, run_id="fresh")
        assert found["status"] == "ok" and retriever.searches == 1
        assert reads == []
        named = await _search(client, {"query": "cutover"}, run_id="fresh2", call_id="c9")
        assert named["status"] == "ok" and retriever.searches == 2
        assert reads == ["recorded_calls"]
