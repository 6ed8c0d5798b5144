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

import enum
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

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
from plugin.memory.planning import QueryPlanner, QueryStrategy
from plugin.memory.preparation import PreparedRecall, QueryPreparation
from plugin.memory.ranking import RankingPolicy
from plugin.memory.recall import AutomaticRecall, automatic_round
from plugin.memory.safe_text import one_line
from plugin.memory.store import MemoryRecord, MemoryStore
from plugin.memory.turn import PREPARATION_BUDGET_S, prepare_turn

from .scenarios import Scenario, load_scenarios

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

WALL_EPOCH = 1_800_000_000.0
"""Every cell's clock starts here (wall) and at 0 (monotonic), and never moves by itself."""
SEED_EPOCH = 1_750_000_000.0
"""Memories and beliefs without ``created_at`` are stamped from here, a minute apart, in file
order (later in the file is newer)."""
SEED_STEP_S = 60.0
RANKED = 20
"""How many ids of each round's ranking a result keeps (enough for recall@10 and nDCG@10)."""

ScenarioCallback = Callable[["Scenario", "list[ScenarioResult]"], None]


class Arm(enum.Enum):
    """The candidate arms a cell's retriever runs. ``recent`` is the frozen control."""

    SPARSE = "sparse"
    """The FTS5 (bm25) arm alone."""
    SEMANTIC = "semantic"
    """The embedding arm alone."""
    FUSED = "fused"
    """Sparse, semantic and the recent control, fused by reciprocal rank (the default)."""
    HOOKS = "hooks"
    """The fused arms, run exactly as the preparation hook runs them: under the preparation
    bound, with current corrections taking their share of the context caps (not in
    :data:`DEFAULT_CELLS`; add it to ``Evaluator.cells``)."""

    @property
    def arms(self) -> frozenset[str]:
        if self is Arm.FUSED or self is Arm.HOOKS:
            return frozenset({"sparse", "semantic", "recent"})
        return frozenset({self.value})


@attrs.frozen
class Cell:
    """One column of the ablation: a query strategy on a set of arms."""

    strategy: QueryStrategy = attrs.field(converter=QueryStrategy)
    arm: Arm = attrs.field(converter=Arm)

    @property
    def name(self) -> str:
        return f"{self.strategy.value}/{self.arm.value}"


DEFAULT_CELLS: tuple[Cell, ...] = tuple(
    Cell(strategy, arm)
    for arm in (Arm.SPARSE, Arm.SEMANTIC, Arm.FUSED)
    for strategy in (QueryStrategy.BASELINE, QueryStrategy.TASK_CONTEXT)
)
"""Baseline and task_context on the sparse arm, the semantic arm, and all arms fused."""

HOOKS_CELLS: tuple[Cell, ...] = tuple(
    Cell(strategy, Arm.HOOKS) for strategy in (QueryStrategy.BASELINE, QueryStrategy.TASK_CONTEXT)
)
"""Baseline and task_context run as the preparation hook runs them."""


def default_embedding() -> EmbeddingAdapter:
    """The packaged WordLlama model when the ``semantic`` extra is installed, else hashing.

    The hashing fallback reads 256 tokens, like WordLlama, so the same queries are embedded.
    """
    from plugin.memory import wordllama_adapter
    from plugin.memory.embedding_choice import load_embedding

    if wordllama_adapter.available():
        try:
            adapter = load_embedding("wordllama")
        except FileNotFoundError:  # installed without its model files
            pass
        else:
            assert adapter is not None
            return adapter
    return hashing_embedding()


def hashing_embedding() -> EmbeddingAdapter:
    """The deterministic hashing adapter, sized like WordLlama (256 dimensions, 256 tokens)."""
    from plugin.memory.embedding_choice import load_embedding

    adapter = load_embedding("hashing")
    assert adapter is not None
    return adapter


# -- results --------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ScenarioResult:
    """One scenario in one cell: what was asked, what came back, what it cost."""

    scenario_id: str
    family: str
    strategy: str
    """The cell's configured strategy."""
    arm: str
    query_strategy: str
    """The strategy the planner actually used (``baseline`` for a too-large request)."""
    baseline_reason: str | None
    query: str
    query_bytes: int
    fingerprint: str
    semantic_withheld: str | None
    """Why the query had no vector (``token_limit``, ...), or None."""
    people: tuple[str, ...]
    retrieved: tuple[str, ...]
    """Ids of the rendered evidence, in context order (at most ``k``)."""
    recall_at_k: float | None
    """Share of grade-2 items retrieved; None when the scenario has none."""
    ndcg_at_k: float | None
    """None when the scenario grades nothing."""
    mrr: float | None
    """1 / rank of the first grade-2 item (0 when none came back); None when there is none."""
    must_not: int
    """``must_not`` items among everything the round produced (rendered or cut by the cap)."""
    foreign: int
    """Items of another principal or scope among everything the round produced."""
    reserved: int
    executed: int
    rounds: int
    refused: int
    bounded: bool
    """Whether the round ended with a bounded-recall notice."""
    notes: tuple[str, ...] = ()
    ranked: tuple[str, ...] = ()
    """Ids of the round's whole ranking before the context caps (at most :data:`RANKED`); for
    the ``hooks`` arm, the rendered evidence (what the model sees, as ``retrieved``)."""
    scores: tuple[float, ...] = ()
    """The ranking's scores, one per id of ``ranked`` (fused scores for the fused arm)."""
    corrections: tuple[str, ...] = ()
    """Ids of the current corrections shown before the evidence (the ``hooks`` arm only)."""
    latency_s: float = attrs.field(default=0.0, eq=False)
    """Real seconds the automatic round took (not part of the report's equality or JSON)."""


@attrs.frozen(kw_only=True)
class CellMetrics:
    """A cell's results over a set of scenarios (all of them, or one family).

    Quality metrics are means over the scenarios where they are defined (None when none is);
    violations and allowance columns are totals.
    """

    strategy: str
    arm: str
    family: str | None
    """None for the whole file."""
    scenarios: int
    recall_at_k: float | None
    ndcg_at_k: float | None
    mrr: float | None
    must_not: int
    foreign: int
    reserved: int
    executed: int
    rounds: int
    refused: int
    max_reserved: int
    """The most slots one scenario reserved in this cell (the policy caps it)."""

    @classmethod
    def of(
        cls, strategy: str, arm: str, family: str | None, rows: Sequence[ScenarioResult]
    ) -> CellMetrics:
        return cls(
            strategy=strategy,
            arm=arm,
            family=family,
            scenarios=len(rows),
            recall_at_k=_mean(r.recall_at_k for r in rows),
            ndcg_at_k=_mean(r.ndcg_at_k for r in rows),
            mrr=_mean(r.mrr for r in rows),
            must_not=sum(r.must_not for r in rows),
            foreign=sum(r.foreign for r in rows),
            reserved=sum(r.reserved for r in rows),
            executed=sum(r.executed for r in rows),
            rounds=sum(r.rounds for r in rows),
            refused=sum(r.refused for r in rows),
            max_reserved=max((r.reserved for r in rows), default=0),
        )


def _mean(values: Iterable[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return math.fsum(defined) / len(defined) if defined else None


_COLUMNS = ("recall@{k}", "nDCG@{k}", "MRR", "must_not", "foreign", "reserved", "executed",
            "rounds", "refused")


@attrs.frozen(kw_only=True)
class Report:
    """The evaluator's result: per-cell aggregates, per family, and every scenario row."""

    k: int
    embedding: str
    """The semantic arm's adapter (its ``name``)."""
    policy: AllowancePolicy
    cells: tuple[Cell, ...]
    overall: tuple[CellMetrics, ...]
    by_family: tuple[CellMetrics, ...]
    rows: tuple[ScenarioResult, ...]

    @property
    def families(self) -> tuple[str, ...]:
        """Families in order of first appearance."""
        return tuple(dict.fromkeys(row.family for row in self.rows))

    def cell(
        self,
        strategy: QueryStrategy | str,
        arm: Arm | str,
        *,
        family: str | None = None,
    ) -> CellMetrics:
        """The aggregate of one cell, over the file or one ``family``; ``KeyError`` if absent."""
        wanted = Cell(strategy, arm)
        source = self.overall if family is None else self.by_family
        for metrics in source:
            if (metrics.strategy, metrics.arm, metrics.family) == (
                wanted.strategy.value, wanted.arm.value, family
            ):
                return metrics
        raise KeyError(f"no cell {wanted.name} for family {family!r}")

    def results(self, scenario_id: str) -> tuple[ScenarioResult, ...]:
        """The rows of one scenario, one per cell."""
        return tuple(row for row in self.rows if row.scenario_id == scenario_id)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (deterministic: the same inputs give the same dict)."""
        return {
            "k": self.k,
            "embedding": self.embedding,
            "policy": attrs.asdict(self.policy),
            "cells": [cell.name for cell in self.cells],
            "overall": [attrs.asdict(m) for m in self.overall],
            "by_family": [attrs.asdict(m) for m in self.by_family],
            "scenarios": [
                attrs.asdict(row, filter=lambda field, _: field.name != "latency_s")
                for row in self.rows
            ],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, sort_keys=False)

    def format_table(self) -> str:
        """A readable text table: a row per strategy and arm, then the same by family."""
        policy = self.policy
        count = len({row.scenario_id for row in self.rows})
        lines = [
            f"{count} scenarios, k={self.k}, semantic adapter {self.embedding}; allowance "
            f"{policy.max_searches} searches / {policy.max_rounds} rounds / "
            f"{policy.deadline_s:g} s per run ({policy.automatic_slots} automatic slots). "
            "Quality: means; must_not .. refused: totals.",
            "",
        ]
        lines.extend(self._table(self.overall, family_column=False))
        if self.by_family:
            lines += ["", "By family:"]
            lines.extend(self._table(self.by_family, family_column=True))
        return "\n".join(lines) + "\n"

    def _table(self, metrics: Sequence[CellMetrics], *, family_column: bool) -> list[str]:
        head = [*(["family"] if family_column else []), "strategy", "arm", "n",
                *(title.format(k=self.k) for title in _COLUMNS)]
        rows: list[list[str]] = []
        previous: str | None = None
        for m in metrics:
            row = []
            if family_column:
                row.append((m.family or "") if m.family != previous else "")
                previous = m.family
            row += [m.strategy, m.arm, str(m.scenarios), _ratio(m.recall_at_k),
                    _ratio(m.ndcg_at_k), _ratio(m.mrr), *(str(v) for v in (
                        m.must_not, m.foreign, m.reserved, m.executed, m.rounds, m.refused))]
            rows.append(row)
        return render_table(head, rows, markdown=False)


def _table_cell(text: str, *, markdown: bool) -> str:
    line = one_line(text)
    return line.replace("\\", "\\\\").replace("|", "\\|") if markdown else line


def render_table(head: Sequence[str], rows: Sequence[Sequence[str]], *,
                 markdown: bool) -> list[str]:
    """The one table renderer: Markdown (``| a | b |``) or aligned plain text. Every cell is
    one inert line (a newline or a ``|`` in a name cannot open a row or a column of its own)."""
    rows = [[_table_cell(c, markdown=markdown) for c in row] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return lines
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) if rows else len(head[i])
              for i in range(len(head))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    return lines


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# -- metrics (the one implementation of each; plugin.evaluation.analysis uses them too) ----------


def recall_at_k(retrieved: Sequence[str], essential: frozenset[str], k: int) -> float | None:
    """Share of the grade-2 items among the first ``k`` retrieved; None without any."""
    if not essential:
        return None
    return len(essential.intersection(retrieved[:k])) / len(essential)


def hit_at_k(retrieved: Sequence[str], grades: Mapping[str, int], k: int) -> float | None:
    """1.0 when any graded item is among the first ``k`` retrieved, else 0.0; None when the
    scenario grades nothing."""
    if not grades:
        return None
    return float(any(item in grades for item in retrieved[:k]))


def ndcg_at_k(retrieved: Sequence[str], grades: Mapping[str, int], k: int) -> float | None:
    """Normalised DCG with gain ``2**grade - 1`` and a ``log2(rank + 1)`` discount."""
    ideal = sorted(grades.values(), reverse=True)[:k]
    if not ideal:
        return None
    dcg = math.fsum(
        (2 ** grades.get(item, 0) - 1) / math.log2(rank + 1)
        for rank, item in enumerate(retrieved[:k], start=1)
    )
    best = math.fsum((2**grade - 1) / math.log2(rank + 1) for rank, grade in enumerate(ideal, 1))
    return dcg / best


def reciprocal_rank(retrieved: Sequence[str], essential: frozenset[str], k: int) -> float | None:
    """1 / rank of the first grade-2 item in the first ``k`` (0 when absent); None without any."""
    if not essential:
        return None
    for rank, item in enumerate(retrieved[:k], start=1):
        if item in essential:
            return 1.0 / rank
    return 0.0


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


@attrs.define(eq=False)
class _Stores:
    """The seeded store of the current scenario, kept while its corpus is read unchanged."""

    embedding: EmbeddingAdapter
    root: Path
    _key: tuple[str, int] | None = None
    _store: MemoryStore | None = None
    _folder: Path | None = None

    async def for_scenario(self, scenario: Scenario, index: int) -> tuple[MemoryStore, Path]:
        key = (scenario.corpus, 0) if scenario.corpus and not scenario.own_items else None
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
