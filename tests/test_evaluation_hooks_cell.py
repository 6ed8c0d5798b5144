"""The evaluator's ``hooks`` cell runs exactly what the preparation hook runs."""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from plugin import QueryStrategy
from plugin.control import ManualClock, RecallAllowance, SqliteLedger
from plugin.evaluation import (
    DEFAULT_CELLS,
    HOOKS_CELLS,
    Arm,
    Cell,
    Evaluator,
    InvalidScenarioError,
    Scenario,
    hashing_embedding,
    load_scenarios,
    parse_scenarios,
    seed_store,
)
from plugin.evaluation.command import cells_for, configure
from plugin.evaluation.evaluator import WALL_EPOCH, ScenarioResult
from plugin.memory import MemoryRetriever, MemoryStore, QueryPlanner, QueryPreparation
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.hashing import HashingEmbedding
from plugin.memory.protocol import ContextCaps
from runtime_hooks import RecallHooks
from runtime_hooks.results import PreparedContext

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "scenarios.jsonl"
DEVSET = ROOT / "examples" / "devset.jsonl"
HOLD = "zebraquill"
"""A word only the hung adapter's query contains (no memory text has it)."""


def _corrected(count: int, *, request: str = "Continue the invoice backfill") -> Scenario:
    """A scenario with many relevant memories and ``count`` current corrections."""
    memories = [
        {"id": f"m{i}", "text": f"Invoice backfill step {i}: run the dry-run on staging shard {i}.",
         "principal": "u1", "scope": "proj"}
        for i in range(12)
    ]
    corrections = [
        {"id": f"c{i}", "text": f"Correction {i}: the backfill shard {i} moved to the new cluster."}
        for i in range(count)
    ]
    return Scenario.from_json({
        "id": f"corrected-{count}", "family": "continuation", "principal": "u1", "scope": "proj",
        "memories": memories, "corrections": corrections,
        "state": {"current_request": request, "objective": "Ship the invoice backfill",
                  "next_action": "Run the backfill dry-run"},
        "relevant": {"m0": 2, "m1": 2, "m2": 1},
    })


async def _admit(experiment: str) -> bool:
    return True


async def _hooks_context(
    scenario: Scenario, strategy: QueryStrategy, embedding: EmbeddingAdapter, folder: Path, *,
    budget_s: float = 2.0,
) -> tuple[PreparedContext, int, int]:
    """What the preparation hook gives for ``scenario``, wired as the bootstrap wires it, over
    a store seeded as the evaluator seeds it; and the ledger's reserved and executed."""
    clock = ManualClock(wall=WALL_EPOCH, monotonic=0.0)
    async with MemoryStore(folder / "memory.db", embedding=embedding,
                           clock=ManualClock(wall=WALL_EPOCH, monotonic=0.0)) as store, \
            SqliteLedger(":memory:") as ledger:
        await seed_store(store, scenario)
        hooks = RecallHooks(
            allowance=RecallAllowance(ledger, clock=clock),
            preparer=QueryPreparation(QueryPlanner(strategy, admission=_admit), embedding),
            retriever=MemoryRetriever(store),
            caps=ContextCaps(),
            preparation_budget_s=budget_s,
        )
        context = await hooks.prepare(scenario.state, run_id="r", scope=scenario.scope,
                                      principal=scenario.principal)
        usage = await ledger.usage("r")
    return context, usage.reserved, usage.executed


def _row(rows: Sequence[ScenarioResult], scenario: str, strategy: str, arm: str) -> ScenarioResult:
    (row,) = [r for r in rows if (r.scenario_id, r.strategy, r.arm) == (scenario, strategy, arm)]
    return row


# -- the hooks cell is the hook -----------------------------------------------------------------


async def test_the_hooks_cell_renders_what_the_preparation_hook_renders(tmp_path: Path) -> None:
    embedding = hashing_embedding()
    scenarios = [*itertools.islice(load_scenarios(EXAMPLES), 6), _corrected(7)]
    report = await Evaluator(embedding=embedding, cells=HOOKS_CELLS).evaluate(
        scenarios, workdir=tmp_path)
    assert len(report.rows) == len(scenarios) * 2
    compared = 0
    for index, scenario in enumerate(scenarios):
        for strategy in (QueryStrategy.BASELINE, QueryStrategy.TASK_CONTEXT):
            folder = tmp_path / f"hooks-{index}-{strategy.value}"
            folder.mkdir()
            context, reserved, executed = await _hooks_context(
                scenario, strategy, embedding, folder)
            row = _row(report.rows, scenario.id, strategy.value, "hooks")
            assert row.retrieved == tuple(item.id for item in context.evidence), scenario.id
            assert row.ranked == row.retrieved  # judged on what the model sees
            assert row.corrections == tuple(item.id for item in context.corrections)
            assert row.query == context.query.text
            assert (row.reserved, row.executed) == (reserved, executed)
            assert row.bounded == (context.notice is not None)
            compared += bool(row.retrieved)
    assert compared >= 8  # the comparison is about evidence, not empty rounds
    last = _row(report.rows, "corrected-7", "task_context", "hooks")
    assert last.corrections == ("c6", "c5", "c4", "c3")  # newest first, half the items


async def test_corrections_take_their_share_of_the_caps_in_the_hooks_cell(
    tmp_path: Path,
) -> None:
    cells = (Cell("task_context", "fused"), Cell("task_context", "hooks"))
    report = await Evaluator(embedding=hashing_embedding(), cells=cells).evaluate(
        [_corrected(6), _corrected(0)], workdir=tmp_path)
    k = report.k
    fused = _row(report.rows, "corrected-6", "task_context", "fused")
    hooks = _row(report.rows, "corrected-6", "task_context", "hooks")
    assert len(fused.retrieved) == k and fused.corrections == ()
    assert len(hooks.corrections) == k // 2
    assert hooks.retrieved == fused.retrieved[: k - k // 2]  # the same ranking, fewer items
    assert (hooks.reserved, hooks.executed) == (fused.reserved, fused.executed)
    # without corrections the hooks cell is the fused cell
    plain = _row(report.rows, "corrected-0", "task_context", "hooks")
    assert plain.retrieved == _row(report.rows, "corrected-0", "task_context", "fused").retrieved
    assert plain.corrections == ()


# -- the preparation bound ----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class HoldingEmbedding(HashingEmbedding):
    """Hashing, except that a text with :data:`HOLD` blocks until released (a stuck model)."""

    release: threading.Event = attrs.field(factory=threading.Event, eq=False)
    held: list[str] = attrs.field(factory=list, eq=False)

    def embed(self, texts: Sequence[str]) -> Any:
        if any(HOLD in text for text in texts):
            self.held.append(texts[0])
            self.release.wait(timeout=30)
        return super().embed(texts)


async def test_a_preparation_bound_that_fires_withholds_semantic_in_both(tmp_path: Path) -> None:
    holding = HoldingEmbedding(dimensions=256, token_limit=256)
    scenario = _corrected(2, request=f"Continue the invoice backfill {HOLD}")
    cells = (Cell("task_context", "hooks"),)
    # The bound must fire while the model holds the query, never while the query is planned
    # (a loaded machine can take 10 ms to plan it): the model holds it until released.
    try:
        report = await Evaluator(embedding=holding, cells=cells,
                                 preparation_budget_s=0.5).evaluate([scenario], workdir=tmp_path)
        context, reserved, executed = await _hooks_context(
            scenario, QueryStrategy.TASK_CONTEXT, holding, tmp_path, budget_s=0.5)
    finally:
        holding.release.set()
    # At most the hooks cell's call and the hook's: on a loaded machine the bound can fire before
    # a worker thread picks a call up, and then the model is never called at all.
    assert len(holding.held) <= 2
    hooks = _row(report.rows, scenario.id, "task_context", "hooks")
    assert hooks.semantic_withheld == "preparation_bound"
    assert [(b.part, b.reason) for b in context.bounded] == [("semantic_arm", "preparation_bound")]
    assert hooks.retrieved == tuple(item.id for item in context.evidence)
    assert hooks.retrieved  # the sparse arm still ran
    assert (hooks.reserved, hooks.executed) == (reserved, executed)


# -- the scenario format and the evaluator's options ----------------------------------------------


def _line(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": "s1", "family": "continuation", "principal": "u1", "scope": "proj",
        "memories": [{"id": "m1", "text": "Run the dry-run.", "principal": "u1", "scope": "proj"}],
        "state": {"current_request": "Continue"}, "relevant": {"m1": 2},
    }
    data.update(changes)
    return data


def test_corrections_parse_with_their_optional_time() -> None:
    scenario = Scenario.from_json(json.dumps(_line(corrections=[
        {"id": "c1", "text": "The dry-run moved.", "created_at": 1_700_000_000},
        {"id": "c2", "text": "Use staging."},
    ])))
    assert [(c.id, c.text, c.created_at) for c in scenario.corrections] == [
        ("c1", "The dry-run moved.", 1_700_000_000.0), ("c2", "Use staging.", None)]
    assert Scenario.from_json(json.dumps(_line())).corrections == ()


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"corrections": {"id": "c1"}}, "corrections", "must be an array, got an object"),
        ({"corrections": [{"id": "c1"}]}, "corrections[0]", "missing required key(s) 'text'"),
        ({"corrections": [{"id": "c1", "text": "x", "by": "u"}]}, "corrections[0]",
         "unknown key(s) 'by'; expected id, text, created_at"),
        ({"corrections": [{"id": " ", "text": "x"}]}, "corrections[0].id", "must not be empty"),
        ({"corrections": [{"id": "m1", "text": "x"}]}, "corrections[0].id",
         "id 'm1' is already used by memories[0]"),
        ({"corrections": [{"id": "c1", "text": "x"}, {"id": "c1", "text": "y"}]},
         "corrections[1].id", "id 'c1' is already used by corrections[0]"),
        ({"corrections": [{"id": "c1", "text": "x"}], "relevant": {"m1": 2, "c1": 1}},
         "relevant.c1", "no memory or belief has id 'c1'"),
        ({"corrections": [{"id": "c1", "text": "x"}], "must_not": ["c1"]},
         "must_not[0]", "no memory or belief has id 'c1'"),
        ({"corrections": [{"id": "c1", "text": "x", "created_at": "now"}]},
         "corrections[0].created_at", "must be a number, got a string"),
    ],
)
def test_malformed_corrections_are_rejected_naming_the_field(
    changes: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(InvalidScenarioError) as caught:
        Scenario.from_json(json.dumps(_line(**changes)), line=3)
    assert (caught.value.line, caught.value.field, caught.value.reason) == (3, field, reason)


def test_a_corpus_scenario_with_corrections_gets_its_own_store() -> None:
    corpus = json.dumps({"corpus": "c", "memories": _line()["memories"]})
    plain = json.dumps({k: v for k, v in _line(corpus="c").items() if k != "memories"})
    corrected = json.dumps({**json.loads(plain), "id": "s2",
                            "corrections": [{"id": "c1", "text": "x"}]})
    first, second = parse_scenarios("\n".join([corpus, plain, corrected]))
    assert (first.own_items, second.own_items) == (False, True)


def test_the_hooks_arm_is_named_and_opt_in() -> None:
    assert Arm("hooks") is Arm.HOOKS and Arm.HOOKS.arms == Arm.FUSED.arms
    assert [c.name for c in HOOKS_CELLS] == ["baseline/hooks", "task_context/hooks"]
    assert all(cell.arm is not Arm.HOOKS for cell in Evaluator(
        embedding=hashing_embedding()).cells)
    cases: list[tuple[Any, type[Exception]]] = [
        (0, ValueError), (float("nan"), ValueError), ("2", TypeError), (True, TypeError)]
    for bad, error in cases:
        with pytest.raises(error, match=r"^Evaluator\.preparation_budget_s must be "):
            Evaluator(embedding=hashing_embedding(), preparation_budget_s=bad)


# -- the command's --arms ------------------------------------------------------------------------


def test_the_command_evaluates_the_arms_it_is_given(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "plugin.evaluation", "--scenarios", str(DEVSET),
         "--out", str(out), "--semantic", "hashing", "--limit", "3", "--arms", "fused,hooks",
         "--determinism", "2", "--resamples", "50", "--quiet"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert list(report["results"]) == ["fused", "hooks"]
    # the second process evaluated the same arms (else its digest would differ)
    assert report["determinism"]["identical"] is True
    assert report["determinism"]["processes"] == 2
    lines = [json.loads(line) for line in
             (out / "rankings.jsonl").read_text(encoding="utf-8").splitlines()]
    assert {(x["arm"], x["strategy"]) for x in lines} == {
        (a, s) for a in ("fused", "hooks") for s in ("baseline", "task_context")}
    hooks = [x for x in lines if x["arm"] == "hooks"]
    assert all(len(x["top"]) <= ContextCaps().max_items for x in hooks)  # what the model sees


@pytest.mark.parametrize("arms", ["", "fused,nope", " , "])
def test_unknown_arms_are_a_usage_error(tmp_path: Path, arms: str) -> None:
    parser = configure(argparse.ArgumentParser(prog="evaluate"))
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(["--scenarios", "x", "--out", str(tmp_path), "--arms", arms])
    assert caught.value.code == 2
    args = parser.parse_args(["--scenarios", "x", "--out", str(tmp_path)])
    assert args.arms == (Arm.SPARSE, Arm.SEMANTIC, Arm.FUSED)
    assert cells_for(args.arms) == DEFAULT_CELLS
