"""Bring your own retriever: SimpleRetriever, Evidence's defaults, open_hooks(retriever=...),
the protocol check at construction, the allowance's headroom, and the structure that holds it
(one bounded wording, a leaf protocol module, the deliberate round in plugin)."""

from __future__ import annotations

import ast
import gc
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from plugin import (
    AllowancePolicy,
    BudgetRefusal,
    ContextCaps,
    Evidence,
    ManualClock,
    QueryPlanner,
    QueryPreparation,
    RecallAllowance,
    RefusalReason,
    RetrieverProtocolError,
    RoundKind,
    SearchRequest,
    SimpleRetriever,
    WorkingState,
)
from plugin.control.permit import LEGACY_SLOTS
from plugin.control.wording import NOT_EVIDENCE
from plugin.errors import RetrieverFailedError
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.protocol import Bounded
from plugin.memory.recall import deliberate_round
from plugin.memory.rendering import render
from runtime_hooks import RecallHooks, ToolCall
from runtime_hooks.bootstrap import RecallConfig, open_hooks

from ._fakes import Forwarding, MemoryLedger

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
P, S = "mara", "notes"



def _config(tmp_path: Path) -> RecallConfig:
    return RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db")


# -- Evidence -------------------------------------------------------------------------------


def test_evidence_needs_only_an_id_and_a_text() -> None:
    item = Evidence(id="m1", text="the cutover is on friday")
    assert (item.kind, item.score, item.principal, item.scope, item.created_at, item.cites) == (
        "memory", 0.0, None, None, 0.0, ())
    assert Evidence(id="m1", text="x", arm="pgvector").arm == "pgvector"  # a backend's own arm


@pytest.mark.parametrize(("fields", "error", "named"), [
    ({"id": 1, "text": "x"}, TypeError, "Evidence.id"),
    ({"id": "m1", "text": None}, TypeError, "Evidence.text"),
    ({"id": "m1", "text": "x", "kind": "memory]\n\nCurrent corrections:"}, ValueError,
     "Evidence.kind"),
    ({"id": "m1", "text": "x", "principal": 7}, TypeError, "Evidence.principal"),
])
def test_malformed_evidence_is_a_typed_error_naming_the_field(
    fields: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        Evidence(**fields)


# -- SimpleRetriever through open_hooks -------------------------------------------------------


async def test_the_search_function_gets_the_request_and_the_run_sees_its_evidence(
    tmp_path: Path, clock: ManualClock
) -> None:
    requests: list[SearchRequest] = []
    seconds: list[float] = []

    async def search(request: SearchRequest) -> list[Evidence]:
        requests.append(request)
        seconds.append(request.seconds_left())
        return [Evidence(id="m1", text="the cutover is on friday", arm="my-db")]

    async with open_hooks(_config(tmp_path), clock=clock,
                          retriever=SimpleRetriever(search)) as hooks:
        context = await hooks.prepare(WorkingState("when is the cutover"), run_id="r",
                                      scope=S, principal=P)
        (result,) = await hooks.dispatch(
            [ToolCall(call_id="c1", arguments={"query": "cutover date"})],
            run_id="r", scope=S, principal=P)
    assert not (tmp_path / "memory.db").exists()  # the reference store was never opened
    assert [r.text for r in requests] == ["when is the cutover", "cutover date"]
    assert all((r.principal, r.scope, r.limit, r.embedding) == (P, S, 8, None)
               for r in requests)
    assert seconds == [10.0, 10.0]  # the run's deadline, on the injected clock
    assert [(i.id, i.principal, i.scope, i.arm) for i in context.evidence] == [
        ("m1", P, S, "my-db")]
    assert result.status == "ok" and "[memory m1] the cutover is on friday" in result.content
    assert context.slots == (1,) and result.slot == 3  # the automatic round reserved 2


async def test_the_request_carries_the_prepared_embedding(clock: ManualClock) -> None:
    seen: list[object] = []

    async def search(request: SearchRequest) -> list[Evidence]:
        seen.append(request.embedding)
        return []

    embedding = HashingEmbedding.like_wordllama()
    hooks = RecallHooks(
        allowance=RecallAllowance(MemoryLedger(), clock=clock),
        preparer=QueryPreparation(QueryPlanner(), embedding), retriever=SimpleRetriever(search))
    await hooks.dispatch([ToolCall(call_id="c1", arguments={"query": "cutover"})],
                         run_id="r", scope=S, principal=P)
    (vector,) = seen
    assert isinstance(vector, np.ndarray) and vector.shape == (embedding.dimensions,)


async def test_get_revalidates_and_without_it_retained_evidence_cannot_be_rechecked(
    clock: ManualClock
) -> None:
    store = {"m1": "the cutover is on friday"}

    async def search(request: SearchRequest) -> list[Evidence]:
        return [Evidence(id=key, text=text) for key, text in store.items()]

    async def get(evidence_id: str, *, principal: str, scope: str) -> Evidence | None:
        assert (principal, scope) == (P, S)
        text = store.get(evidence_id)
        return None if text is None else Evidence(id=evidence_id, text=text)

    async def corrections(*, principal: str, scope: str) -> list[Evidence]:
        return [Evidence(id="c1", text="the cutover moved to monday", kind="correction")]

    verdicts = []
    for retriever in (SimpleRetriever(search, get=get, corrections=corrections),
                      SimpleRetriever(search)):
        hooks = RecallHooks(allowance=RecallAllowance(MemoryLedger(), clock=clock),
                            preparer=QueryPreparation(QueryPlanner()), retriever=retriever)
        await hooks.dispatch([ToolCall(call_id="c1", arguments={"query": "cutover"})],
                             run_id="r", scope=S, principal=P)
        (checked,) = await hooks.validate_retained(["m1"], run_id="r", scope=S, principal=P)
        context = await hooks.prepare(WorkingState("cutover"), run_id="r", scope=S, principal=P)
        (again,) = await hooks.dispatch([ToolCall(call_id="c1", arguments={"query": "cutover"})],
                                        run_id="r", scope=S, principal=P)
        verdicts.append((checked.status, [c.id for c in context.corrections],
                         "No matching memory" in again.content,
                         "could not be re-read" in again.content))
    # without get= nothing can be re-read: never "gone", and a replay never "found nothing"
    assert verdicts == [("valid", ["c1"], False, False), ("failed", [], False, True)]


async def test_a_coroutine_returned_unawaited_is_a_bad_result_and_is_closed(
    clock: ManualClock,
) -> None:
    """A search, get or corrections function that returns a coroutine where its evidence
    belongs (``return backend.search(...)`` without ``await``) fails its own call, typed; the
    coroutine is closed, so no "never awaited" warning follows the host's run."""

    async def backend() -> list[Evidence]:
        return [Evidence(id="m1", text="the cutover is on friday")]

    async def search(request: SearchRequest) -> Any:
        return backend()

    async def get(evidence_id: str, *, principal: str, scope: str) -> Any:
        return backend()

    async def corrections(*, principal: str, scope: str) -> Any:
        return backend()

    retriever = SimpleRetriever(search, get=get, corrections=corrections)
    hooks = RecallHooks(allowance=RecallAllowance(MemoryLedger(), clock=clock),
                        preparer=QueryPreparation(QueryPlanner()), retriever=retriever)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (result,) = await hooks.dispatch([ToolCall(call_id="c1", arguments={"query": "x"})],
                                         run_id="r", scope=S, principal=P)
        context = await hooks.prepare(WorkingState("cutover"), run_id="r", scope=S, principal=P)
        with pytest.raises(RetrieverFailedError, match="bad_evidence"):
            await retriever.revalidate(["m1"], principal=P, scope=S)
        gc.collect()
    assert (result.status, result.failure) == ("failed", "bad_result")
    assert context.failure == "bad_result"
    assert not [w for w in caught if "never awaited" in str(w.message)]


# -- the protocol is checked at construction --------------------------------------------------


def test_a_sync_search_function_is_a_typed_error() -> None:
    def search(request: SearchRequest) -> list[Evidence]:
        return []

    with pytest.raises(RetrieverProtocolError, match="search must be an async function"):
        SimpleRetriever(search)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="get must be an async function"):
        SimpleRetriever(_async_search, get=lambda evidence_id, **_: None)


async def _async_search(request: SearchRequest) -> list[Evidence]:
    return []


class _SyncMethod(SimpleRetriever):
    def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:  # type: ignore[override]
        return ()


class _Missing:
    def searchable(self, prepared: object) -> bool:
        return True

    async def search(self, *args: object, **kwargs: object) -> None:
        return None


async def test_a_retriever_whose_async_methods_are_not_async_fails_at_construction(
    tmp_path: Path, clock: ManualClock
) -> None:
    allowance = RecallAllowance(MemoryLedger(), clock=clock)
    for retriever, named in ((_SyncMethod(_async_search), "corrections must be an async"),
                             (_Missing(), "has no named_people")):
        with pytest.raises(RetrieverProtocolError, match=named):
            RecallHooks(allowance=allowance, preparer=QueryPreparation(QueryPlanner()),
                        retriever=retriever)  # type: ignore[arg-type]
        with pytest.raises(RetrieverProtocolError, match=named):
            async with open_hooks(_config(tmp_path), clock=clock,
                                  retriever=retriever):  # type: ignore[arg-type]
                pass
    hooks = RecallHooks(allowance=allowance, preparer=QueryPreparation(QueryPlanner()),
                        retriever=SimpleRetriever(_async_search))
    with pytest.raises(RetrieverProtocolError, match="corrections"):
        hooks.retriever = _SyncMethod(_async_search)  # swapped later: checked again


async def test_a_forwarding_proxy_is_a_retriever(clock: ManualClock) -> None:
    # Since Python 3.12 isinstance() against a runtime protocol reads attributes statically,
    # so it would refuse a proxy whose methods all pass the checks.
    allowance = RecallAllowance(MemoryLedger(), clock=clock)
    proxy = Forwarding(SimpleRetriever(_async_search))
    hooks = RecallHooks(allowance=allowance, preparer=QueryPreparation(QueryPlanner()),
                        retriever=proxy)  # type: ignore[arg-type]
    assert hooks.retriever is proxy
    with pytest.raises(RetrieverProtocolError, match="has no named_people"):
        hooks.retriever = Forwarding(_Missing())  # type: ignore[assignment]


# -- the allowance's headroom ----------------------------------------------------------------


async def test_headroom_is_what_a_round_could_still_get(clock: ManualClock) -> None:
    allowance = RecallAllowance(MemoryLedger(), policy=AllowancePolicy(max_searches=4), clock=clock)
    assert await allowance.headroom("r") == 4
    async with allowance.round("r", RoundKind.DELIBERATE, slots=3):
        pass
    assert await allowance.headroom("r") == 1
    async with allowance.round("r", RoundKind.AUTOMATIC):
        pass
    assert await allowance.headroom("r") == 0  # all rounds taken
    async with allowance.round("late", RoundKind.AUTOMATIC):
        pass
    clock.advance(10.0)
    assert await allowance.headroom("late") == 0  # past the run's deadline
    assert await RecallAllowance.legacy(MemoryLedger(), clock=clock).headroom("x") == LEGACY_SLOTS


# -- structure -------------------------------------------------------------------------------


def test_every_bounded_message_ends_with_the_one_wording() -> None:
    refusal = BudgetRefusal(reason=RefusalReason.SLOTS, run_id="r", reserved=4, executed=4)
    items = [Evidence(id=f"m{i}", text="x") for i in range(3)]
    messages = [
        refusal.message,
        Bounded.of("semantic_arm", "preparation_bound", "query preparation ran out").message,
        Bounded.refused("nested_read", refusal).message,
        render(items, ContextCaps(max_items=1)).text.split("\n")[-1],
    ]
    assert all("memory recall was bounded" in m.lower() and "not evidence" in m
               for m in messages)
    assert all(m.endswith(NOT_EVIDENCE) for m in messages[:3])
    assert "not evidence" in refusal.message and "bounded" in refusal.message
    # Messages (string literals that are not docstrings) say it in one module only. The
    # search tool's description (adapters) describes a refusal; it is not one.
    sources = [*(ROOT / "plugin").rglob("*.py"), *(ROOT / "runtime_hooks").glob("*.py")]
    saying = {p.relative_to(ROOT).as_posix() for p in sources if _says_bounded(p)}
    assert saying == {"plugin/control/wording.py"}


def _says_bounded(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return any(
        isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings and "recall was bounded" in node.value.lower()
        for node in ast.walk(tree)
    )


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(("." * node.level) + node.module)
    return found


def test_the_protocol_module_is_a_leaf_and_the_demo_uses_the_abstraction() -> None:
    imported = _imports(ROOT / "plugin/memory/protocol.py")
    assert not imported & {".pipeline", ".enforce", ".recall", ".rendering", ".simple"}
    assert ".protocol" in _imports(ROOT / "plugin/memory/enforce.py")
    assert ".enforce" not in _imports(ROOT / "plugin/memory/pipeline.py")
    assert "type: ignore" not in (ROOT / "runtime_hooks/demo.py").read_text(encoding="utf-8")
    for module in ("runtime_hooks/hooks.py", "runtime_hooks/deliberate.py"):
        assert "_slots_left" not in (ROOT / module).read_text(encoding="utf-8")


async def test_the_deliberate_round_runs_from_plugin_without_the_hooks(
    clock: ManualClock
) -> None:
    async def search(request: SearchRequest) -> list[Evidence]:
        return [Evidence(id=f"m-{request.text}", text=request.text)]

    preparation = QueryPreparation(QueryPlanner())
    searches = [await preparation.prepare_search(text, scope=S, principal=P)
                for text in ("alpha", "beta", "gamma")]
    allowance = RecallAllowance(MemoryLedger(), policy=AllowancePolicy(max_searches=2),
                                clock=clock)
    recall = await deliberate_round(allowance, SimpleRetriever(search), searches, run_id="r",
                                    caps=ContextCaps())
    assert [(s.slot, [i.id for i in s.evidence]) for s in recall.searches[:2]] == [
        (1, ["m-alpha"]), (2, ["m-beta"])]
    third = recall.searches[2].refusal
    assert third is not None and third.reason is RefusalReason.SLOTS
    assert recall.refusal is None


@attrs.define
class _Counting:
    calls: list[str] = attrs.Factory(list)

    async def search(self, request: SearchRequest) -> Sequence[Evidence]:
        self.calls.append(request.text)
        return ()


async def test_a_bound_method_is_a_search_function(clock: ManualClock) -> None:
    counting = _Counting()
    hooks = RecallHooks(allowance=RecallAllowance(MemoryLedger(), clock=clock),
                        preparer=QueryPreparation(QueryPlanner()),
                        retriever=SimpleRetriever(counting.search))
    (result,) = await hooks.dispatch([ToolCall(call_id="c1", arguments={"query": "cutover"})],
                                     run_id="r", scope=S, principal=P)
    assert counting.calls == ["cutover"] and result.status == "ok"
