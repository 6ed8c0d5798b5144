"""Enforcement lives in the hooks: a plain retriever, and a hostile one, cannot escape it.

``DictRetriever`` below is a whole :class:`~plugin.memory.pipeline.Retriever` in about forty
lines: plain search over a dict, no permit, no slot-taking. The hooks still hold it to the
allowance: it runs only inside a slot, it is cut at the deadline, and a handle it keeps past
its attempt refuses. Both loops; trio on an autojumping MockClock (no worker thread here).
"""

from __future__ import annotations

import copy
import itertools
import pickle
import threading
from collections.abc import Sequence
from typing import Any

import anyio
import attrs
import numpy as np
import pytest

from plugin import (
    AllowancePolicy,
    ManualClock,
    Permit,
    QueryPlanner,
    QueryPreparation,
    RecallAllowance,
    RecallBudgetExceeded,
    RefusalReason,
    WorkingState,
    current_permit,
)
from plugin.control import AttemptOutcome
from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError
from plugin.memory.enforce import AttemptHandle, Found
from plugin.memory.pipeline import ContextCaps, Retriever
from plugin.memory.preparation import PreparedRecall
from plugin.memory.store import Evidence
from runtime_hooks import RecallHooks
from runtime_hooks.hooks import ToolCall

from ._fakes import MemoryLedger
from ._loops import VIRTUAL_TIME_LOOPS

pytestmark = pytest.mark.anyio

P, S = "ana", "atlas"


@pytest.fixture(params=VIRTUAL_TIME_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


def _item(id: str, text: str, kind: str = "memory") -> Evidence:
    return Evidence(id=id, kind=kind, text=text, score=0.0, arm="sparse",  # type: ignore[arg-type]
                    principal=P, scope=S, created_at=0.0)


@attrs.define(eq=False)
class DictRetriever:
    """The whole protocol over two dicts: memories by id, and People's beliefs."""

    memories: dict[str, str]
    beliefs: dict[str, dict[str, str]] = attrs.Factory(dict)
    searches: int = 0

    def searchable(self, prepared: PreparedRecall) -> bool:
        return bool(prepared.query.text.split())

    async def named_people(self, prepared: PreparedRecall) -> tuple[str, ...]:
        text = prepared.query.text.casefold()
        return tuple(name for name in self.beliefs if name.casefold() in text)

    async def search(self, prepared: PreparedRecall, handle: AttemptHandle, *,
                     caps: ContextCaps, nested_beliefs: bool) -> Found:
        self.searches += 1
        words = set(prepared.query.text.casefold().split())
        found = [_item(i, t) for i, t in self.memories.items() if words & set(t.split())]
        people = await self.named_people(prepared)
        if nested_beliefs and people:
            found += (await handle.nested(people)).beliefs
        return Found(evidence=found, people=people)

    async def read_beliefs(self, people: Sequence[str], handle: AttemptHandle, *,
                           principal: str, scope: str, caps: ContextCaps) -> tuple[Evidence, ...]:
        return tuple(_item(i, t, "belief") for name in people
                     for i, t in self.beliefs.get(name, {}).items())

    async def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:
        return ()

    async def revalidate(self, ids: Sequence[str], *, principal: str,
                         scope: str) -> tuple[Evidence, ...]:
        return tuple(_item(i, self.memories[i]) for i in ids if i in self.memories)


MEMORIES = {"m-cutover": "cutover is on friday", "m-deploy": "deploy window is at noon",
            "m-rounding": "rounding is half even"}
BELIEFS = {"Priya": {"b-priya": "Priya believes rounding must follow the directive"}}



def _hooks(retriever: Any, clock: ManualClock, **policy: int) -> RecallHooks:
    allowance = RecallAllowance(MemoryLedger(), policy=AllowancePolicy(**policy), clock=clock)
    return RecallHooks(allowance=allowance, preparer=QueryPreparation(QueryPlanner()),
                       retriever=retriever)


def _calls(*queries: str) -> list[ToolCall]:
    return [ToolCall(call_id=f"c{i}", arguments={"query": q}) for i, q in enumerate(queries)]


async def _usage(hooks: RecallHooks, run_id: str = "r") -> tuple[int, int, int, int]:
    usage = await hooks.allowance.ledger.usage(run_id)
    return usage.rounds, usage.reserved, usage.executed, usage.refused


async def test_a_plain_dict_retriever_runs_only_inside_slots(clock: ManualClock) -> None:
    retriever = DictRetriever(MEMORIES, BELIEFS)
    assert isinstance(retriever, Retriever)
    hooks = _hooks(retriever, clock)
    results = await hooks.dispatch(
        _calls("cutover", "deploy", "rounding", "cutover friday", "deploy noon", "half even"),
        run_id="r", scope=S, principal=P,
    )
    assert [r.slot for r in results] == [1, 2, 3, 4, None, None]  # in call order, both loops
    assert [r.refusal.reason for r in results if r.refusal] == [RefusalReason.SLOTS] * 2
    assert retriever.searches == 4  # never called without a slot
    assert "m-cutover" in {item.id for item in results[0].evidence}
    assert await _usage(hooks) == (1, 4, 4, 2)


async def test_its_nested_read_goes_back_through_the_hooks(clock: ManualClock) -> None:
    hooks = _hooks(DictRetriever(MEMORIES, BELIEFS), clock)
    (result,) = await hooks.dispatch(_calls("what does Priya say about rounding"), run_id="r",
                                     scope=S, principal=P)
    assert {item.id for item in result.evidence} == {"m-rounding", "b-priya"}
    traces = await hooks.allowance.ledger.attempts("r")
    assert [(t.slot, t.kind) for t in traces] == [(1, "deliberate"), (2, "nested")]
    # the run has 2 slots left; three calls take them first, the nested read is refused
    results = await hooks.dispatch(_calls("Priya rounding", "cutover", "deploy"), run_id="r",
                                   scope=S, principal=P)
    assert [r.status for r in results] == ["ok", "ok", "refused"]
    assert [b.part for b in results[0].bounded] == ["nested_read"]
    assert "not evidence" in results[0].content and "b-priya" not in results[0].content


@attrs.define(eq=False)
class EndlessPeople(DictRetriever):
    """Hands its nested read an endless iterable of names (``itertools.cycle`` by mistake)."""

    asked: list[tuple[str, ...]] = attrs.Factory(list)

    async def search(self, prepared: PreparedRecall, handle: AttemptHandle, *,
                     caps: ContextCaps, nested_beliefs: bool) -> Found:
        read = await handle.nested(itertools.cycle(["Priya", 7]))  # type: ignore[arg-type]
        return Found(evidence=[_item("m-cutover", self.memories["m-cutover"]), *read.beliefs])

    async def read_beliefs(self, people: Sequence[str], handle: AttemptHandle, *,
                           principal: str, scope: str, caps: ContextCaps) -> tuple[Evidence, ...]:
        self.asked.append(tuple(people))
        return await super().read_beliefs(people, handle, principal=principal, scope=scope,
                                          caps=caps)


async def test_a_nested_read_reads_the_first_names_of_an_endless_iterable(
    clock: ManualClock,
) -> None:
    """As of a search's own People, only the first ``caps.examined`` names are read (the
    strings among them): an endless iterable costs what a long one does."""
    retriever = EndlessPeople(MEMORIES, BELIEFS)
    hooks = _hooks(retriever, clock)
    with anyio.fail_after(30):  # a guard only: without the cap this never returns
        (result,) = await hooks.dispatch(_calls("cutover Priya"), run_id="r", scope=S,
                                         principal=P)
    assert result.status == "ok" and "b-priya" in {item.id for item in result.evidence}
    (asked,) = retriever.asked
    assert asked == ("Priya",) * (ContextCaps().examined // 2)


async def test_the_deadline_cuts_a_retriever_that_ignores_its_handle(clock: ManualClock) -> None:
    cancelled: list[str] = []

    class Hanging(DictRetriever):
        async def search(self, prepared: PreparedRecall, handle: AttemptHandle, *,
                         caps: ContextCaps, nested_beliefs: bool) -> Found:
            async def child() -> None:
                try:
                    await anyio.sleep_forever()
                finally:
                    cancelled.append("child")

            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
                await anyio.sleep_forever()  # never looks at the handle or the clock
            raise AssertionError("unreachable")

    hooks = _hooks(DictRetriever(MEMORIES), clock)
    await hooks.dispatch(_calls("cutover"), run_id="r", scope=S, principal=P)
    clock.advance(9.99)  # 10 ms of the run's original deadline are left
    hooks.retriever = Hanging(MEMORIES)
    (result,) = await hooks.dispatch(_calls("deploy"), run_id="r", scope=S, principal=P)
    assert result.refusal is not None and result.refusal.reason is RefusalReason.DEADLINE
    assert cancelled == ["child"]
    traces = await hooks.allowance.ledger.attempts("r")
    assert [t.outcome for t in traces] == [AttemptOutcome.OK, AttemptOutcome.DEADLINE]


async def test_a_handle_kept_past_its_attempt_refuses(clock: ManualClock) -> None:
    kept: list[AttemptHandle] = []
    late: list[object] = []
    released = anyio.Event()

    async def leaked(handle: AttemptHandle) -> None:
        await released.wait()
        late.append(current_permit())
        late.append(handle.seconds_left())
        with pytest.raises(RecallBudgetExceeded) as caught:
            handle.source_read()
        late.append(caught.value.reason)
        read = await handle.nested(["Priya"])
        late.append(read.refusal.reason if read.refusal else read.beliefs)

    async with anyio.create_task_group() as outer:

        class Keeper(DictRetriever):
            async def search(self, prepared: PreparedRecall, handle: AttemptHandle, *,
                             caps: ContextCaps, nested_beliefs: bool) -> Found:
                kept.append(handle)
                outer.start_soon(leaked, handle)  # a task that outlives the attempt
                return Found(evidence=())

        hooks = _hooks(Keeper(MEMORIES, BELIEFS), clock, max_searches=8)
        with hooks.bind_run():
            await hooks.dispatch(_calls("cutover"), run_id="r", scope=S, principal=P)
        assert kept[0].ended and kept[0].seconds_left() == 0.0
        released.set()
    assert late == [None, 0.0, RefusalReason.CLOSED, RefusalReason.CLOSED]
    assert await _usage(hooks) == (1, 1, 1, 0)  # the leaked calls took nothing


async def test_a_nested_read_entered_as_its_search_returns_is_closed_not_run(
    clock: ManualClock,
) -> None:
    # A retriever that starts its nested read in a task and returns without awaiting it: the
    # read was entered while the attempt ran, and waits for the round's calls to have their
    # slots; by then its attempt has ended, so it is refused (closed): no slot, no read.
    read: list[object] = []
    beliefs_read: list[int] = []
    settled = anyio.Event()

    async with anyio.create_task_group() as outer:

        class Hasty(DictRetriever):
            async def search(self, prepared: PreparedRecall, handle: AttemptHandle, *,
                             caps: ContextCaps, nested_beliefs: bool) -> Found:
                if "priya" not in prepared.query.text.casefold():
                    await settled.wait()  # the sibling keeps the round open meanwhile
                    return Found(evidence=())
                entered = anyio.Event()

                def people() -> Any:
                    entered.set()  # read while nested() runs, before it waits
                    yield "Priya"

                async def reader() -> None:
                    outcome = await handle.nested(people())
                    read.append(outcome.refusal.reason if outcome.refusal else outcome.slot)
                    settled.set()

                outer.start_soon(reader)
                await entered.wait()
                return Found(evidence=(), people=("Priya",))

            async def read_beliefs(self, people: Sequence[str], handle: AttemptHandle, *,
                                   principal: str, scope: str,
                                   caps: ContextCaps) -> tuple[Evidence, ...]:
                beliefs_read.append(handle.slot)
                return ()

        hooks = _hooks(Hasty(MEMORIES, BELIEFS), clock)
        await hooks.dispatch(_calls("what does Priya think", "deploy window"), run_id="r",
                             scope=S, principal=P)
    assert read == [RefusalReason.CLOSED] and beliefs_read == []
    assert (await _usage(hooks))[2] == 2  # the two searches alone


async def test_a_hostile_retriever_cannot_reach_the_permit(clock: ManualClock) -> None:
    seen: list[object] = []

    class Hostile(DictRetriever):
        async def search(self, prepared: PreparedRecall, handle: AttemptHandle, *,
                         caps: ContextCaps, nested_beliefs: bool) -> Found:
            seen.append(current_permit())

            async def child() -> None:
                seen.append(current_permit())

            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
            seen.extend(
                getattr(handle, name) for name in dir(handle) if not name.startswith("_")
            )
            if not nested_beliefs:  # the automatic base: the hooks read People themselves
                return Found(evidence=())
            for attempt in (lambda: copy.copy(handle), lambda: pickle.dumps(handle)):
                with pytest.raises(InvalidArgumentTypeError):
                    attempt()
            first = await handle.nested(["Priya"])
            second = await handle.nested(["Priya"])  # one nested read per attempt
            assert first.refusal is None
            assert second.refusal is not None and second.refusal.reason is RefusalReason.SLOTS
            return Found(evidence=first.beliefs)

    hooks = _hooks(Hostile(MEMORIES, BELIEFS), clock, max_searches=8)
    with hooks.bind_run():
        (result,) = await hooks.dispatch(_calls("Priya"), run_id="r", scope=S, principal=P)
        await hooks.prepare(WorkingState("Priya"), run_id="r", scope=S, principal=P)
    assert not any(isinstance(value, Permit) for value in seen)
    assert seen[:2] == [None, None]
    assert result.status == "ok" and {i.id for i in result.evidence} == {"b-priya"}
    assert await _usage(hooks) == (2, 4, 3, 0)
    assert result.bounded == ()  # its own second nested read is its own doing


async def test_a_base_attempt_offers_no_nested_read(clock: ManualClock) -> None:
    class Greedy(DictRetriever):
        async def search(self, prepared: PreparedRecall, handle: AttemptHandle, *,
                         caps: ContextCaps, nested_beliefs: bool) -> Found:
            assert not nested_beliefs and not handle.offers_nested
            with pytest.raises(InvalidArgumentError):
                await handle.nested(["Priya"])
            return Found(evidence=(), people=("Priya",))

    hooks = _hooks(Greedy(MEMORIES, BELIEFS), clock)
    context = await hooks.prepare(WorkingState("Priya"), run_id="r", scope=S, principal=P)
    assert context.slots == (1, 2)  # base, then the hooks' own delta for the People found
    assert [i.id for i in context.evidence] == ["b-priya"]


@attrs.define(eq=False)
class HungEmbedding:
    """An embedding model that never answers until released (a worker thread stuck)."""

    release: threading.Event = attrs.Factory(threading.Event)
    name: str = "hung"
    token_limit: int = 512
    dimensions: int = 4

    def count_tokens(self, text: str) -> int:
        return 1

    def embed(self, texts: Sequence[str]) -> Any:
        self.release.wait(timeout=30)
        return np.ones((len(texts), self.dimensions), dtype=np.float32) / 2.0


async def test_a_hung_embedding_cannot_hold_the_turn(clock: ManualClock) -> None:
    hung = HungEmbedding()
    allowance = RecallAllowance(MemoryLedger(), clock=clock)
    hooks = RecallHooks(allowance=allowance, preparer=QueryPreparation(QueryPlanner(), hung),
                        retriever=DictRetriever(MEMORIES), preparation_budget_s=0.01)
    try:
        (result,) = await hooks.dispatch(_calls("cutover"), run_id="r", scope=S, principal=P)
        context = await hooks.prepare(WorkingState("deploy"), run_id="r", scope=S,
                                      principal=P)
    finally:
        hung.release.set()
    assert result.status == "ok" and "m-cutover" in {i.id for i in result.evidence}
    assert [(b.part, b.reason) for b in result.bounded] == [
        ("semantic_arm", "preparation_bound")
    ]
    assert [b.reason for b in context.bounded] == ["preparation_bound"]
    assert "not evidence" in context.render()


async def test_a_retriever_ranking_attribute_is_never_run(clock: ManualClock) -> None:
    # Only the reference retriever's own ranking policy orders beliefs among the evidence: a
    # ``ranking`` on any other retriever is its code, and would run outside its slot, with the
    # permit bound, after the attempt's deadline check. It is not read.
    read: list[object] = []

    class WithRanking(DictRetriever):
        @property
        def ranking(self) -> object:
            read.append(current_permit())
            raise ValueError("a ranking that fails")

    hooks = _hooks(WithRanking(MEMORIES, BELIEFS), clock)
    with hooks.bind_run():
        context = await hooks.prepare(WorkingState("Priya rounding"), run_id="r", scope=S,
                                      principal=P)
    assert read == []
    assert context.failure is None
    assert {item.id for item in context.evidence} >= {"b-priya", "m-rounding"}
