"""A retriever that re-enters the hooks with a call its own round is running.

The same call sent again while these hooks run it waits for its outcome; sent from inside
that call's own round (a search that dispatches it again, or a sibling call of the round),
the wait could only end at the deadline, the run stalled and its searches refused. It is
answered ``in_flight`` at once instead: never searched twice, and the round goes on.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from plugin import Evidence, ManualClock, SearchRequest, SimpleRetriever
from runtime_hooks import RecallHooks, ToolCall, ToolResult
from runtime_hooks.bootstrap import RecallConfig, open_hooks

pytestmark = pytest.mark.anyio

P, S = "mara", "notes"


@pytest.mark.parametrize("again", ["c1", "c2"], ids=["itself", "its sibling"])
async def test_a_search_that_dispatches_a_call_of_its_own_round_gets_in_flight(
    tmp_path: Path, clock: ManualClock, again: str
) -> None:
    hooks_seen: list[RecallHooks] = []
    inner: list[list[ToolResult]] = []
    searched: list[str] = []
    calls = [ToolCall(call_id="c1", arguments={"query": "cutover"}),
             ToolCall(call_id="c2", arguments={"query": "freeze"})]

    async def search(request: SearchRequest) -> list[Evidence]:
        searched.append(request.text)
        if request.text == "cutover" and not inner:
            with anyio.fail_after(5):  # real time: the wait would last to the deadline
                inner.append(await hooks_seen[0].dispatch(
                    [call for call in calls if call.call_id == again],
                    run_id="r", scope=S, principal=P))
        return [Evidence(id=f"m-{request.text}", text=f"about the {request.text}")]

    config = RecallConfig(ledger_path=tmp_path / "ledger.db")
    async with open_hooks(config, clock=clock, retriever=SimpleRetriever(search)) as hooks:
        hooks_seen.append(hooks)
        results = await hooks.dispatch(calls, run_id="r", scope=S, principal=P)
        usage = await hooks.allowance.ledger.usage("r")
    assert [(r.status, r.slot) for r in results] == [("ok", 1), ("ok", 2)]
    ((answer,),) = inner
    assert (answer.call_id, answer.status, answer.failure) == (again, "failed", "in_flight")
    assert sorted(searched) == ["cutover", "freeze"]  # nothing searched twice
    assert (usage.rounds, usage.executed) == (1, 2)
