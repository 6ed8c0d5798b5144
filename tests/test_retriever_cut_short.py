"""A user's own full retriever: what the allowance cuts short anywhere in an attempt is said
to the model in the bounded wording, and nothing late is shown (both loops). Source reads past
the fallbacks inside a nested or a delta belief read are said as in the search itself;
corrections that answer past the preparation budget are left out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from plugin import (
    AllowancePolicy,
    QueryPlanner,
    QueryPreparation,
    RecallAllowance,
    RecallBudgetExceeded,
    SystemClock,
    WorkingState,
)
from plugin.memory.enforce import Found
from plugin.memory.store import Evidence
from runtime_hooks import RecallHooks
from runtime_hooks.hooks import ToolCall

from ._fakes import MemoryLedger

pytestmark = pytest.mark.anyio

P, S = "ana", "atlas"


def _item(id: str, text: str = "cutover is on friday", kind: str = "memory") -> Evidence:
    return Evidence(id=id, text=text, kind=kind)  # type: ignore[arg-type]


class Base:
    """The whole protocol, answering plainly."""

    def searchable(self, prepared: Any) -> bool:
        return True

    async def named_people(self, prepared: Any) -> tuple[str, ...]:
        return ()

    async def search(self, prepared: Any, handle: Any, *, caps: Any,
                     nested_beliefs: bool) -> Found:
        return Found(evidence=[_item("m1")])

    async def read_beliefs(self, people: Sequence[str], handle: Any, *, principal: str,
                           scope: str, caps: Any) -> tuple[Evidence, ...]:
        return ()

    async def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:
        return ()

    async def revalidate(self, ids: Sequence[str], *, principal: str,
                         scope: str) -> tuple[Evidence, ...]:
        return ()


def _hooks(retriever: Any, budget_s: float = 2.0) -> RecallHooks:
    allowance = RecallAllowance(MemoryLedger(), policy=AllowancePolicy(), clock=SystemClock())
    return RecallHooks(allowance=allowance, preparer=QueryPreparation(QueryPlanner()),
                       retriever=retriever, preparation_budget_s=budget_s)


def _three_source_reads(handle: Any) -> None:
    refused = 0
    for _ in range(3):  # source_read_fallbacks=2: the third is refused
        try:
            handle.source_read()
        except RecallBudgetExceeded:
            refused += 1
    assert refused == 1


class BlockingCorrections(Base):
    async def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:
        time.sleep(0.5)  # a synchronous driver: no cancel scope reaches it
        return (_item("c-late", "LATE CORRECTION", kind="correction"),)


class SwallowingCorrections(Base):
    async def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            pass  # the bound's cancellation swallowed: it answers late
        return (_item("c-late", "LATE CORRECTION", kind="correction"),)


@pytest.mark.parametrize("retriever", [BlockingCorrections, SwallowingCorrections])
async def test_corrections_answered_past_the_preparation_budget_are_left_out(
    anyio_backend: object, retriever: type[Base]
) -> None:
    hooks = _hooks(retriever(), budget_s=0.2)
    context = await hooks.prepare(WorkingState("cutover"), run_id="r", scope=S, principal=P)
    assert context.corrections == () and "LATE CORRECTION" not in context.render()


class NestedSourceReads(Base):
    async def named_people(self, prepared: Any) -> tuple[str, ...]:
        return ("Priya",)

    async def search(self, prepared: Any, handle: Any, *, caps: Any,
                     nested_beliefs: bool) -> Found:
        read = await handle.nested(["Priya"])
        return Found(evidence=list(read.beliefs))

    async def read_beliefs(self, people: Sequence[str], handle: Any, *, principal: str,
                           scope: str, caps: Any) -> tuple[Evidence, ...]:
        _three_source_reads(handle)
        return ()


async def test_source_reads_cut_in_a_nested_read_are_said(anyio_backend: object) -> None:
    hooks = _hooks(NestedSourceReads())
    (result,) = await hooks.dispatch([ToolCall(call_id="c0", arguments={"query": "Priya"})],
                                     run_id="r", scope=S, principal=P)
    assert [part.part for part in result.bounded] == ["source_read"]
    assert "No matching memory was found" not in result.content
    assert "bounded" in result.content


class DeltaSourceReads(Base):
    async def search(self, prepared: Any, handle: Any, *, caps: Any,
                     nested_beliefs: bool) -> Found:
        return Found(evidence=[_item("m1")], people=("Priya",))

    async def read_beliefs(self, people: Sequence[str], handle: Any, *, principal: str,
                           scope: str, caps: Any) -> tuple[Evidence, ...]:
        _three_source_reads(handle)
        return (_item("b1", "Priya believes x", kind="belief"),)


async def test_source_reads_cut_in_the_delta_read_are_said(anyio_backend: object) -> None:
    hooks = _hooks(DeltaSourceReads())
    context = await hooks.prepare(WorkingState("cutover"), run_id="r", scope=S, principal=P)
    assert [part.part for part in context.bounded] == ["source_read"]
    assert "bounded" in context.render()


class LooksUpPeopleItself(Base):
    """Names People for a query that mentions Priya; every search asks for a nested read
    (allowed: each deliberate search is offered one)."""

    async def named_people(self, prepared: Any) -> tuple[str, ...]:
        return ("Priya",) if "Priya" in prepared.query.text else ()

    async def search(self, prepared: Any, handle: Any, *, caps: Any,
                     nested_beliefs: bool) -> Found:
        read = await handle.nested(["Priya"])
        return Found(evidence=[_item("m-" + prepared.query.text.split()[0]), *read.beliefs])

    async def read_beliefs(self, people: Sequence[str], handle: Any, *, principal: str,
                           scope: str, caps: Any) -> tuple[Evidence, ...]:
        return (_item("b1", "Priya believes x", kind="belief"),)


async def test_the_call_that_named_people_gets_the_nested_slot_on_every_loop(
    anyio_backend: object,
) -> None:
    """Two calls and one nested slot (reserved for the call that named People): that call's
    read gets it every time, whatever order the loop runs the tasks in (trio's is random)."""
    for _ in range(30):
        allowance = RecallAllowance(MemoryLedger(), policy=AllowancePolicy(max_searches=3),
                                    clock=SystemClock())
        hooks = RecallHooks(allowance=allowance, preparer=QueryPreparation(QueryPlanner()),
                            retriever=LooksUpPeopleItself())
        calls = [ToolCall(call_id="c0", arguments={"query": "alpha Priya"}),
                 ToolCall(call_id="c1", arguments={"query": "beta"})]
        alpha, beta = await hooks.dispatch(calls, run_id="r", scope=S, principal=P)
        assert "b1" in [item.id for item in alpha.evidence] and alpha.bounded == ()
        assert [part.part for part in beta.bounded] == ["nested_read"]  # said, not hidden
