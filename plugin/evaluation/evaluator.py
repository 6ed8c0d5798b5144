"""The isolated evaluator: each query strategy on each candidate arm, under one allowance policy.

For each scenario the evaluator builds a fresh environment in a temporary folder: its own
reference :class:`~plugin.memory.store.MemoryStore`, seeded with the scenario's memories,
people, beliefs and corrections (foreign memories included), and, for every cell, its own
:class:`~plugin.control.SqliteLedger` with its own run. Nothing is shared between scenarios,
and the cells of a scenario share only the seeded store, which they read and never write.

Each ablation cell (``sparse``, ``semantic``, ``fused``) runs the automatic recall round as the
preparation hook does, on the whole context caps and without the preparation bound: the query is
planned once (release admission always granted, so ``task_context`` is what runs unless the
request is too large), the round reserves ``automatic_slots`` under the policy, the base search
runs on the cell's arms, and a delta People-to-belief read follows when the base found people.
Time is a :class:`~plugin.control.ManualClock`, so the same file gives the same report.

The ``hooks`` arm is the preparation hook's whole turn (:func:`plugin.memory.turn.prepare_turn`,
the one code path :meth:`runtime_hooks.RecallHooks.prepare` runs): on all arms fused, over an
in-memory ledger, the query is planned under the preparation bound, current corrections take
their share of the context caps, and the automatic round gets what is left. Its ``retrieved``
are the evidence ids the model would see.

Metrics, at ``k`` = the context cap's item count: recall of grade-2 items, nDCG with the graded
relevance (gain ``2**grade - 1``), the reciprocal rank of the first grade-2 item, ``must_not``
violations and foreign retrievals (both must be 0), and the ledger's reserved slots and executed
searches side by side.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import anyio
import anyio.to_thread
import attrs

from plugin.control import (
    AllowancePolicy,
    ManualClock,
    RecallAllowance,
    SqliteLedger,
    Usage,
)
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.pipeline import ContextCaps, MemoryRetriever
from plugin.memory.planning import QueryPlanner
from plugin.memory.preparation import PreparedRecall, QueryPreparation
from plugin.memory.ranking import RankingPolicy
from plugin.memory.recall import AutomaticRecall, automatic_round
from plugin.memory.store import MemoryStore
from plugin.memory.turn import PREPARATION_BUDGET_S, prepare_turn

from .results import DEFAULT_CELLS as DEFAULT_CELLS
from .results import HOOKS_CELLS as HOOKS_CELLS
from .results import RANKED as RANKED
from .results import Arm as Arm
from .results import Cell as Cell
from .results import CellMetrics as CellMetrics
from .results import Report as Report
from .results import ScenarioResult as ScenarioResult
from .results import hit_at_k as hit_at_k
from .results import ndcg_at_k as ndcg_at_k
from .results import recall_at_k as recall_at_k
from .results import reciprocal_rank as reciprocal_rank
from .results import render_table as render_table
from .scenarios import Scenario, load_scenarios
from .seeding import SEED_EPOCH as SEED_EPOCH
from .seeding import SEED_STEP_S as SEED_STEP_S
from .seeding import WALL_EPOCH as WALL_EPOCH
from .seeding import _Stores
from .seeding import seed_store as seed_store

__all__ = [
    "DEFAULT_CELLS",
    "HOOKS_CELLS",
    "Arm",
    "Cell",
    "CellMetrics",
    "Evaluator",
    "Report",
    "ScenarioResult",
    "default_embedding",
    "evaluate_file",
    "seed_store",
]


ScenarioCallback = Callable[["Scenario", "list[ScenarioResult]"], None]


def default_embedding() -> EmbeddingAdapter:
    """The best installed model (what ``semantic = "auto"`` loads: MiniLM with WordLlama's
    word match where both extras are installed, else WordLlama, else MiniLM), else hashing.

    A model installed without its files is passed over for the next. The hashing fallback
    reads 256 tokens, like WordLlama, so the same queries are embedded.
    """
    from plugin.memory import wordllama_adapter
    from plugin.memory.embedding_choice import best_installed, load_embedding

    choices = [best_installed(), "wordllama" if wordllama_adapter.available() else "none"]
    for choice in dict.fromkeys(c for c in choices if c != "none"):
        try:
            adapter = load_embedding(choice)
        except FileNotFoundError:  # installed without its model files
            continue
        assert adapter is not None
        return adapter
    return hashing_embedding()


def hashing_embedding() -> EmbeddingAdapter:
    """The deterministic hashing adapter, sized like WordLlama (256 dimensions, 256 tokens)."""
    from plugin.memory.embedding_choice import load_embedding

    adapter = load_embedding("hashing")
    assert adapter is not None
    return adapter


# -- the evaluator --------------------------------------------------------------------------------


async def _admit_always(experiment: str) -> bool:
    """The evaluator's release admission: every experiment is admitted."""
    return True


def _positive_seconds(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Evaluator.{attribute.name} must be a number, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"Evaluator.{attribute.name} must be finite and > 0, got {value!r}")


def _cells(value: Iterable[Cell]) -> tuple[Cell, ...]:
    cells = tuple(value)
    if not cells or not all(isinstance(cell, Cell) for cell in cells):
        raise ValueError("Evaluator.cells must be a non-empty sequence of Cell")
    if len(set(cells)) != len(cells):
        raise ValueError("Evaluator.cells must not repeat a cell")
    return cells


@attrs.frozen(kw_only=True)
class Evaluator:
    """Runs scenarios through every cell, each in isolation, and reports.

    ``embedding`` is the semantic arm's adapter (default: :func:`default_embedding`). Every
    cell runs under the same ``policy``; ``caps.max_items`` is the ``k`` of the metrics.
    """

    embedding: EmbeddingAdapter = attrs.field(factory=default_embedding)
    policy: AllowancePolicy = attrs.field(
        factory=AllowancePolicy, validator=attrs.validators.instance_of(AllowancePolicy)
    )
    caps: ContextCaps = attrs.field(
        factory=ContextCaps, validator=attrs.validators.instance_of(ContextCaps)
    )
    cells: tuple[Cell, ...] = attrs.field(default=DEFAULT_CELLS, converter=_cells)
    ranking: RankingPolicy = attrs.field(
        factory=RankingPolicy, validator=attrs.validators.instance_of(RankingPolicy)
    )
    """The retriever's ranking policy (the evaluator compares variants of it)."""
    min_similarity: float | None = None
    """The retriever's absolute semantic floor (None: no floor, fusion decides)."""
    preparation_budget_s: float = attrs.field(
        default=PREPARATION_BUDGET_S, validator=_positive_seconds
    )
    """The ``hooks`` arm's preparation bound (the hooks' default)."""

    @property
    def k(self) -> int:
        return self.caps.max_items

    async def evaluate(
        self,
        scenarios: Iterable[Scenario],
        *,
        workdir: str | os.PathLike[str] | None = None,
        on_scenario: ScenarioCallback | None = None,
    ) -> Report:
        """Evaluate ``scenarios`` in order (any iterable: a file is streamed, never loaded).

        Every scenario gets a fresh environment, except that consecutive scenarios reading the
        same corpus (and adding nothing of their own) share its seeded store, which every cell
        only reads. The environments live in a new temporary folder (inside ``workdir`` when
        given), removed afterwards. ``on_scenario`` is called with each scenario and its rows
        (a progress bar). Raises :class:`~plugin.errors.MemoryStoreError` or
        :class:`~plugin.errors.LedgerError` when an environment cannot be built.
        """
        root = Path(
            await anyio.to_thread.run_sync(
                lambda: tempfile.mkdtemp(prefix="recallbound-eval-", dir=workdir)
            )
        )
        rows: list[ScenarioResult] = []
        stores = _Stores(self.embedding, root)
        try:
            for index, scenario in enumerate(scenarios):
                if not isinstance(scenario, Scenario):
                    raise TypeError("scenarios must be Scenario values (see load_scenarios)")
                store, folder = await stores.for_scenario(scenario, index)
                results = [
                    await self._cell(scenario, cell, store, folder / f"ledger-{index}-{pos}.db",
                                     run_id=f"evaluation-{index:04d}-{cell.name}")
                    for pos, cell in enumerate(self.cells)
                ]
                rows.extend(results)
                if on_scenario is not None:
                    on_scenario(scenario, results)
        finally:
            with anyio.CancelScope(shield=True):
                await stores.aclose()
                await anyio.to_thread.run_sync(shutil.rmtree, root, True)
        return self._report(rows)

    async def _cell(
        self, scenario: Scenario, cell: Cell, store: MemoryStore, ledger_path: Path, *,
        run_id: str,
    ) -> ScenarioResult:
        """The automatic round on this cell's arms; for the ``hooks`` arm, the preparation
        hook's whole turn (bound, corrections' share, round) over an in-memory ledger."""
        principal, scope, caps = scenario.principal, scenario.scope, self.caps
        clock = ManualClock(wall=WALL_EPOCH, monotonic=0.0)
        preparation = QueryPreparation(
            QueryPlanner(cell.strategy, admission=_admit_always), self.embedding
        )
        retriever = MemoryRetriever(store, arms=cell.arm.arms, ranking=self.ranking,
                                    min_similarity=self.min_similarity)
        shown: tuple[str, ...] = ()
        notes: list[str] = []
        if cell.arm is Arm.HOOKS:
            async with SqliteLedger(":memory:") as ledger:
                allowance = RecallAllowance(ledger, policy=self.policy, clock=clock)
                await ledger.bind_identity(run_id, principal=principal, scope=scope)
                started = time.perf_counter()
                turn = await prepare_turn(
                    allowance, preparation, retriever, scenario.state, run_id=run_id,
                    scope=scope, principal=principal, caps=caps,
                    budget_s=self.preparation_budget_s,
                )
                latency = time.perf_counter() - started
                usage = await ledger.usage(run_id)
            prepared, recall = turn.prepared, turn.recall
            shown = tuple(item.id for item in turn.corrections.shown)
            notes.extend(turn.corrections.notes)
        else:
            prepared, recall, latency, usage = await self._round(
                scenario, preparation, retriever, clock, ledger_path, run_id=run_id
            )
        notes.extend(recall.notes)
        people = recall.people
        bounded = recall.refusal is not None
        retrieved = tuple(item.id for item in recall.evidence)
        # the hooks arm is judged on what the model sees; the ablation on the whole ranking
        ranking = recall.evidence if cell.arm is Arm.HOOKS else recall.candidates
        grades = dict(scenario.relevant)
        essential = scenario.essential
        forbidden = frozenset(scenario.must_not)
        foreign_ids = scenario.foreign_ids
        query = prepared.query
        return ScenarioResult(
            scenario_id=scenario.id,
            family=scenario.family,
            strategy=cell.strategy.value,
            arm=cell.arm.value,
            query_strategy=query.strategy.value,
            baseline_reason=(
                query.baseline_reason.value if query.baseline_reason is not None else None
            ),
            query=query.text,
            query_bytes=len(query.text.encode("utf-8")),
            fingerprint=query.fingerprint,
            semantic_withheld=(
                prepared.semantic.withheld_reason.value
                if prepared.semantic.withheld_reason is not None
                else None
            ),
            people=people,
            retrieved=retrieved,
            recall_at_k=recall_at_k(retrieved, essential, self.k),
            ndcg_at_k=ndcg_at_k(retrieved, grades, self.k),
            mrr=reciprocal_rank(retrieved, essential, self.k),
            must_not=sum(1 for item in recall.candidates if item.id in forbidden),
            foreign=sum(
                1
                for item in recall.candidates
                if item.id in foreign_ids or (item.principal, item.scope) != (principal, scope)
            ),
            reserved=usage.reserved,
            executed=usage.executed,
            rounds=usage.rounds,
            refused=usage.refused,
            bounded=bounded,
            notes=tuple(notes),
            ranked=tuple(item.id for item in ranking[:RANKED]),
            scores=tuple(float(item.score) for item in ranking[:RANKED]),
            corrections=shown,
            latency_s=latency,
        )

    async def _round(
        self, scenario: Scenario, preparation: QueryPreparation, retriever: MemoryRetriever,
        clock: ManualClock, ledger_path: Path, *, run_id: str,
    ) -> tuple[PreparedRecall, AutomaticRecall, float, Usage]:
        """The automatic round alone (the ablation cells): planned before the round, on the
        whole caps, with its own ledger file."""
        principal, scope = scenario.principal, scenario.scope
        async with SqliteLedger(ledger_path) as ledger:
            started = time.perf_counter()
            prepared = await preparation.prepare(
                scenario.state, scope=scope, principal=principal
            )
            allowance = RecallAllowance(ledger, policy=self.policy, clock=clock)
            recall = await automatic_round(allowance, retriever, prepared, run_id=run_id,
                                           caps=self.caps)
            latency = time.perf_counter() - started
            usage = await ledger.usage(run_id)
        await anyio.Path(ledger_path).unlink(missing_ok=True)
        return prepared, recall, latency, usage

    def _report(self, rows: list[ScenarioResult]) -> Report:
        families = tuple(dict.fromkeys(row.family for row in rows))
        overall = tuple(
            CellMetrics.of(cell.strategy.value, cell.arm.value, None,
                           [r for r in rows if (r.strategy, r.arm) == _key(cell)])
            for cell in self.cells
        )
        by_family = tuple(
            CellMetrics.of(
                cell.strategy.value, cell.arm.value, family,
                [r for r in rows if (r.strategy, r.arm) == _key(cell) and r.family == family],
            )
            for family in families
            for cell in self.cells
        )
        return Report(
            k=self.k,
            embedding=self.embedding.name,
            policy=self.policy,
            cells=self.cells,
            overall=overall,
            by_family=by_family,
            rows=tuple(rows),
        )


def _key(cell: Cell) -> tuple[str, str]:
    return cell.strategy.value, cell.arm.value


async def evaluate_file(
    path: str | os.PathLike[str],
    *,
    embedding: EmbeddingAdapter | None = None,
    policy: AllowancePolicy | None = None,
    caps: ContextCaps | None = None,
) -> Report:
    """Load a scenario file and evaluate it with the default cells.

    Raises :class:`~plugin.evaluation.scenarios.InvalidScenarioError` for a malformed file.
    """
    scenarios = await anyio.to_thread.run_sync(load_scenarios, path)
    evaluator = Evaluator(
        embedding=embedding if embedding is not None else default_embedding(),
        policy=policy if policy is not None else AllowancePolicy(),
        caps=caps if caps is not None else ContextCaps(),
    )
    return await evaluator.evaluate(scenarios)
