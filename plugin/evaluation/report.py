"""What ``recallbound evaluate`` writes for people: the tables, the legend, the verdict and
the chart, all read from the one report dictionary (so the verdict says what the table shows).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .analysis import (
    ALL,
)
from .evaluator import (
    render_table,
)

__all__ = ["LEGEND", "MIN_N_FOR_P", "WORSE", "tables", "verdict", "write_chart"]

MIN_N_FOR_P = 10
"""Below this many paired scenarios no p-value is shown (marked ``n<10``)."""


def _f(value: object, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def tables(report: dict[str, Any], *, markdown: bool) -> str:
    """The readable tables: quality and costs per arm and strategy, then the differences."""
    ks = report["ks"]
    quality = [f"recall@{k}" for k in ks] + [f"hit@{k}" for k in ks] + ["mrr", "ndcg@10",
                                                                        "harm@5"]
    head = ["arm", "strategy", "family", "n", *quality, "bytes", "fallback", "short",
            "p50 ms", "p95 ms", "reserved", "executed"]
    rows: list[list[str]] = []
    for arm, strategies in report["results"].items():
        for strategy, families in strategies.items():
            for family, cell in families.items():
                cost = report["costs"][arm][strategy][family]
                rows.append([arm, strategy, family, str(cell["n"]),
                             *(_f(cell[m]) for m in quality),
                             _f(cost["query_bytes"], 0), _f(cost["baseline_fallback_rate"], 2),
                             _f(cost["short_ranking_rate"], 2),
                             _f(cost["latency_ms_p50"], 1), _f(cost["latency_ms_p95"], 1),
                             str(cost["reserved"]), str(cost["executed"])])
    diff_head = ["arm", "family", "metric", "n", "mean", "95% CI", "W/T/L", "p (Holm)"]
    diff_rows: list[list[str]] = []
    for arm, families in report["differences"].items():
        for family, metrics in families.items():
            for metric in ("recall@5", "ndcg@10", "harm@5"):
                if metric not in metrics:
                    continue
                d = metrics[metric]
                n = d.get("n", d["wins"] + d["ties"] + d["losses"])
                p = _f(d.get("p_holm"), 4) if n >= MIN_N_FOR_P else f"n<{MIN_N_FOR_P}"
                diff_rows.append([
                    arm, family, metric, str(n), f"{d['mean']:+.3f}",
                    f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]",
                    f"{d['wins']}/{d['ties']}/{d['losses']}", p,
                ])
    det = report["determinism"]
    intro = (f"{report['scenarios']} scenarios, semantic model {report['embedding']}; "
             f"allowance {report['policy']['max_searches']} searches / "
             f"{report['policy']['max_rounds']} rounds. Determinism: "
             f"{det['checked']} scenarios re-run, identical rankings: {det['identical']}.")
    out = [intro, "", *render_table(head, rows, markdown=markdown), "",
           f"task_context - baseline (paired; bootstrap 95% CI, "
           f"{report['statistics']['bootstrap_resamples']:,} resamples):", "",
           *render_table(diff_head, diff_rows, markdown=markdown)]
    if markdown:
        out += ["", "## Verdict", "", verdict(report), "", "## Legend", "",
                *(f"- **{_legend_name(name, ks)}**: {meaning}" for name, meaning in LEGEND)]
    return "\n".join(out) + "\n"


LEGEND: tuple[tuple[str, str], ...] = (
    ("arm", "the candidate arms: sparse (FTS5 bm25) alone, semantic (embedding cosine) alone, "
     "or fused (both, with the recent arm breaking ties)"),
    ("strategy", "how the query was formed: baseline (objective, open questions, request) or "
     "task_context (the bounded task-context composer)"),
    ("family", "the scenario family (all: every scenario of the file)"),
    ("n", "scenarios in the cell, or paired scenarios in a difference"),
    ("recall@k", "mean share of the grade-2 (needed) items in the top k of the whole ranking"),
    ("hit@k", "mean share of scenarios with any graded item in the top k"),
    ("mrr", "mean reciprocal rank of the first grade-2 item (0 when absent)"),
    ("ndcg@10", "normalised discounted cumulative gain at 10, gain 2**grade - 1"),
    ("harm@5", "share of scenarios with a must_not item in the top 5 (must be 0)"),
    ("bytes", "mean UTF-8 bytes of the query"),
    ("fallback", "share of task_context queries that took the baseline (request too large)"),
    ("short", "share of rankings with fewer than 8 items"),
    ("p50 ms / p95 ms", "latency of the automatic round, median and 95th percentile "
     "(noisy: a cost hint, not a benchmark)"),
    ("reserved / executed", "slots the allowance reserved and searches it executed"),
    ("metric", "the metric the difference is taken on"),
    ("mean", "mean paired difference task_context - baseline over the same scenarios"),
    ("95% CI", "seeded paired-bootstrap percentile interval of that mean"),
    ("W/T/L", "scenarios where task_context won, tied, lost"),
    ("p (Holm)", f"bootstrap p-value, Holm-corrected across the metrics of an arm and "
     f"family; not shown below n = {MIN_N_FOR_P} (marked n<{MIN_N_FOR_P})"),
)
"""Every column of ``report.md``, with its meaning."""


def _legend_name(name: str, ks: Sequence[int]) -> str:
    """``recall@k`` and ``hit@k`` spelled out for the report's cut-offs."""
    if name.endswith("@k"):
        return ", ".join(f"{name[:-1]}{k}" for k in ks)
    return name


WORSE = {"recall@5": -1, "ndcg@10": -1, "harm@5": +1}
"""The metrics the verdict reads, and which sign of task_context - baseline is worse."""


def verdict(report: dict[str, Any], metric: str = "recall@5") -> str:
    """One paragraph, from the same differences the table prints (the same numbers, rounded
    the same way): per arm, the families where task_context helps on ``metric`` (95% CI above
    0), then EVERY family and metric where it is worse (a lower recall or nDCG, a higher
    harm), or that none is; and whether fusion reaches the best single arm."""
    sentences: list[str] = []
    for arm, families in report["differences"].items():
        gains, worse = [], []
        for family, metrics in families.items():
            d = metrics.get(metric)
            if family != ALL and d is not None and d["ci95"][0] > 0:
                gains.append(f"{family} {d['mean']:+.3f}")
            for name, sign in WORSE.items():
                shown = metrics.get(name)
                if shown is not None and round(sign * shown["mean"], 3) > 0:
                    worse.append(f"{family} {name} {shown['mean']:+.3f}")
        said = f"On {arm}, task_context "
        said += (f"helps {', '.join(gains)} on {metric} (95% CI above 0)" if gains
                 else f"helps no family on {metric} with its 95% CI above 0")
        said += (f"; it is worse on {', '.join(worse)}." if worse
                 else "; it is worse on no family (recall, nDCG and harm).")
        sentences.append(said)
    results = report["results"]
    if {"sparse", "semantic", "fused"} <= set(results):
        for strategy in results["fused"]:
            fused = results["fused"][strategy].get(ALL, {}).get(metric)
            best = max((results[a][strategy].get(ALL, {}).get(metric) or 0.0)
                       for a in ("sparse", "semantic"))
            if fused is not None:
                relation = "at least" if fused >= best - 1e-9 else "below"
                sentences.append(f"With {strategy}, fused {metric} {fused:.3f} is {relation} "
                                 f"the best single arm ({best:.3f}).")
    n = report["scenarios"]
    if n < MIN_N_FOR_P:
        sentences.append(f"Only {n} scenarios: read these as anecdotes, not evidence.")
    return " ".join(sentences)


def write_chart(report: dict[str, Any], path: Path, metric: str = "recall@5") -> None:
    """Per-family task_context - baseline differences with their 95 % intervals, one panel per
    arm (Agg backend: no display needed). Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    differences = report["differences"]
    arms = list(differences)
    figure, axes = plt.subplots(1, max(1, len(arms)), figsize=(4.5 * max(1, len(arms)), 4.2),
                                sharex=True, sharey=True, squeeze=False)
    for axis, arm in zip(axes[0], arms, strict=False):
        families = [f for f in differences[arm] if metric in differences[arm][f]]
        labels = [f"{f} (n={differences[arm][f][metric].get('n', '?')})" for f in families]
        means = [differences[arm][f][metric]["mean"] for f in families]
        lows = [m - differences[arm][f][metric]["ci95"][0] for f, m in zip(families, means,
                                                                           strict=True)]
        highs = [differences[arm][f][metric]["ci95"][1] - m for f, m in zip(families, means,
                                                                           strict=True)]
        positions = list(range(len(families)))
        axis.errorbar(means, positions, xerr=[lows, highs], fmt="o", capsize=3)
        axis.axvline(0.0, color="grey", linewidth=0.8)
        axis.set_yticks(positions, labels)
        axis.set_title(arm)
        axis.set_xlabel(f"{metric}: task_context - baseline")
    figure.suptitle(f"{report['scenarios']} scenarios, {report['embedding']}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)

