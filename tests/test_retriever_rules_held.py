"""Rules of the retriever boundary and of rendering that no other test held on its own."""

from __future__ import annotations

from plugin import (
    ContextCaps,
    Evidence,
)
from plugin.memory.enforce import admit

CAPS = ContextCaps(max_items=2, candidates_per_arm=2, max_bytes=64)


def test_admitted_text_is_cut_to_the_byte_cap_before_anything_reads_it() -> None:
    huge = Evidence(id="m-huge", text="cutover " * 100_000)
    small = Evidence(id="m-small", text="cutover")
    kept, dropped = admit([huge, small], principal="p", scope="s", run_id="r", caps=CAPS)
    assert dropped == 0
    assert [item.id for item in kept] == ["m-huge", "m-small"]
    assert len(kept[0].text) == CAPS.max_bytes + 1
    assert kept[1].text == "cutover"
