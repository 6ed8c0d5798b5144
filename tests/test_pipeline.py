"""The search pipeline: one attempt's stages inside the slot the hooks took, on both loops."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from plugin import (
    AttemptKind,
    ManualClock,
    QueryPlanner,
    QueryPreparation,
    RecallAllowance,
    RoundKind,
    SqliteLedger,
    WorkingState,
    compose_baseline,
    compose_task_context,
)
from plugin.memory import ContextCaps, MemoryRecord, MemoryRetriever, MemoryStore
from plugin.memory.enforce import search_attempt
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.pipeline import fuse, render
from plugin.memory.preparation import PreparedRecall, SemanticPreparation, WithheldReason
from plugin.memory.store import Evidence

pytestmark = pytest.mark.anyio

P, S = "ana", "atlas"



@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[MemoryStore, RecallAllowance]]:
    clock = ManualClock()
    async with SqliteLedger(tmp_path / "l.db") as ledger, MemoryStore(
        tmp_path / "m.db", embedding=HashingEmbedding(), clock=clock
    ) as store:
        yield store, RecallAllowance(ledger, clock=clock)


def _prepared(query_text: str, recent_text: str | None = None) -> PreparedRecall:
    state = WorkingState(query_text)
    query = compose_task_context(state, scope=S, principal=P)
    recent = compose_baseline(WorkingState(recent_text or query_text), scope=S, principal=P)
    semantic = SemanticPreparation(fingerprint=query.fingerprint,
                                   withheld_reason=WithheldReason.NO_ADAPTER)
    return PreparedRecall(query=query, recent_query=recent, semantic=semantic)


async def test_source_recovery_is_bounded_inside_the_attempt(
    env: tuple[MemoryStore, RecallAllowance],
) -> None:
    store, allowance = env
    for i in range(4):
        await store.add_source(f"s{i}", f"source {i} of the backfill", principal=P, scope=S)
    await store.add_memory("m", "backfill plan", principal=P, scope=S,
                           cites=["s0", "s1", "s2", "s3"])
    retriever = MemoryRetriever(store)
    async with allowance.round("r", RoundKind.DELIBERATE, slots=1) as permit:
        attempted = await search_attempt(permit, retriever, _prepared("backfill plan"),
                                         kind=AttemptKind.DELIBERATE, caps=ContextCaps(),
                                         nested_beliefs=False)
        outcome = attempted.found
        assert permit.remaining == 0  # one slot for the attempt, none for the reads
    sources = [item.id for item in outcome.evidence if item.kind == "source"]
    assert sources == ["s0", "s1"]  # source_read_fallbacks = 2
    assert "source recovery stopped: source_reads" in outcome.notes
    assert [(b.part, b.reason) for b in attempted.bounded] == [("source_read", "source_reads")]


async def test_recent_arm_keeps_the_frozen_baseline_query(
    env: tuple[MemoryStore, RecallAllowance],
) -> None:
    store, allowance = env
    await store.add_memories([
        MemoryRecord(id="old-plan", text="migration plan", principal=P, scope=S, created_at=1.0),
        MemoryRecord(id="new-lunch", text="lunch order", principal=P, scope=S, created_at=2.0),
    ])
    recent_only = MemoryRetriever(store, arms={"recent"})
    prepared = _prepared("lunch order", recent_text="migration plan")
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        outcome = (await search_attempt(permit, recent_only, prepared, kind=AttemptKind.BASE,
                                        caps=ContextCaps(), nested_beliefs=False)).found
    assert [item.id for item in outcome.evidence] == ["old-plan"]
    assert outcome.arms == ("recent",)


async def test_token_limit_withholds_semantic_but_sparse_still_runs(
    env: tuple[MemoryStore, RecallAllowance],
) -> None:
    store, allowance = env
    await store.add_memory("m", "cutover date after quarter close", principal=P, scope=S)
    preparation = QueryPreparation(QueryPlanner(), HashingEmbedding(token_limit=3))
    prepared = await preparation.prepare(
        WorkingState("when is the cutover date after the quarter close"), scope=S, principal=P
    )
    assert prepared.semantic.withheld_reason is WithheldReason.TOKEN_LIMIT
    async with allowance.round("r", RoundKind.AUTOMATIC) as permit:
        outcome = (await search_attempt(
            permit, MemoryRetriever(store), prepared, kind=AttemptKind.BASE, caps=ContextCaps(),
            nested_beliefs=False,
        )).found
    assert "sparse" in outcome.arms and "semantic" not in outcome.arms
    assert "semantic arm withheld: token_limit" in outcome.notes
    assert [item.id for item in outcome.evidence] == ["m"]


def _evidence(i: int, text: str = "x") -> Evidence:
    return Evidence(id=f"e{i}", kind="memory", text=text, score=0.0, arm="sparse",
                    principal=P, scope=S, created_at=0.0)


def test_rendering_respects_caps_and_says_what_it_left_out() -> None:
    items = [_evidence(i, "word " * 10) for i in range(6)]
    by_items = render(items, ContextCaps(max_items=2))
    assert [e.id for e in by_items.items] == ["e0", "e1"]
    assert by_items.omitted == 4
    assert by_items.text.endswith("\n(4 more items left out by the context cap; memory recall "
                                  "was bounded: this is not evidence that they are absent)")
    by_bytes = render(items, ContextCaps(max_bytes=130))
    assert len(by_bytes.items) == 2
    rendered_evidence = by_bytes.text.rsplit("\n", 1)[0]
    assert len(rendered_evidence.encode()) <= 130
    assert render(items[:1], ContextCaps()).omitted == 0


def test_fusion_is_deterministic_on_ties() -> None:
    a, b, c = _evidence(1), _evidence(2), _evidence(3)
    assert [e.id for e in fuse([[b, a], [a, b]])] == ["e1", "e2"]  # equal scores: by id
    assert [e.id for e in fuse([[c], [a, c]])] == ["e3", "e1"]  # found by both arms first


def test_arms_must_be_known() -> None:
    with pytest.raises(ValueError, match="arms"):
        MemoryRetriever(object(), arms={"sparse", "telepathy"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="arms"):
        MemoryRetriever(object(), arms=set())  # type: ignore[arg-type]


async def test_ledger_is_wal_with_full_sync(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    async with SqliteLedger(path) as ledger:
        conn = ledger._connection()
        assert (await conn.fetchall("PRAGMA synchronous"))[0][0] == 2  # FULL
        other = sqlite3.connect(path)
        try:
            assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        finally:
            other.close()
