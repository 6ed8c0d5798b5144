"""Ranking metrics, paired statistics and the ``report.json`` shape of ``recallbound evaluate``.

Per scenario and cell, on the round's whole ranking (before the context caps): recall@k (share
of the grade-2 items in the top k), hit@k (any graded item in the top k), MRR (1 / rank of the
first grade-2 item), nDCG@10 (gain ``2**grade - 1``) and harm@5 (1 when a ``must_not`` item is
in the top 5). Per arm and family, task_context is compared with baseline on the same
scenarios: the mean paired difference, a seeded paired-bootstrap 95 % interval (percentile,
10,000 resamples), wins/ties/losses, and a bootstrap p-value Holm-corrected across the metrics
of that arm and family. Everything here is a pure function of the rows, so the same rows give
the same report.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .evaluator import ScenarioResult, hit_at_k, ndcg_at_k, recall_at_k, reciprocal_rank
from .scenario_parsing import ALL as ALL
from .scenarios import Scenario

__all__ = [
    "ALL",
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "ScoredRow",
    "holm",
    "paired_bootstrap",
    "ranking_digest",
    "score_row",
    "summarise",
]

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20_261_130
SHORT_RANKING = 8
"""A ranking with fewer items than this is "short" (it cannot fill the default context cap)."""
DIFFERENCE_METRICS = ("recall@5", "hit@5", "recall@10", "mrr", "ndcg@10", "harm@5")
"""The metrics compared between strategies (and Holm-corrected together)."""


def metric_names(ks: Sequence[int]) -> tuple[str, ...]:
    """The per-row quality metrics for cut-offs ``ks`` (5 and 10 are always included)."""
    cuts = sorted({5, 10, *ks})
    return (*(f"{m}@{k}" for k in cuts for m in ("recall", "hit")), "mrr", "ndcg@10", "harm@5")


ScoredRow = dict[str, Any]
"""A row's identity (scenario, family, arm, strategy), metrics and costs."""


def score_row(row: ScenarioResult, scenario: Scenario, ks: Sequence[int]) -> ScoredRow:
    """One row's metrics (None where undefined: no grade-2 item, nothing graded)."""
    ranked = row.ranked
    grades = dict(scenario.relevant)
    essential = scenario.essential
    forbidden = frozenset(scenario.must_not)
    scored: ScoredRow = {
        "scenario": row.scenario_id, "family": row.family, "arm": row.arm,
        "strategy": row.strategy,
    }
    for k in sorted({5, 10, *ks}):
        scored[f"recall@{k}"] = recall_at_k(ranked, essential, k)
        scored[f"hit@{k}"] = hit_at_k(ranked, grades, k)
    scored["mrr"] = reciprocal_rank(ranked, essential, len(ranked))
    scored["ndcg@10"] = ndcg_at_k(ranked, grades, 10)
    scored["harm@5"] = float(bool(forbidden & set(ranked[:5])))
    scored["query_bytes"] = row.query_bytes
    scored["fallback"] = row.strategy == "task_context" and row.query_strategy == "baseline"
    scored["latency_s"] = row.latency_s
    scored["reserved"] = row.reserved
    scored["executed"] = row.executed
    scored["short"] = len(ranked) < SHORT_RANKING
    scored["ranked"] = ranked
    return scored


def _mean(values: Iterable[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return math.fsum(defined) / len(defined) if defined else None


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def paired_bootstrap(
    differences: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float, float]:
    """Mean, 95 % percentile interval (lo, hi) and two-sided p-value of paired differences.

    Resamples scenarios with replacement (seeded: the same input gives the same interval).
    The p-value is twice the smaller share of resampled means on either side of 0 (at most 1);
    all-zero differences give ``(0, 0, 0, 1)``.
    """
    d = np.asarray(differences, dtype=np.float64)
    n = len(d)
    if n == 0:
        raise ValueError("paired_bootstrap needs at least one difference")
    mean = float(d.mean())
    if not d.any():
        return 0.0, 0.0, 0.0, 1.0
    rng = np.random.default_rng(seed)
    means = np.empty(resamples, dtype=np.float64)
    chunk = max(1, 2_000_000 // n)  # bound the index matrix's memory
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        index = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = d[index].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    p = min(1.0, 2.0 * min(float((means <= 0).mean()), float((means >= 0).mean())))
    return mean, float(lo), float(hi), p


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm-Bonferroni adjusted p-values (monotone, capped at 1)."""
    order = sorted(p_values, key=lambda name: (p_values[name], name))
    adjusted: dict[str, float] = {}
    running = 0.0
    m = len(order)
    for i, name in enumerate(order):
        running = max(running, min(1.0, (m - i) * p_values[name]))
        adjusted[name] = running
    return adjusted


def ranking_digest(rows: Iterable[ScenarioResult]) -> str:
    """SHA-256 of every row's ranking, in row order: equal digests, identical rankings."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update("\x1f".join((row.scenario_id, row.strategy, row.arm, *row.ranked))
                      .encode("utf-8", "surrogatepass"))
        digest.update(b"\x1e")
    return digest.hexdigest()


def _groups(scored: Sequence[ScoredRow]) -> dict[tuple[str, str, str], list[ScoredRow]]:
    groups: dict[tuple[str, str, str], list[ScoredRow]] = {}
    for row in scored:
        for family in (row["family"], ALL):
            groups.setdefault((row["arm"], row["strategy"], family), []).append(row)
    return groups


def summarise(
    scored: Sequence[ScoredRow], ks: Sequence[int], *, resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """``results``, ``costs``, ``differences`` and ``work`` of the report (JSON-ready)."""
    names = metric_names(ks)
    groups = _groups(scored)
    arms = list(dict.fromkeys(row["arm"] for row in scored))
    strategies = list(dict.fromkeys(row["strategy"] for row in scored))
    families = [*dict.fromkeys(row["family"] for row in scored), ALL]
    results: dict[str, Any] = {}
    costs: dict[str, Any] = {}
    work: dict[str, Any] = {}
    for arm in arms:
        for strategy in strategies:
            for family in families:
                rows = groups.get((arm, strategy, family), [])
                if not rows:
                    continue
                cell: dict[str, Any] = {name: _mean(r[name] for r in rows) for name in names}
                cell["n"] = len(rows)
                results.setdefault(arm, {}).setdefault(strategy, {})[family] = cell
                latencies = [r["latency_s"] * 1000.0 for r in rows]
                costs.setdefault(arm, {}).setdefault(strategy, {})[family] = {
                    "query_bytes": _mean(float(r["query_bytes"]) for r in rows),
                    "baseline_fallback_rate": _mean(float(r["fallback"]) for r in rows),
                    "short_ranking_rate": _mean(float(r["short"]) for r in rows),
                    "latency_ms_p50": _percentile(latencies, 50),
                    "latency_ms_p95": _percentile(latencies, 95),
                    "reserved": sum(r["reserved"] for r in rows),
                    "executed": sum(r["executed"] for r in rows),
                    "n": len(rows),
                }
            everything = groups.get((arm, strategy, ALL), [])
            work.setdefault(arm, {})[strategy] = {
                "reserved": sum(r["reserved"] for r in everything),
                "executed": sum(r["executed"] for r in everything),
            }
    differences: dict[str, Any] = {}
    if {"baseline", "task_context"} <= set(strategies):
        for arm in arms:
            for family in families:
                base = {r["scenario"]: r for r in groups.get((arm, "baseline", family), [])}
                treated = {r["scenario"]: r
                           for r in groups.get((arm, "task_context", family), [])}
                shared = [s for s in base if s in treated]
                if not shared:
                    continue
                compared: dict[str, Any] = {}
                p_values: dict[str, float] = {}
                for name in DIFFERENCE_METRICS:
                    pairs = [(base[s][name], treated[s][name]) for s in shared
                             if base[s][name] is not None and treated[s][name] is not None]
                    if not pairs:
                        continue
                    d = [t - b for b, t in pairs]
                    mean, lo, hi, p = paired_bootstrap(d, resamples=resamples, seed=seed)
                    compared[name] = {
                        "mean": mean, "ci95": [lo, hi],
                        "wins": sum(1 for x in d if x > 1e-12),
                        "ties": sum(1 for x in d if abs(x) <= 1e-12),
                        "losses": sum(1 for x in d if x < -1e-12),
                        "n": len(d), "p": p,
                    }
                    p_values[name] = p
                for name, adjusted in holm(p_values).items():
                    compared[name]["p_holm"] = adjusted
                differences.setdefault(arm, {})[family] = compared
    return {"results": results, "costs": costs, "differences": differences, "work": work}
