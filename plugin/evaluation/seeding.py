"""Seeding one scenario's reference store: its memories, people, beliefs and corrections,
stamped in file order (later is newer), and the per-scenario stores the cells share.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import anyio.to_thread
import attrs

from plugin.control import (
    ManualClock,
)
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.store import MemoryRecord, MemoryStore

from .scenarios import Scenario

__all__ = ["SEED_EPOCH", "SEED_STEP_S", "WALL_EPOCH", "seed_store"]

WALL_EPOCH = 1_800_000_000.0
"""Every cell's clock starts here (wall) and at 0 (monotonic), and never moves by itself."""
SEED_EPOCH = 1_750_000_000.0
"""Memories and beliefs without ``created_at`` are stamped from here, a minute apart, in file
order (later in the file is newer)."""
SEED_STEP_S = 60.0


@attrs.define(eq=False)
class _Stores:
    """The seeded store of the current scenario, kept while its corpus is read unchanged."""

    embedding: EmbeddingAdapter
    root: Path
    _key: tuple[str, str, str] | None = None
    _store: MemoryStore | None = None
    _folder: Path | None = None

    async def for_scenario(self, scenario: Scenario, index: int) -> tuple[MemoryStore, Path]:
        # A corpus's people and beliefs are seeded under the scenario's principal and scope:
        # its store is shared only by scenarios of the same (corpus, principal, scope).
        key = ((scenario.corpus, scenario.principal, scenario.scope)
               if scenario.corpus and not scenario.own_items else None)
        if key is not None and key == self._key and self._store is not None:
            assert self._folder is not None
            return self._store, self._folder
        await self.aclose()
        folder = self.root / f"scenario-{index:04d}"
        await anyio.Path(folder).mkdir()
        clock = ManualClock(wall=WALL_EPOCH, monotonic=0.0)
        store = MemoryStore(folder / "memory.db", embedding=self.embedding, clock=clock)
        await store.__aenter__()
        self._store, self._folder = store, folder
        try:
            await seed_store(store, scenario)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise
        self._key = key
        return store, folder

    async def aclose(self) -> None:
        store, folder = self._store, self._folder
        self._store = self._folder = self._key = None
        if store is not None:
            await store.aclose()
        if folder is not None:
            await anyio.to_thread.run_sync(shutil.rmtree, folder, True)


async def seed_store(store: MemoryStore, scenario: Scenario) -> None:
    """Store the scenario's memories (foreign ones under their own principal and scope), and
    its people, beliefs and correction notices (under the scenario's principal and scope).

    Corrections without ``created_at`` are stamped like memories, from the seed epoch, a
    minute apart in file order (later is newer)."""
    await store.add_memories(
        [
            MemoryRecord(
                id=memory.id,
                text=memory.text,
                principal=memory.principal,
                scope=memory.scope,
                created_at=(
                    memory.created_at
                    if memory.created_at is not None
                    else SEED_EPOCH + index * SEED_STEP_S
                ),
                cites=memory.cites,
            )
            for index, memory in enumerate(scenario.memories)
        ]
    )
    order = 0
    for person in scenario.people:
        await store.add_person(person.name, principal=scenario.principal, scope=scenario.scope)
        for belief in person.beliefs:
            await store.add_belief(
                belief.id, person.name, belief.text,
                principal=scenario.principal, scope=scenario.scope,
                created_at=(
                    belief.created_at
                    if belief.created_at is not None
                    else SEED_EPOCH + order * SEED_STEP_S
                ),
            )
            order += 1
    for index, correction in enumerate(scenario.corrections):
        await store.add_correction(
            correction.id, correction.text, principal=scenario.principal, scope=scenario.scope,
            created_at=(
                correction.created_at
                if correction.created_at is not None
                else SEED_EPOCH + index * SEED_STEP_S
            ),
        )
