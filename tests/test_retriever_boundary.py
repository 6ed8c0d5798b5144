"""What crosses the hooks' boundary from a retriever. A re-read of retained evidence
(``validate_retained``, and a replayed call's evidence) is held to the context caps as a
search is: only the first ``ContextCaps.examined`` items are looked at, and each text is cut
to what the caps could render (both loops). A ``KeyboardInterrupt`` or ``SystemExit`` leaves
as itself."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from plugin import ContextCaps, Evidence, Found
from runtime_hooks import RecallConfig, ToolCall, open_hooks

pytestmark = pytest.mark.anyio

CAPS = ContextCaps(max_items=2, candidates_per_arm=2, max_bytes=64)
NOTE = Evidence(id="m1", text="the cutover is on friday")


class Sloppy:
    """A full-protocol retriever whose re-read ignores the ids it is asked for: as many good
    items as the caps examine, then ``after`` (junk, or a huge text)."""

    def __init__(self, after: Evidence | None) -> None:
        self.after = after

    def searchable(self, prepared: Any) -> bool:
        return True

    async def named_people(self, prepared: Any) -> tuple[str, ...]:
        return ()

    async def search(self, prepared: Any, handle: Any, *, caps: Any,
                     nested_beliefs: Any) -> Found:
        return Found(evidence=[NOTE])

    async def read_beliefs(self, people: Any, handle: Any, *, principal: str, scope: str,
                           caps: Any) -> tuple[()]:
        return ()

    async def corrections(self, *, principal: str, scope: str) -> tuple[()]:
        return ()

    async def revalidate(self, ids: Sequence[str], *, principal: str,
                         scope: str) -> tuple[Any, ...]:
        return (NOTE,) * CAPS.examined + (self.after,) * 1000


@pytest.mark.parametrize("after", [None, Evidence(id="m1", text="x" * 1_000_000)],
                         ids=["junk", "huge"])
async def test_a_re_read_is_held_to_the_caps(tmp_path: Path, after: Evidence | None) -> None:
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", caps=CAPS)
    async with open_hooks(config, retriever=Sloppy(after)) as hooks:
        call = ToolCall(call_id="c1", arguments={"query": "cutover date"})
        (first,) = await hooks.dispatch([call], run_id="r", scope="s", principal="p")
        assert first.status == "ok"
        (checked,) = await hooks.validate_retained(["m1"], run_id="r", scope="s", principal="p")
        assert checked.status == "valid"  # what lies past the examined items is never read
        assert checked.evidence is not None
        assert len(checked.evidence.text) <= CAPS.max_bytes + 1
        (again,) = await hooks.dispatch([call], run_id="r", scope="s", principal="p")
        assert (again.status, [e.id for e in again.evidence]) == ("ok", ["m1"])


@pytest.mark.parametrize(("backend", "how"), [
    ("trio", "raised"), ("trio", "from its own task group"), ("trio", "in a group"),
    ("asyncio", "raised"),
])
@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_a_retrievers_stop_signal_leaves_as_itself(tmp_path: Path, stop: type[BaseException],
                                                   backend: str, how: str) -> None:
    """Never contained, and not wrapped in the task group's exception group either: a host's
    ``except KeyboardInterrupt`` catches it, also when the retriever's own fan-out (a task
    group of its own) wrapped it in a group, and the loop runs on. On asyncio a stop raised
    in any task's own step stops the loop at once, so a retriever's own child tasks are
    beyond reach there; the searches recallbound runs as tasks of their own are not."""
    import anyio

    from plugin import SimpleRetriever, WorkingState

    async def fetch_shard() -> None:
        raise stop

    async def search(request: Any) -> list[Evidence]:
        if "boom" in request.text:
            if how == "raised":
                raise stop
            if how == "in a group":
                async with anyio.create_task_group() as group:  # two shards: always a group
                    group.start_soon(fetch_shard)
                    group.start_soon(fetch_shard)
            async with anyio.create_task_group() as group:
                group.start_soon(fetch_shard)
        return [NOTE]

    async def main() -> list[str]:
        caught = []
        config = RecallConfig(ledger_path=tmp_path / "ledger.db")
        async with open_hooks(config, retriever=SimpleRetriever(search)) as hooks:
            calls = [ToolCall(call_id="c1", arguments={"query": "boom now"}),
                     ToolCall(call_id="c2", arguments={"query": "cutover"})]
            try:
                await hooks.dispatch(calls, run_id="r", scope="s", principal="p")
            except stop:
                caught.append("dispatch")
            try:
                await hooks.prepare(WorkingState("boom again"), run_id="r2", scope="s",
                                    principal="p")
            except stop:
                caught.append("prepare")
        return caught

    assert anyio.run(main, backend=backend) == ["dispatch", "prepare"]
