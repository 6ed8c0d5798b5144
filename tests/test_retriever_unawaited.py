"""A retriever function that returns unawaited coroutines as its items (an ``await`` left out
inside a list comprehension): the call fails as bad evidence and Python never warns later,
after the host's run, that a coroutine was never awaited."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import pytest

from plugin import Evidence, ManualClock, SearchRequest, SimpleRetriever
from runtime_hooks import ToolCall
from runtime_hooks.bootstrap import RecallConfig, open_hooks

pytestmark = pytest.mark.anyio

P, S = "mara", "notes"


async def _fetch(evidence_id: str) -> Evidence:
    return Evidence(id=evidence_id, text="the cutover is on friday")


async def test_unawaited_items_fail_the_call_and_are_closed(
    tmp_path: Path, clock: ManualClock
) -> None:
    async def search(request: SearchRequest) -> list[Evidence]:
        return [_fetch(i) for i in ("m1", "m2")]  # type: ignore[misc]

    config = RecallConfig(ledger_path=tmp_path / "ledger.db")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with open_hooks(config, clock=clock, retriever=SimpleRetriever(search)) as hooks:
            (result,) = await hooks.dispatch(
                [ToolCall(call_id="c1", arguments={"query": "cutover date"})],
                run_id="r",
                scope=S,
                principal=P,
            )
        gc.collect()
    assert result.status == "failed", result.as_dict()
    assert result.as_dict()["failure"] == "bad_evidence"
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
