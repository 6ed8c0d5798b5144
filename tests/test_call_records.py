"""Exactly-once tool calls: a dispatched call's outcome lives in the ledger.

A call's identity is (run, call id, canonical arguments). These tests replay calls through
fresh hooks objects over the same ledger (what another process or a restart sees: nothing but
the ledger is shared) on SQLite and PostgreSQL, on both loops: a replay never searches, never
reserves, and answers with the recorded outcome.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import pytest

from plugin import (
    Evidence,
    ManualClock,
    QueryPlanner,
    QueryPreparation,
    RecallAllowance,
    SimpleRetriever,
)
from plugin.control import RefusalReason, SqliteLedger
from plugin.control.ledger import MAX_CALL_EVIDENCE, CallRecord
from plugin.errors import InvalidArgumentTypeError
from runtime_hooks import RecallHooks, ToolCall
from runtime_hooks.adapters.batch import RunRecalls
from runtime_hooks.hooks import SearchCall, call_records

from ._calls_env import WALL, Counting, P, S, ledger_openers, recall_hooks
from ._pg import DSN, connect, fresh_schema

pytestmark = pytest.mark.anyio

@pytest.fixture(params=["sqlite", "postgres"])
def ledger_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def opener(ledger_kind: str, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    with ledger_openers(ledger_kind, tmp_path, "calls") as opened:
        yield opened


@contextlib.asynccontextmanager
async def _hooks(opener: Callable[[], Any], clock: ManualClock, retriever: Counting,
                 **policy: Any) -> AsyncIterator[RecallHooks]:
    async with opener() as ledger:
        yield recall_hooks(ledger, clock, retriever, **policy)


def _call(call_id: str, query: str = "cutover") -> ToolCall:
    return ToolCall(call_id=call_id, arguments={"query": query})


async def _counts(hooks: RecallHooks, run_id: str) -> tuple[int, int, int]:
    usage = await hooks.allowance.ledger.usage(run_id)
    return usage.rounds, usage.reserved, usage.executed


async def test_a_replay_in_another_process_answers_from_the_ledger(
    opener: Callable[[], Any],
) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    first = Counting()
    async with _hooks(opener, clock, first) as hooks:
        (ran,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        assert ran.status == "ok" and [e.id for e in ran.evidence] == ["m0", "m1", "m2"]
        before = await _counts(hooks, "r")
    again = Counting()
    async with _hooks(opener, clock, again) as hooks:
        # The same call, spelled differently (arguments as JSON text): the same identity.
        (replayed,) = await hooks.dispatch(
            [ToolCall(call_id="c1", arguments=' {"query":  "cutover"} ')],
            run_id="r", scope=S, principal=P)
        assert replayed.status == "ok" and replayed.slot == ran.slot
        assert [e.id for e in replayed.evidence] == ["m0", "m1", "m2"]
        assert await _counts(hooks, "r") == before
        assert again.searches == 0 and again.reads == 3  # re-read, never searched


async def test_legacy_hooks_read_no_record_an_enforced_worker_wrote(
    opener: Callable[[], Any],
) -> None:
    # Legacy is no enforcement at all: exactly-once holds among enforced hooks (documented).
    clock = ManualClock(wall=WALL, monotonic=1.0)
    async with _hooks(opener, clock, Counting()) as hooks:
        (ran,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        assert ran.status == "ok"
    legacy = Counting()
    async with opener() as ledger:
        hooks = RecallHooks(allowance=RecallAllowance.legacy(ledger, clock=clock),
                            preparer=QueryPreparation(QueryPlanner()),
                            retriever=legacy.retriever)
        assert await hooks.replay([_call("c1")], run_id="r", scope=S, principal=P) == [None]
        (again,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        assert again.status == "ok" and legacy.searches == 1
    async with _hooks(opener, clock, (enforced := Counting())) as hooks:
        # The legacy search changed nothing the enforced workers recorded.
        (replayed,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        assert replayed.slot == ran.slot and enforced.searches == 0


@pytest.mark.parametrize("calls", ["abc", b"abc", None, 5, {"c1": "x"}, [None],
                                   [{"call_id": "c1", "arguments": {"query": "x"}}]])
async def test_replay_refuses_what_dispatch_refuses(
    opener: Callable[[], Any], calls: Any
) -> None:
    # Never read as "never dispatched": a string is not three calls, a dict is not a call.
    retriever = Counting()
    async with _hooks(opener, ManualClock(wall=WALL, monotonic=1.0), retriever) as hooks:
        for method in (hooks.dispatch, hooks.replay):
            with pytest.raises(InvalidArgumentTypeError):
                await method(calls, run_id="r", scope=S, principal=P)
        assert await _counts(hooks, "r") == (0, 0, 0) and retriever.searches == 0


async def test_a_replay_past_the_validation_bound_says_bounded(
    opener: Callable[[], Any],
) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    async with _hooks(opener, clock, Counting()) as hooks:
        hooks.validation_limit = 2
        await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
    retriever = Counting()
    async with _hooks(opener, clock, retriever) as hooks:
        hooks.validation_limit = 2
        (replayed,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        assert [e.id for e in replayed.evidence] == ["m0", "m1"]
        assert "bounded" in replayed.content and "not evidence" in replayed.content
        (spent,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        assert spent.status == "ok" and spent.evidence == ()
        assert "3 item(s)" in spent.content and "bounded" in spent.content
        assert retriever.searches == 0


class _CannotReRead(Counting):
    """A retriever with no way to re-read an item by id (a SimpleRetriever without ``get``)."""

    def __init__(self) -> None:
        super().__init__()
        self.retriever = SimpleRetriever(self.search)


async def test_a_replay_whose_items_cannot_be_shown_again_never_says_nothing_was_found(
    opener: Callable[[], Any],
) -> None:
    """A search that found memory, replayed where its items cannot be re-read, then once the
    run's re-check bound is spent: each answer says so in the bounded wording (and in
    ``bounded``), never that no memory was found."""
    clock = ManualClock(wall=WALL, monotonic=1.0)
    async with _hooks(opener, clock, Counting()) as hooks:
        hooks.validation_limit = 3
        (ran,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        assert len(ran.evidence) == 3
    retriever = _CannotReRead()
    async with _hooks(opener, clock, retriever) as hooks:
        hooks.validation_limit = 3
        (unread,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        (spent,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
    for replayed, words in ((unread, "could not be re-read"), (spent, "could not be re-checked")):
        assert replayed.status == "ok" and replayed.slot == ran.slot and replayed.evidence == ()
        assert "No memory was found" not in replayed.content
        assert "No matching memory" not in replayed.content
        (part,) = replayed.bounded
        assert part.part == "recheck" and "3 item(s)" in part.message and words in part.message
        assert part.message.startswith("Memory recall was bounded") and "not evidence" in (
            part.message)
        assert replayed.content == f"Note: {part.message}"
    assert retriever.searches == 0


async def test_a_refused_call_keeps_its_refusal(opener: Callable[[], Any]) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    async with _hooks(opener, clock, Counting(), max_searches=1, automatic_slots=1) as hooks:
        results = await hooks.dispatch([_call("c1"), _call("c2", "deploy window")],
                                       run_id="r", scope=S, principal=P)
        assert [r.status for r in results] == ["ok", "refused"]
        await hooks.dispatch([_call("c3")], run_id="r", scope=S, principal=P)  # a refused round
    retriever = Counting()
    async with _hooks(opener, clock, retriever, max_searches=1, automatic_slots=1) as hooks:
        before = await _counts(hooks, "r")
        two, three = await hooks.dispatch([_call("c2", "deploy window"), _call("c3")],
                                          run_id="r", scope=S, principal=P)
        assert (two.status, three.status) == ("refused", "refused")
        assert two.refusal is not None and two.refusal.reason is RefusalReason.SLOTS
        assert three.refusal is not None and three.refusal.reason is RefusalReason.SLOTS
        assert "bounded" in two.content and "not evidence" in two.content
        assert await _counts(hooks, "r") == before and retriever.searches == 0


class _Arguments(Mapping[str, object]):
    """A framework's own read-only mapping of a call's arguments."""

    def __init__(self, values: dict[str, object]) -> None:
        self._values = values

    def __getitem__(self, key: str) -> object:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


@pytest.mark.parametrize("spelling", [
    '{ "scope": "proj", "query": "cutover" }',
    MappingProxyType({"query": "cutover", "scope": "proj"}),
    _Arguments({"scope": "proj", "query": "cutover"}),
], ids=["json text", "mappingproxy", "own mapping"])
async def test_a_replay_spelled_as_any_mapping_is_not_searched_again(
    opener: Callable[[], Any], spelling: object,
) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    first = {"query": "cutover", "scope": "proj"}
    retriever = Counting()
    async with _hooks(opener, clock, retriever) as hooks:
        (ran,) = await hooks.dispatch([ToolCall(call_id="c1", arguments=first)], run_id="r",
                                      scope=S, principal=P)
    again = Counting()
    async with _hooks(opener, clock, again) as hooks:
        (replayed,) = await hooks.dispatch(
            [ToolCall(call_id="c1", arguments=spelling)],  # type: ignore[arg-type]
            run_id="r", scope=S, principal=P)
    assert ran.status == "ok" and retriever.searches == 1
    assert (replayed.status, replayed.slot, again.searches) == ("ok", ran.slot, 0)


async def test_a_reused_call_id_with_other_arguments_is_a_new_call(
    opener: Callable[[], Any],
) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    retriever = Counting()
    async with _hooks(opener, clock, retriever) as hooks:
        (first,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        (other,) = await hooks.dispatch([_call("c1", "deploy window")], run_id="r", scope=S,
                                        principal=P)
        assert other.status == "ok" and other.slot != first.slot
        assert retriever.searches == 2 and (await _counts(hooks, "r"))[1] == 2
        records = await hooks.allowance.ledger.recorded_calls("r", ["c1"])
        assert sorted(r.slot for r in records) == sorted([first.slot, other.slot])


async def test_a_run_forgotten_by_the_registry_replays_from_the_ledger(
    opener: Callable[[], Any],
) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    retriever = Counting()
    async with _hooks(opener, clock, retriever) as hooks:
        runs = RunRecalls(hooks, max_runs=1)
        batch = [_call("c1"), _call("c2", "deploy window")]
        answered = await runs.get("a", scope=S, principal=P).dispatch_batch(batch)
        await runs.get("b", scope=S, principal=P).dispatch_batch([_call("c9")])  # evicts "a"
        before, searches = await _counts(hooks, "a"), retriever.searches
        again = await runs.get("a", scope=S, principal=P).dispatch_batch(batch)
        assert [r.status for r in again] == ["ok", "ok"]
        assert [r.slot for r in again] == [r.slot for r in answered]
        assert await _counts(hooks, "a") == before and retriever.searches == searches


async def _table_rows(ledger: Any) -> int:
    """Every row of every ledger table (the whole durable footprint)."""
    tables = ("runs", "rounds", "attempts", "refusals", "retained", "validations",
              "run_identity", "calls")
    if isinstance(ledger, SqliteLedger):
        rows = await ledger._read(" + ".join(f"(SELECT count(*) FROM {t})" for t in tables)
                                  .join(("SELECT ", "")), {}, "counting")
        return int(rows[0][0])
    with connect() as conn:
        schema = ledger.schema
        row = conn.execute("SELECT " + " + ".join(
            f'(SELECT count(*) FROM "{schema}".{t})' for t in tables)).fetchone()
        assert row is not None
        return int(row[0])


async def test_invalid_calls_with_fresh_run_ids_write_no_rows(
    opener: Callable[[], Any],
) -> None:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    retriever = Counting()
    bad = ['{"query": "cutover", "x": 1}', "not json", '{"query": ""}', '{"query": 5}']
    async with _hooks(opener, clock, retriever) as hooks:
        for i in range(300):
            (result,) = await hooks.dispatch(
                [ToolCall(call_id=f"c{i}", arguments=bad[i % len(bad)])],
                run_id=f"fresh-{i}", scope=S, principal=P)
            assert result.status == "invalid"
        assert await _table_rows(hooks.allowance.ledger) == 0
        assert retriever.searches == 0


async def test_call_records_are_bounded() -> None:
    from plugin.memory.protocol import ContextCaps
    from plugin.memory.recall import DeliberateSearch
    from plugin.memory.rendering import render

    items = [Evidence(id="x" * 1000 + str(i), text="t", principal=P, scope=S)
             for i in range(MAX_CALL_EVIDENCE + 10)]
    search = DeliberateSearch(slot=1, rendered=render(items, ContextCaps(
        max_items=len(items), max_bytes=10**7)))
    (record,) = call_records("r", [(0, SearchCall(call_id="c", query="q"))], {0: "d"}, [search])
    assert isinstance(record, CallRecord) and record.status == "ok"
    assert sum(len(i) + 1 for i in record.evidence_ids) <= 16_384
    assert len(record.evidence_ids) + record.more == len(items) and record.more > 0


#: pydantic-ai needs Python 3.11 or newer, where the ``test`` extra installs it (as the
#: adapter's own tests, it is not collected on 3.10 rather than skipped).
REPLAY_FRAMEWORKS = (["pydantic_ai"] if sys.version_info >= (3, 11) else []) + ["openai_agents"]


@pytest.mark.parametrize("framework", REPLAY_FRAMEWORKS)
def test_an_adapter_replay_in_a_fresh_process_never_searches_again(
    framework: str, ledger_kind: str, tmp_path: Path,
) -> None:
    """Two processes run the same scripted turn (same call ids, same arguments) on one run:
    the second answers from the ledger, with the first's evidence, and changes no count."""
    with contextlib.ExitStack() as stack:
        if ledger_kind == "sqlite":
            where = [str(tmp_path / "ledger.sqlite3")]
        else:
            where = [DSN, stack.enter_context(fresh_schema("replay"))]

        def one_process() -> dict[str, Any]:
            done = subprocess.run(
                [sys.executable, "-m", "tests._replay_worker", framework, ledger_kind, *where],
                capture_output=True, text=True, timeout=120, check=False,
                cwd=Path(__file__).parent.parent)
            assert done.returncode == 0, done.stderr[-3000:]
            return dict(json.loads(done.stdout.strip().splitlines()[-1]))

        first = one_process()
        assert first["searches"] == 2 and first["usage"] == [1, 2, 2]
        assert [status for status, _ in first["calls"].values()] == ["ok", "ok"]
        second = one_process()
        assert second["searches"] == 0 and second["usage"] == first["usage"]
        assert second["calls"] == first["calls"]


def _count_reads(monkeypatch: pytest.MonkeyPatch, ledger: Any) -> list[str]:
    """Every ``usage`` and ``recorded_calls`` read of ``ledger``, by name, from now on."""
    reads: list[str] = []
    for name in ("usage", "recorded_calls"):
        real = getattr(ledger, name)

        async def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            reads.append(_name)
            return await _real(*args, **kw)

        monkeypatch.setattr(ledger, name, counted)
    return reads


async def test_a_call_with_a_made_up_id_is_recorded_as_any_call(
    opener: Callable[[], Any],
) -> None:
    """An id made up by :meth:`ToolCall.with_new_id` is claimed and recorded as any call's: a
    replay of the same id and arguments answers from its record."""
    clock = ManualClock(wall=WALL, monotonic=1.0)
    retriever = Counting()
    async with _hooks(opener, clock, retriever) as hooks:
        made_up = [ToolCall.with_new_id({"query": "cutover"}, prefix="mcp-") for _ in range(2)]
        assert made_up[0].call_id.startswith("mcp-")
        assert made_up[0].call_id != made_up[1].call_id
        results = await hooks.dispatch(made_up, run_id="r", scope=S, principal=P)
        assert [r.status for r in results] == ["ok", "ok"] and retriever.searches == 2
        again = ToolCall(call_id=made_up[0].call_id, arguments={"query": "cutover"})
        (replayed,) = await hooks.dispatch([again], run_id="r", scope=S, principal=P)
        assert replayed.status == "ok" and retriever.searches == 2


async def test_a_made_up_call_given_another_id_is_looked_up_again(
    opener: Callable[[], Any],
) -> None:
    """A made-up call copied under another id (``attrs.evolve``) names that id, which may have
    been sent before: its record is looked up and answers, nothing is searched again."""
    clock = ManualClock(wall=WALL, monotonic=1.0)
    retriever = Counting()
    async with _hooks(opener, clock, retriever) as hooks:
        (ran,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        assert ran.status == "ok" and retriever.searches == 1
        copied = attrs.evolve(ToolCall.with_new_id({"query": "cutover"}), call_id="c1")
        (replayed,) = await hooks.dispatch([copied], run_id="r", scope=S, principal=P)
        assert replayed.status == "ok" and retriever.searches == 1
        assert await _counts(hooks, "r") == (1, 1, 1)


async def test_a_later_round_of_a_run_reads_no_usage_before_its_reservation(
    opener: Callable[[], Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What this process learned at its last reservation is what the turn plans with; only
    the reservation reads the ledger."""
    clock = ManualClock(wall=WALL, monotonic=1.0)
    retriever = Counting()
    async with _hooks(opener, clock, retriever) as hooks:
        (first,) = await hooks.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        reads = _count_reads(monkeypatch, hooks.allowance.ledger)
        (second,) = await hooks.dispatch([_call("c2", "deploy")], run_id="r", scope=S,
                                         principal=P)
        assert (first.status, second.status) == ("ok", "ok") and retriever.searches == 2
        assert "usage" not in reads


async def test_a_stale_estimate_never_searches_past_the_allowance(
    opener: Callable[[], Any],
) -> None:
    """Another process spends the run after this one last reserved for it: this process's
    estimate is stale (too high, never too low: a run's use only grows), its turn prepares the
    call, and the reservation refuses it. Nothing is searched."""
    clock = ManualClock(wall=WALL, monotonic=1.0)
    here, there = Counting(), Counting()
    async with _hooks(opener, clock, here) as this, _hooks(opener, clock, there) as other:
        (ran,) = await this.dispatch([_call("c1")], run_id="r", scope=S, principal=P)
        assert ran.status == "ok"
        spent = await other.dispatch([_call(f"o{i}") for i in range(3)], run_id="r", scope=S,
                                     principal=P)
        assert [r.status for r in spent] == ["ok", "ok", "ok"]  # the last round, all slots
        (late,) = await this.dispatch([_call("c2", "deploy")], run_id="r", scope=S, principal=P)
        assert late.status == "refused" and here.searches == 1 and there.searches == 3
        assert await _counts(this, "r") == (2, 4, 4)


def test_canonical_arguments_read_nested_mappings_and_tuples_as_json_does() -> None:
    from runtime_hooks.calls import canonical_arguments

    nested = {"a": ("x", MappingProxyType({"b": 1})), "c": _Arguments({"d": [2]})}
    assert canonical_arguments(nested) == canonical_arguments(
        '{"c": {"d": [2]}, "a": ["x", {"b": 1}]}')


@pytest.mark.parametrize("prefix", ["x" * 250, "a\x00", "\ud800"])
def test_a_prefix_that_makes_no_valid_call_id_is_refused_at_once(prefix: str) -> None:
    from plugin.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="prefix makes no valid call id"):
        ToolCall.with_new_id({"query": "cutover"}, prefix=prefix)
    assert len(ToolCall.with_new_id({"query": "cutover"}, prefix="x" * 200).call_id) == 232


async def _first_and_replayed(folder: Path, query: str, **policy: Any) -> tuple[Any, Any]:
    """A search on the demo's store, then the same call replayed by another hooks object (as
    another process would: only the ledger is shared)."""
    from plugin import AllowancePolicy
    from plugin.memory.pipeline import MemoryRetriever
    from runtime_hooks.bootstrap import RecallConfig, open_hooks
    from runtime_hooks.demo import seed

    clock = ManualClock(wall=WALL, monotonic=1.0)
    config = RecallConfig(ledger_path=folder / "ledger.db", store_path=folder / "m.db",
                          policy=AllowancePolicy(**policy))
    call = ToolCall(call_id="c0", arguments={"query": query})
    async with open_hooks(config, clock=clock) as hooks:
        assert isinstance(hooks.retriever, MemoryRetriever)
        await seed(hooks.retriever.store)
        (first,) = await hooks.dispatch([call], run_id="r", scope="atlas", principal="ana")
    async with open_hooks(config, clock=clock) as hooks:
        (replayed,) = await hooks.dispatch([call], run_id="r", scope="atlas", principal="ana")
    return first, replayed


@pytest.mark.parametrize("query", ["invoice backfill", "what does Priya believe about rounding"])
async def test_a_replay_re_reads_beliefs_and_sources_as_well_as_memories(
    tmp_path: Path, query: str
) -> None:
    """A call's evidence may hold a person's belief or a cited source besides memories: the
    replay re-reads each kind and answers with all of it (none taken for gone)."""
    first, replayed = await _first_and_replayed(tmp_path, query)
    kinds = {item.kind for item in first.evidence}
    assert kinds - {"memory"}, kinds  # the case: a belief or a source among the evidence
    assert [(e.id, e.kind) for e in replayed.evidence] == [(e.id, e.kind) for e in first.evidence]


@pytest.mark.parametrize("query", ["Priya", "Priya rounding directive"])
async def test_a_replay_says_again_what_the_allowance_cut_short(tmp_path: Path, query: str) -> None:
    """A search whose belief read was refused (no slot left) said so, in the bounded wording:
    its replay, in another process, says the same, never "No matching memory was found"."""
    first, replayed = await _first_and_replayed(tmp_path, query, max_searches=1,
                                                automatic_slots=1)
    assert [part.part for part in first.bounded] == ["nested_read"]  # the case
    assert (replayed.content, replayed.bounded) == (first.content, first.bounded)
    assert "No matching memory was found" not in replayed.content
