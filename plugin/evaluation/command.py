"""``recallbound evaluate --scenarios FILE --out DIR [--k 5,10] [--semantic ...]``.

Streams the scenario file (corpora defined once, referenced by many scenarios), runs every
scenario through baseline and task_context on the sparse, semantic and fused arms under one
allowance, shows a progress bar on stderr, prints a table and writes ``DIR/report.json``,
``DIR/report.md`` and ``DIR/chart.png`` (the per-family recall@5 differences with their 95 %
intervals; needs the ``evaluate`` extra, matplotlib). ``--determinism N`` runs the first N
scenarios a second time and checks that the rankings are identical.

Exit status: 0 done, 2 a malformed file or bad arguments, 1 an environment that cannot be built
or a determinism check that failed.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio
import attrs

from plugin.errors import RecallboundError
from plugin.memory.embedding import EmbeddingAdapter

from .analysis import (
    ALL,
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    ScoredRow,
    metric_names,
    ranking_digest,
    score_row,
    summarise,
)
from .evaluator import Evaluator, ScenarioResult, default_embedding, hashing_embedding
from .scenarios import InvalidScenarioError, Scenario, stream_scenarios

__all__ = ["configure", "main", "run"]

SEMANTIC_CHOICES = ("wordllama", "minilm", "hashing")


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``evaluate`` options to ``parser`` (the ``recallbound evaluate`` subparser)."""
    parser.add_argument("--scenarios", required=True, type=Path,
                        help="a JSONL scenario file (one scenario a line; corpora may be shared)")
    parser.add_argument("--out", required=True, type=Path,
                        help="folder for report.json, report.md and chart.png")
    parser.add_argument("--k", default="5,10", type=_ks,
                        help="comma-separated cut-offs for recall@k and hit@k (default 5,10)")
    parser.add_argument("--semantic", choices=SEMANTIC_CHOICES, default=None,
                        help="the semantic arm's model (default: wordllama when installed)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--determinism", type=int, default=20, metavar="N",
                        help="re-run the first N scenarios and compare rankings (0: skip)")
    parser.add_argument("--resamples", type=int, default=BOOTSTRAP_RESAMPLES,
                        help=argparse.SUPPRESS)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k must be integers like 5,10, got {text!r}") from None
    if not ks or ks[0] < 1 or ks[-1] > 20:
        raise argparse.ArgumentTypeError(f"--k values must be between 1 and 20, got {text!r}")
    return ks


def embedding_for(choice: str | None) -> EmbeddingAdapter:
    """The semantic arm's adapter for a ``--semantic`` choice (ImportError when missing)."""
    if choice == "hashing":
        return hashing_embedding()
    if choice == "wordllama":
        from plugin.memory.wordllama_adapter import WordLlamaAdapter

        return WordLlamaAdapter.load()
    if choice == "minilm":
        from plugin.memory.minilm_adapter import MiniLMAdapter

        return MiniLMAdapter.load()
    return default_embedding()


@attrs.define(eq=False)
class Progress:
    """A small progress bar on a text stream: scenarios done out of the file's scenario lines.

    On a terminal it redraws one line; elsewhere (CI logs) it prints a line every 10 %.
    """

    total: int
    stream: TextIO = sys.stderr
    width: int = 30
    done: int = 0
    _started: float = attrs.field(factory=time.monotonic)
    _last_decile: int = -1

    def advance(self, _scenario: Scenario, _rows: list[ScenarioResult]) -> None:
        self.done += 1
        total = max(self.total, self.done)
        share = self.done / total
        elapsed = time.monotonic() - self._started
        eta = elapsed / self.done * (total - self.done)
        filled = int(share * self.width)
        line = (f"evaluate [{'#' * filled}{'.' * (self.width - filled)}] "
                f"{self.done}/{total} scenarios, {elapsed:.0f}s elapsed, ~{eta:.0f}s left")
        if self.stream.isatty():
            self.stream.write("\r" + line + ("\n" if self.done == total else ""))
        elif int(share * 10) != self._last_decile or self.done == total:
            self._last_decile = int(share * 10)
            self.stream.write(line + "\n")
        self.stream.flush()


def count_scenario_lines(path: Path) -> int:
    """Lines that hold a scenario (not a corpus), counted without parsing JSON."""
    count = 0
    with path.open("rb") as file:
        for line in file:
            stripped = line.lstrip(b"\xef\xbb\xbf \t")
            if stripped.strip() and not stripped.startswith(b'{"corpus"'):
                count += 1
    return count


def run(
    path: Path, *, embedding: EmbeddingAdapter, ks: Sequence[int] = (5, 10),
    determinism: int = 20, resamples: int = BOOTSTRAP_RESAMPLES,
    progress: Callable[[Scenario, list[ScenarioResult]], None] | None = None,
    backend: str = "asyncio",
) -> dict[str, Any]:
    """Evaluate the file at ``path`` and return the report as a JSON-ready dict."""
    evaluator = Evaluator(embedding=embedding)
    scored: list[ScoredRow] = []

    def collect(scenario: Scenario, rows: list[ScenarioResult]) -> None:
        scored.extend(score_row(row, scenario, ks) for row in rows)
        if progress is not None:
            progress(scenario, rows)

    report = anyio.run(
        lambda: evaluator.evaluate(stream_scenarios(path), on_scenario=collect), backend=backend
    )
    check: dict[str, Any] = {"checked": 0, "identical": None}
    if determinism > 0:
        with contextlib.closing(stream_scenarios(path)) as stream:
            again = anyio.run(
                lambda: evaluator.evaluate(itertools.islice(stream, determinism)),
                backend=backend,
            )
        first = report.rows[: len(again.rows)]
        check = {
            "checked": len({row.scenario_id for row in again.rows}),
            "identical": ranking_digest(first) == ranking_digest(again.rows),
        }
    summary = summarise(scored, ks, resamples=resamples)
    policy = attrs.asdict(evaluator.policy)
    return {
        "scenarios": len({row["scenario"] for row in scored}),
        "policy": policy,
        "embedding": report.embedding,
        "ks": list(ks),
        "metrics": list(metric_names(ks)),
        "families": [*dict.fromkeys(row["family"] for row in scored), ALL],
        "statistics": {"bootstrap_resamples": resamples, "bootstrap_seed": BOOTSTRAP_SEED,
                       "interval": "percentile 95%", "correction": "holm across metrics"},
        **summary,
        "determinism": {**check, "ranking_digest": ranking_digest(report.rows)},
    }


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
    diff_head = ["arm", "family", "metric", "mean", "95% CI", "W/T/L", "p (Holm)"]
    diff_rows: list[list[str]] = []
    for arm, families in report["differences"].items():
        for family, metrics in families.items():
            for metric in ("recall@5", "ndcg@10", "harm@5"):
                if metric not in metrics:
                    continue
                d = metrics[metric]
                diff_rows.append([
                    arm, family, metric, f"{d['mean']:+.3f}",
                    f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]",
                    f"{d['wins']}/{d['ties']}/{d['losses']}", _f(d.get("p_holm"), 4),
                ])
    det = report["determinism"]
    intro = (f"{report['scenarios']} scenarios, semantic model {report['embedding']}; "
             f"allowance {report['policy']['max_searches']} searches / "
             f"{report['policy']['max_rounds']} rounds. Determinism: "
             f"{det['checked']} scenarios re-run, identical rankings: {det['identical']}.")
    out = [intro, "", *_table(head, rows, markdown), "",
           "task_context - baseline (paired; bootstrap 95% CI, 10,000 resamples):", "",
           *_table(diff_head, diff_rows, markdown)]
    return "\n".join(out) + "\n"


def _table(head: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
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
        means = [differences[arm][f][metric]["mean"] for f in families]
        lows = [m - differences[arm][f][metric]["ci95"][0] for f, m in zip(families, means,
                                                                           strict=True)]
        highs = [differences[arm][f][metric]["ci95"][1] - m for f, m in zip(families, means,
                                                                           strict=True)]
        positions = list(range(len(families)))
        axis.errorbar(means, positions, xerr=[lows, highs], fmt="o", capsize=3)
        axis.axvline(0.0, color="grey", linewidth=0.8)
        axis.set_yticks(positions, families)
        axis.set_title(arm)
        axis.set_xlabel(f"{metric}: task_context - baseline")
    figure.suptitle(f"{report['scenarios']} scenarios, {report['embedding']}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(args: argparse.Namespace) -> int:
    """Run ``recallbound evaluate`` with parsed ``args``; returns the exit status."""
    path: Path = args.scenarios
    try:
        embedding = embedding_for(args.semantic)
    except (ImportError, FileNotFoundError, ValueError) as exc:
        print(f"the {args.semantic} model is not available: {exc}", file=sys.stderr)
        return 2
    try:
        total = count_scenario_lines(path)
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"cannot use {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    progress = None if args.quiet else Progress(total).advance
    try:
        report = run(path, embedding=embedding, ks=args.k, determinism=args.determinism,
                     resamples=args.resamples, progress=progress, backend=args.backend)
    except InvalidScenarioError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 2
    except RecallboundError as exc:
        print(f"evaluation failed: {exc}", file=sys.stderr)
        return 1
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (args.out / "report.md").write_text(
        "# recallbound evaluate\n\n" + tables(report, markdown=True), encoding="utf-8"
    )
    try:
        write_chart(report, args.out / "chart.png")
    except ImportError:
        print("chart.png not written: install the evaluate extra (matplotlib)", file=sys.stderr)
    sys.stdout.write(tables(report, markdown=False))
    if report["determinism"]["identical"] is False:
        print("determinism check FAILED: a second run ranked differently", file=sys.stderr)
        return 1
    return 0


def cli(argv: Sequence[str] | None = None) -> int:
    """``python -m plugin.evaluation.command ...`` (the same as ``recallbound evaluate``)."""
    parser = configure(argparse.ArgumentParser(prog="recallbound evaluate"))
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
