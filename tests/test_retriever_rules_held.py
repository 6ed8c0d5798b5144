"""Rules of the retriever boundary and of rendering that no other test held on its own."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest

from plugin import (
    ContextCaps,
    Evidence,
    ManualClock,
    QueryPlanner,
    QueryPreparation,
    RecallAllowance,
    SearchRequest,
    SimpleRetriever,
)
from plugin.control.wording import left_out
from plugin.memory.enforce import admit
from plugin.memory.rendering import render
from plugin.memory.simple import LAZY_CORRECTIONS
from runtime_hooks import RecallHooks, ToolCall

from ._fakes import MemoryLedger

CAPS = ContextCaps(max_items=2, candidates_per_arm=2, max_bytes=64)


def test_admitted_text_is_cut_to_the_byte_cap_before_anything_reads_it() -> None:
    huge = Evidence(id="m-huge", text="cutover " * 100_000)
    small = Evidence(id="m-small", text="cutover")
    kept, dropped = admit([huge, small], principal="p", scope="s", run_id="r", caps=CAPS)
    assert dropped == 0
    assert [item.id for item in kept] == ["m-huge", "m-small"]
    assert len(kept[0].text) == CAPS.max_bytes + 1
    assert kept[1].text == "cutover"


def _pair_totalling(total: int) -> list[Evidence]:
    """Two items whose rendered lines, with their separator, take ``total`` bytes."""
    first = Evidence(id="a", text="alpha")
    head = len(render([first], ContextCaps(max_bytes=4096)).text.encode())
    prefix = len(render([Evidence(id="b", text="")], ContextCaps(max_bytes=4096)).text.encode())
    second = Evidence(id="b", text="x" * (total - head - 1 - prefix))
    return [first, second]


def test_rendered_lines_never_exceed_the_byte_cap_by_one() -> None:
    caps = ContextCaps(max_items=8, max_bytes=60)
    exact = render(_pair_totalling(60), caps)
    assert [item.id for item in exact.items] == ["a", "b"]
    assert len(exact.text.encode()) == 60 and exact.omitted == 0
    over = render(_pair_totalling(61), caps)
    assert [item.id for item in over.items] == ["a"]
    assert over.omitted == 1


def test_an_item_too_large_for_the_cap_does_not_keep_later_ones_out() -> None:
    caps = ContextCaps(max_items=8, max_bytes=80)
    items = [Evidence(id="a", text="alpha"), Evidence(id="big", text="y" * 500),
             Evidence(id="c", text="gamma")]
    rendered = render(items, caps)
    assert [item.id for item in rendered.items] == ["a", "c"]
    assert rendered.omitted == 1
    assert rendered.text.endswith(left_out(1, "item"))


@pytest.mark.anyio
@pytest.mark.parametrize("lazy", [False, True], ids=["list", "generator"])
async def test_a_lazy_result_counts_what_it_left_out_like_a_list(
    clock: ManualClock, lazy: bool
) -> None:
    caps = ContextCaps()
    items = [Evidence(id=f"m{i}", text=f"cutover note {i}") for i in range(caps.examined + 1)]

    async def search(request: SearchRequest) -> Iterable[Evidence]:
        return (item for item in items) if lazy else list(items)

    hooks = RecallHooks(
        allowance=RecallAllowance(MemoryLedger(), clock=clock),
        preparer=QueryPreparation(QueryPlanner()), retriever=SimpleRetriever(search), caps=caps)
    (result,) = await hooks.dispatch([ToolCall(call_id="c1", arguments={"query": "cutover"})],
                                     run_id="r", scope="s", principal="p")
    assert result.status == "ok"
    assert len(result.evidence) == caps.max_items
    assert result.omitted + len(result.evidence) == len(items)


@pytest.mark.anyio
async def test_a_long_lazy_corrections_result_is_read_only_up_to_its_bound() -> None:
    pulled = 0

    def many() -> Iterator[Evidence]:  # as good as endless: never read to its end
        nonlocal pulled
        for _ in range(50 * LAZY_CORRECTIONS):
            pulled += 1
            yield Evidence(id=f"c{pulled}", text="the cutover moved", kind="correction")

    async def search(request: SearchRequest) -> list[Evidence]:
        return []

    async def corrections(*, principal: str, scope: str) -> Iterator[Evidence]:
        return many()

    retriever = SimpleRetriever(search, corrections=corrections)
    found = await retriever.corrections(principal="p", scope="s")
    assert len(found) == LAZY_CORRECTIONS
    assert pulled == LAZY_CORRECTIONS
