"""Corrections take at most half of the context's byte cap as the model reads them, whatever
kind a retriever gave them."""

from __future__ import annotations

import pytest

from plugin import Evidence, SimpleRetriever
from plugin.memory.protocol import ContextCaps
from plugin.memory.rendering import line_bytes
from plugin.memory.turn import correction_line, corrections_share

pytestmark = pytest.mark.anyio

P, S = "u1", "proj"


@pytest.mark.parametrize("kind", ["memory", "correction", "belief"])
@pytest.mark.parametrize("max_bytes", [40, 100, 200, 1000])
async def test_corrections_share_stays_within_half_the_bytes(kind: str, max_bytes: int) -> None:
    async def search(request: object) -> list[Evidence]:
        return []

    async def corrections(*, principal: str, scope: str) -> list[Evidence]:
        return [
            Evidence(id=f"c{i}", text="t", kind=kind, principal=P, scope=S, created_at=float(i))
            for i in range(20)
        ]

    retriever = SimpleRetriever(search, corrections=corrections)
    caps = ContextCaps(max_items=20, max_bytes=max_bytes)
    share = await corrections_share(retriever, caps, principal=P, scope=S, run_id="r")
    shown = [correction_line(c) for c in share.shown]
    used = sum(line_bytes(line) for line in shown) + max(0, len(shown) - 1)
    assert used <= max_bytes // 2
    assert share.omitted == 20 - len(share.shown)
    assert share.caps_left.max_items == 20 - len(share.shown)
