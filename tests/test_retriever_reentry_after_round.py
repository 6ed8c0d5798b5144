"""A call sent again after its round ended, from a task its retriever started inside the round
(that task copied the round's context): the round is over, so the call is answered from its
record, as any replay is, never ``in_flight``."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from plugin import Evidence, ManualClock, SearchRequest, SimpleRetriever
from runtime_hooks import RecallHooks, ToolCall, ToolResult
from runtime_hooks.bootstrap import RecallConfig, open_hooks

pytestmark = pytest.mark.anyio

P, S = "mara", "notes"
ITEM = Evidence(id="m1", text="the cutover is on friday")


async def test_a_call_sent_again_after_its_round_from_a_task_started_inside_is_replayed(
    tmp_path: Path, clock: ManualClock
) -> None:
    call = ToolCall(call_id="c1", arguments={"query": "cutover"})
    seen: list[RecallHooks] = []
    later: list[ToolResult] = []
    round_over = anyio.Event()
    searched: list[str] = []

    async def send_again() -> None:
        await round_over.wait()
        later.extend(await seen[0].dispatch([call], run_id="r", scope=S, principal=P))

    async with anyio.create_task_group() as outside:

        async def search(request: SearchRequest) -> list[Evidence]:
            searched.append(request.text)
            # A task of the host's started from inside the round: it copies the round's context.
            outside.start_soon(send_again)
            return [ITEM]

        async def get(evidence_id: str, *, principal: str, scope: str) -> Evidence | None:
            return ITEM if evidence_id == ITEM.id else None

        config = RecallConfig(ledger_path=tmp_path / "ledger.db")
        async with open_hooks(
            config, clock=clock, retriever=SimpleRetriever(search, get=get)
        ) as hooks:
            seen.append(hooks)
            (first,) = await hooks.dispatch([call], run_id="r", scope=S, principal=P)
            round_over.set()
            with anyio.fail_after(5):
                while not later:
                    await anyio.sleep(0)

    assert first.status == "ok", first.as_dict()
    (again,) = later
    assert again.status == "ok", again.as_dict()
    assert again.content == first.content
    assert searched == ["cutover"]
