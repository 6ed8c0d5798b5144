"""A worker gives the same answer as the same retriever in process when its evidence carries
ids, arms, cited ids or principals far too long: those items are dropped and counted, the
call stands (not a failed call because the answer outgrew the pipe's cap)."""

from __future__ import annotations

import pytest

from plugin import ManualClock

from . import _process_edge_factories as factories
from ._hooks_env import each_way, search_calls

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_huge_names_are_dropped_and_counted_through_a_worker_as_in_process(
    clock: ManualClock,
) -> None:
    answers = []
    async for hooks in each_way(factories.huge_names, clock):
        (result,) = await hooks.dispatch(search_calls("anything"), run_id="r",
                                         scope="atlas", principal="ana")
        answers.append((result.status, result.failure, [e.id for e in result.evidence],
                        result.dropped, result.omitted >= 1))
    assert answers[0] == ("ok", None, ["m-good"], 79, True)  # 80 examined, 2 left out
    assert answers[1] == answers[0]  # the worker sends 81: it says that more were left out
