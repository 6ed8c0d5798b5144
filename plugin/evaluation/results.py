"""What an evaluation produces: the cells, each scenario's result, the metrics and the report.

The values :class:`~plugin.evaluation.evaluator.Evaluator` fills in, the one implementation of
each metric (recall, hit, nDCG, reciprocal rank; :mod:`plugin.evaluation.analysis` uses them
too), and the one table renderer, whose every cell is one inert line.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from plugin.control import (
    AllowancePolicy,
)
from plugin.memory.planning import QueryStrategy
from plugin.memory.safe_text import one_line

__all__ = [
    "DEFAULT_CELLS", "HOOKS_CELLS", "Arm", "Cell", "CellMetrics", "Report", "ScenarioResult",
    "hit_at_k", "ndcg_at_k", "recall_at_k", "reciprocal_rank", "render_table",
]

RANKED = 20
"""How many ids of each round's ranking a result keeps (enough for recall@10 and nDCG@10)."""


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


