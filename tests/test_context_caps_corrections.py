"""The context caps bound corrections and evidence together, whatever the caps' size."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugin import ManualClock, WorkingState
from plugin.memory.protocol import ContextCaps
from runtime_hooks.bootstrap import RecallConfig, open_hooks

from ._hooks_env import store_of

pytestmark = pytest.mark.anyio

PRINCIPAL, SCOPE = "u1", "proj"


@pytest.mark.parametrize("max_items", [1, 2, 3, 5])
async def test_corrections_and_evidence_together_keep_max_items(
    tmp_path: Path, clock: ManualClock, max_items: int
) -> None:
    config = RecallConfig(
        ledger_path=tmp_path / "ledger.db",
        store_path=tmp_path / "memory.db",
        semantic="none",
        caps=ContextCaps(max_items=max_items),
    )
    async with open_hooks(config, clock=clock) as hooks:
        store = store_of(hooks)
        for i in range(6):
            await store.add_memory(f"m{i}", f"cutover plan {i}", principal=PRINCIPAL, scope=SCOPE)
        for i in range(3):
            await store.add_correction(
                f"c{i}", f"cutover moved to day {i}", principal=PRINCIPAL, scope=SCOPE
            )
        context = await hooks.prepare(
            WorkingState("cutover"), run_id="r", scope=SCOPE, principal=PRINCIPAL
        )
    shown = len(context.corrections) + len(context.evidence)
    assert shown <= max_items
    assert context.render().count("\n- [") + context.render().startswith("- [") == shown
    assert context.corrections_omitted == 3 - len(context.corrections)
    assert len(context.corrections) <= max_items // 2
    if context.corrections_omitted:
        assert "more correction" in context.render()
    assert "more items left out by the context cap" in context.render()
