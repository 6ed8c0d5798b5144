"""The MCP server in process (the SDK's in-memory client), on asyncio and trio.

Every test talks to :class:`RecallServer` through ``mcp.Client`` as a real client would, and
checks what the client reads beside the ledger's counts. Queries are about the demo's seeded
memories (principal ``ana``, scope ``atlas``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import attrs
import mcp_types
import pytest
from mcp import Client

from plugin import ManualClock, SqliteLedger, errors
from plugin.memory.preparation import PreparedRecall
from runtime_hooks.mcp import RecallServer
from runtime_hooks.mcp.trust import Caller

from ._mcp_env import ANA, QUERIES, ledger_id, recall_server, search, structured

pytestmark = pytest.mark.anyio

BO = Caller(principal="bo", scope="atlas")


async def parallel(client: Client, queries: tuple[str, ...], **kw: Any) -> list[Mapping[str, Any]]:
    results: list[Mapping[str, Any]] = [{} for _ in queries]

    async def one(index: int) -> None:
        results[index] = await search(client, queries[index], **kw)

    async with anyio.create_task_group() as tg:
        for index in range(len(queries)):
            tg.start_soon(one, index)
    return results


async def usage(server: RecallServer, run_id: str, caller: Caller = ANA) -> tuple[int, int, int]:
    found = await server.hooks.allowance.ledger.usage(ledger_id(run_id, caller))
    return found.rounds, found.reserved, found.executed


def statuses(results: list[Mapping[str, Any]]) -> list[str]:
    return sorted(result["status"] for result in results)


async def test_six_parallel_searches_get_four_slots_and_two_refusals(tmp_path: Path) -> None:
    async with recall_server(tmp_path, window_s=1.0) as server, Client(server.server) as client:
        results = await parallel(client, QUERIES, run_id="run-six")
        assert statuses(results) == ["ok"] * 4 + ["refused"] * 2
        refusals = [r["refusal"] for r in results if r["status"] == "refused"]
        assert {r["reason"] for r in refusals} == {"slots"}
        texts = [r["content"] for r in results if r["status"] == "refused"]
        assert all("bounded" in t and "not evidence" in t for t in texts)
        rounds, reserved, executed = await usage(server, "run-six")
        assert rounds <= 2 and (reserved, executed) == (4, 4)


async def test_six_parallel_searches_after_the_automatic_round_get_two_slots(
    tmp_path: Path,
) -> None:
    async with recall_server(tmp_path, window_s=1.0) as server, Client(server.server) as client:
        meta = {"recallbound/run_id": "run-auto"}
        context = await client.call_tool(
            "recall_context",
            {"current_request": "How do I run the invoice backfill dry-run?",
             "next_action": "Run the invoice backfill dry-run",
             "tasks": [{"text": "Confirm currency rounding rules", "done": False}]},
            meta=meta,
        )
        assert structured(context)["status"] == "ok"
        assert "m-backfill" in structured(context)["evidence_ids"]
        assert (await usage(server, "run-auto"))[:2] == (1, 2)  # one round, two slots
        results = await parallel(client, QUERIES, run_id="run-auto")
        assert statuses(results) == ["ok"] * 2 + ["refused"] * 4
        assert (await usage(server, "run-auto"))[:2] == (2, 4)
        # never more than 2 rounds: a later search is refused without a round
        later = await search(client, "deploy window", run_id="run-auto")
        assert later["status"] == "refused" and later["refusal"]["reason"] in ("rounds", "slots")
        assert (await usage(server, "run-auto"))[:2] == (2, 4)


async def test_a_lone_search_is_answered_once_the_window_closes(tmp_path: Path) -> None:
    async with recall_server(tmp_path, window_s=0.5) as server, Client(server.server) as client:
        with anyio.fail_after(60):
            result = await search(client, "invoice backfill dry-run", run_id="run-lone")
        assert result["status"] == "ok" and "m-backfill" in result["evidence_ids"]
        assert await usage(server, "run-lone") == (1, 1, 1)


async def test_a_search_after_the_deadline_is_refused(tmp_path: Path) -> None:
    clock = ManualClock(wall=1_800_000_000.0, monotonic=0.0)
    async with recall_server(tmp_path, clock=clock) as server, Client(server.server) as client:
        first = await search(client, "cutover date", run_id="run-late")
        assert first["status"] == "ok"
        clock.advance(10.5)
        late = await search(client, "deploy window", run_id="run-late")
        assert late["status"] == "refused" and late["refusal"]["reason"] == "deadline"
        assert await usage(server, "run-late") == (1, 1, 1)


async def test_a_second_server_instance_resumes_the_run(tmp_path: Path) -> None:
    async with recall_server(tmp_path) as server, Client(server.server) as client:
        assert (await search(client, "cutover date", run_id="run-resume"))["status"] == "ok"
    async with recall_server(tmp_path, window_s=1.0) as server, Client(server.server) as client:
        results = await parallel(client, QUERIES, run_id="run-resume")
        assert statuses(results) == ["ok"] * 3 + ["refused"] * 3
        assert await usage(server, "run-resume") == (2, 4, 4)


async def test_without_a_run_id_one_client_session_is_one_run(tmp_path: Path) -> None:
    async with recall_server(tmp_path) as server:
        async with Client(server.server) as client:
            for query in QUERIES[:2]:  # two lone searches: two rounds of the session's run
                assert (await search(client, query))["status"] == "ok"
            third = await search(client, QUERIES[2])
            assert third["status"] == "refused" and third["refusal"]["reason"] == "rounds"
        async with Client(server.server) as client:  # a new session is a new run
            assert (await search(client, QUERIES[3]))["status"] == "ok"
        tools = {tool.name: tool for tool in (await _list(server)).tools}
        for tool in (tools["search_memory"], tools["recall_context"]):
            assert "recallbound/run_id" in (tool.description or "")
            assert "at most 4 searches in at most 2 rounds" in (tool.description or "")
            assert "current run, which ends at its deadline" in (tool.description or "")


async def _list(server: RecallServer) -> Any:
    async with Client(server.server) as client:
        return await client.list_tools()


async def test_a_run_id_from_meta_is_shared_across_sessions(tmp_path: Path) -> None:
    async with recall_server(tmp_path) as server:
        for query in QUERIES[:2]:
            async with Client(server.server) as client:
                assert (await search(client, query, run_id="run-meta"))["status"] == "ok"
        async with Client(server.server) as client:
            third = await search(client, QUERIES[2], run_id="run-meta")
        assert third["status"] == "refused" and third["refusal"]["reason"] == "rounds"
        assert await usage(server, "run-meta") == (2, 2, 2)


async def test_a_run_id_sent_by_another_principal_names_another_run(tmp_path: Path) -> None:
    async with recall_server(tmp_path) as ana:
        bo = RecallServer(ana.hooks, caller=BO)
        async with Client(ana.server) as client:
            assert (await search(client, "cutover date", run_id="run-owned"))["status"] == "ok"
        async with Client(bo.server) as client:  # no squatting, no probing: bo's own run
            for query in ("cutover date", "deploy window"):
                assert (await search(client, query, run_id="run-owned"))["status"] == "ok"
            context = await client.call_tool("recall_context", {"current_request": "Continue"},
                                             meta={"recallbound/run_id": "run-owned"})
            assert structured(context)["status"] == "refused"  # bo's run has no round left
        async with Client(ana.server) as client:  # ana's run is untouched by bo
            assert (await search(client, "deploy window", run_id="run-owned"))["status"] == "ok"
        assert await usage(ana, "run-owned") == (2, 2, 2)
        assert await usage(ana, "run-owned", BO) == (2, 2, 2)
        assert ledger_id("run-owned", ANA) != ledger_id("run-owned", BO)


async def test_a_forged_principal_or_scope_in_arguments_is_rejected(tmp_path: Path) -> None:
    async with recall_server(tmp_path) as server, Client(server.server) as client:
        for forged in ({"principal": "bo"}, {"scope": "personal"}, {"run_id": "other"}):
            result = await client.call_tool(
                "search_memory", {"query": "backfill dry-run budget", **forged},
                meta={"recallbound/run_id": "run-forged"},
            )
            assert result.is_error and structured(result)["status"] == "invalid"
        context = await client.call_tool(
            "recall_context", {"current_request": "Continue", "principal": "bo"},
            meta={"recallbound/run_id": "run-forged"},
        )
        assert context.is_error and structured(context)["status"] == "invalid"
        assert await usage(server, "run-forged") == (0, 0, 0)
        # _meta cannot name the principal either: the search runs as the server's caller
        result = await client.call_tool(
            "search_memory", {"query": "backfill dry-run budget"},
            meta={"recallbound/run_id": "run-forged", "recallbound/principal": "bo"},
        )
        assert structured(result)["status"] == "ok"
        assert "m-foreign" not in structured(result)["evidence_ids"]


@pytest.mark.parametrize("arguments", [
    {"query": 42},
    {"query": "x" * 5000},
    {"query": "?!"},
    {},
    {"query": "cutover", "extra": {"a": [[[[[1]]]]]}},
])
async def test_malformed_arguments_are_typed_errors_and_the_server_keeps_serving(
    tmp_path: Path, arguments: dict[str, Any]
) -> None:
    async with recall_server(tmp_path) as server, Client(server.server) as client:
        result = await client.call_tool("search_memory", arguments,
                                        meta={"recallbound/run_id": "run-bad"})
        assert result.is_error and structured(result)["status"] == "invalid"
        assert await usage(server, "run-bad") == (0, 0, 0)
        assert (await search(client, "cutover date", run_id="run-bad"))["status"] == "ok"


async def test_an_oversized_working_state_and_a_bad_run_id_are_typed_errors(
    tmp_path: Path,
) -> None:
    async with recall_server(tmp_path) as server, Client(server.server) as client:
        big = await client.call_tool("recall_context", {"current_request": "x" * 70_000},
                                     meta={"recallbound/run_id": "run-big"})
        assert big.is_error and structured(big)["error"] == errors.InvalidArgumentError.__name__
        bad = await client.call_tool("search_memory", {"query": "cutover"},
                                     meta={"recallbound/run_id": 7})
        assert bad.is_error and structured(bad)["error"] == errors.InvalidArgumentError.__name__
        assert await usage(server, "run-big") == (0, 0, 0)


async def test_the_working_state_is_bounded_in_bytes_of_json(tmp_path: Path) -> None:
    """At most 64 KiB of JSON, counted in UTF-8 bytes: 30,000 three-byte characters are
    over (though 30,000 characters are not), 21,000 are within."""
    async with recall_server(tmp_path) as server, Client(server.server) as client:
        # 7,500 short questions: 58,900 bytes as compact JSON, 66,400 with ", " separators
        many = {"open_questions": [f"q{i:04d}" for i in range(7_500)]}
        for run_id, arguments, status in (
            ("run-wide", {"constraints": ["界" * 30_000]}, "invalid"),
            ("run-fits", {"constraints": ["界" * 21_000]}, "ok"),
            ("run-compact", many, "ok"),
        ):
            found = await client.call_tool(
                "recall_context", {"current_request": "continue", **arguments},
                meta={"recallbound/run_id": run_id})
            assert structured(found)["status"] == status, structured(found)
        assert await usage(server, "run-wide") == (0, 0, 0)


async def test_an_unknown_tool_is_a_typed_error_and_the_server_keeps_serving(
    tmp_path: Path,
) -> None:
    async with recall_server(tmp_path) as server, Client(server.server) as client:
        result = await client.call_tool("delete_memory", {"id": "m-backfill"})
        assert result.is_error and structured(result)["error"] == "UnknownTool"
        assert (await search(client, "cutover date", run_id="run-u"))["status"] == "ok"


@pytest.mark.parametrize("writes", [True, False])
async def test_a_call_may_name_exactly_the_tools_listed(tmp_path: Path, writes: bool) -> None:
    async with recall_server(tmp_path) as server:
        if not writes:
            server.store = None
        async with Client(server.server) as client:
            listed = [tool.name for tool in (await client.list_tools()).tools]
            assert ("remember" in listed) is writes
            unknown = structured(await client.call_tool("delete_memory", {}))
            assert unknown["content"].endswith(f"{', '.join(map(repr, listed))}.")
            for name in ("search_memory", "recall_context", "remember", "forget"):
                answer = structured(await client.call_tool(name, {}))
                assert (answer.get("error") == "UnknownTool") is (name not in listed)


@attrs.define
class _Gate:
    """A retriever whose searches wait until released (to disconnect in the middle)."""

    inner: Any
    entered: anyio.Event = attrs.field(factory=anyio.Event)
    release: anyio.Event = attrs.field(factory=anyio.Event)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def search(self, prepared: PreparedRecall, handle: Any, **kw: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        return await self.inner.search(prepared, handle, **kw)


async def test_a_client_that_disconnects_mid_search_keeps_the_slot_consumed(
    tmp_path: Path,
) -> None:
    async with recall_server(tmp_path) as plain:
        gate = _Gate(plain.hooks.retriever)
        server = RecallServer(attrs.evolve(plain.hooks, retriever=gate), caller=ANA)
        async with Client(server.server) as client, anyio.create_task_group() as tg:
            tg.start_soon(partial(search, client, "cutover date", run_id="run-gone"))
            await gate.entered.wait()
            tg.cancel_scope.cancel()  # the client leaves while the search runs
        gate.release.set()
        assert await usage(server, "run-gone") == (1, 1, 1)  # consumed, never refunded
        async with Client(server.server) as client:  # and the server keeps serving
            assert (await search(client, "deploy window", run_id="run-gone"))["status"] == "ok"
        assert await usage(server, "run-gone") == (2, 2, 2)


async def test_an_unavailable_ledger_fails_closed_and_the_server_keeps_serving(
    tmp_path: Path,
) -> None:
    async with recall_server(tmp_path) as server, Client(server.server) as client:
        await server.hooks.allowance.ledger.aclose()
        for _ in range(2):
            result = await client.call_tool("search_memory", {"query": "cutover date"},
                                            meta={"recallbound/run_id": "run-down"})
            assert result.is_error and structured(result)["status"] == "failed"
            assert "not evidence" in structured(result)["content"]
        context = await client.call_tool("recall_context", {"current_request": "Continue"})
        assert context.is_error and structured(context)["status"] == "failed"
        assert [tool.name for tool in (await client.list_tools()).tools] == [
            "search_memory", "recall_context", "remember", "forget"]


async def test_a_locked_ledger_fails_closed_and_the_server_keeps_serving(tmp_path: Path) -> None:
    async with recall_server(tmp_path) as plain, SqliteLedger(
        tmp_path / "ledger.db", timeout=0.2
    ) as impatient:
        hooks = attrs.evolve(plain.hooks, allowance=attrs.evolve(plain.hooks.allowance,
                                                                 ledger=impatient))
        server = RecallServer(hooks, caller=ANA)
        holder = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            async with Client(server.server) as client:
                locked = await client.call_tool("search_memory", {"query": "cutover date"},
                                                meta={"recallbound/run_id": "run-locked"})
                assert locked.is_error and structured(locked)["status"] == "failed"
                assert structured(locked)["error"] == errors.LedgerLockedError.__name__
                holder.execute("ROLLBACK")
                again = await search(client, "cutover date", run_id="run-locked")
                assert again["status"] == "ok"
        finally:
            holder.close()
        assert await usage(server, "run-locked") == (1, 1, 1)


async def test_every_result_matches_its_output_schema_and_says_a_refusal_once(
    tmp_path: Path,
) -> None:
    import jsonschema

    from plugin.control.wording import NOT_EVIDENCE

    async with recall_server(tmp_path, window_s=1.0) as server, Client(server.server) as client:
        schemas = {tool.name: tool.output_schema for tool in (await client.list_tools()).tools}
        assert all(schemas.values())
        state = {"current_request": "How do I run the invoice backfill dry-run?"}
        calls: list[tuple[str, dict[str, Any], Any]] = [
            ("recall_context", state, "run-s"),
            ("search_memory", {"query": "cutover date"}, "run-s"),
            ("search_memory", {"query": "deploy window"}, "run-s"),  # refused: rounds
            ("recall_context", state, "run-s"),  # its notice
            ("search_memory", {"query": 42}, "run-s"),
            ("search_memory", {"query": "cutover"}, 7),
            ("recall_context", {"current_request": 7}, "run-s"),
            ("recall_context", {"current_request": "x" * 70_000}, "run-s"),
            ("remember", {"text": ""}, None),
            ("forget", {"id": 5}, None),
            ("delete_memory", {}, None),
        ]
        refused = errors_seen = 0
        for name, arguments, run_id in calls:
            meta = {"recallbound/run_id": run_id} if run_id is not None else None
            result = await client.call_tool(name, arguments, meta=meta)
            data = structured(result)
            if name in schemas:
                jsonschema.validate(data, schemas[name])
            text = "".join(block.text for block in result.content
                           if isinstance(block, mcp_types.TextContent))
            if result.is_error:
                errors_seen += 1
                assert data["status"] in ("invalid", "failed") and data["error"]
            if data["status"] == "refused":
                refused += 1
                assert text.count(NOT_EVIDENCE) == 1
                assert json.dumps(data).count("not evidence that no memory exists") == 1
        assert (refused, errors_seen) == (2, 7)


async def test_each_token_owns_the_sessions_it_opens() -> None:
    """The SDK gives a stateful session to the (client_id, issuer, subject) that opened it:
    another token of the same principal, any scope, must not match it."""
    from mcp.server.auth.provider import principal_components

    from runtime_hooks.mcp.trust import TableTokenVerifier, TokenTable, caller_of_token

    first, second = "a" * 32, "b" * 32
    table = TokenTable.from_entries(
        [{"token": first, "principal": "ana", "scope": "atlas"},
         {"token": second, "principal": "ana", "scope": "other"}], source="test")
    verifier = TableTokenVerifier(table)
    one, two = await verifier.verify_token(first), await verifier.verify_token(second)
    assert one is not None and two is not None
    assert principal_components(one) != principal_components(two)
    assert principal_components(one) == principal_components(await verifier.verify_token(first))
    assert caller_of_token(one) == Caller(principal="ana", scope="atlas")
    assert first not in repr(one) and first not in one.client_id
