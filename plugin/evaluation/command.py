"""``recallbound evaluate --scenarios FILE --out DIR [--k 5,10] [--semantic ...] [--limit N]``.

The one evaluation command (``python -m plugin.evaluation`` runs the same). Streams the scenario
file (corpora defined once, referenced by many scenarios), runs every scenario through baseline
and task_context on the sparse, semantic and fused arms under one allowance, shows a progress
bar on stderr, prints a table and writes into ``DIR``:

- ``report.json``: every metric per arm, strategy and family, the paired differences, the costs,
  and the provenance (recallbound version, git commit when available, SHA-256 of the scenario
  file, embedding model, date, command line);
- ``report.md``: the tables, a legend of every column and a one-paragraph verdict;
- ``rankings.jsonl``: one line per scenario x arm x strategy (the query text, the top-k ids
  with their scores, the relevant ids), for error analysis;
- ``chart.png``: the per-family recall@5 differences with their 95 % intervals and n (needs
  the ``evaluate`` extra, matplotlib).

``--limit N`` evaluates a seeded sample of N scenarios (``--seed``). ``--determinism N``
evaluates the first N (sampled) scenarios again in a second process with another
``PYTHONHASHSEED`` and checks that the rankings are identical.

Errors print one ``recallbound: ...`` line on stderr: exit 1 for bad input (a malformed scenario
file, a missing model, a failed determinism check), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import json
import os
import random
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio
import attrs

from plugin.errors import RecallboundError
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.embedding_choice import load_embedding
from plugin.memory.planning import QueryStrategy

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
from .errors import EvaluationError
from .evaluator import (
    Arm,
    Cell,
    Evaluator,
    ScenarioResult,
    default_embedding,
    render_table,
)
from .scenarios import InvalidScenarioError, Scenario, stream_scenarios

__all__ = ["configure", "main", "provenance", "run", "sample_indices"]

SEMANTIC_CHOICES = ("wordllama", "minilm", "hashing")
MIN_N_FOR_P = 10
"""Below this many paired scenarios no p-value is shown (the report marks it ``n<10``)."""
TOP_K_RANKINGS = 10
"""How many ids (with scores) each ``rankings.jsonl`` line keeps."""


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
    parser.add_argument("--arms", default=DEFAULT_ARMS, type=_arms,
                        help="comma-separated arms to evaluate, each with baseline and "
                        "task_context: sparse, semantic, fused, hooks (the preparation hook's "
                        "whole turn) (default sparse,semantic,fused)")
    parser.add_argument("--limit", type=_count, default=None, metavar="N",
                        help="evaluate a seeded sample of N scenarios (default: all)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the sample's seed (with --limit; default 0)")
    parser.add_argument("--determinism", type=int, default=20, metavar="N",
                        help="re-run the first N scenarios in a second process with another "
                        "PYTHONHASHSEED and compare rankings (0: skip)")
    parser.add_argument("--digest-only", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--resamples", type=int, default=BOOTSTRAP_RESAMPLES,
                        help=argparse.SUPPRESS)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


DEFAULT_ARMS = (Arm.SPARSE, Arm.SEMANTIC, Arm.FUSED)
"""The arms evaluated without ``--arms``."""


def _arms(text: str) -> tuple[Arm, ...]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    choices = ", ".join(arm.value for arm in Arm)
    try:
        arms = tuple(dict.fromkeys(Arm(name) for name in names))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--arms must name arms among {choices}, got {text!r}") from None
    if not arms:
        raise argparse.ArgumentTypeError(f"--arms must name at least one of {choices}")
    return arms


def cells_for(arms: Sequence[Arm]) -> tuple[Cell, ...]:
    """Baseline and task_context on each of ``arms``, in order."""
    return tuple(Cell(strategy, arm) for arm in arms
                 for strategy in (QueryStrategy.BASELINE, QueryStrategy.TASK_CONTEXT))


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
    if choice is None:
        return default_embedding()
    adapter = load_embedding(choice)
    assert adapter is not None  # every --semantic choice names an adapter
    return adapter


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


def sample_indices(total: int, limit: int | None, seed: int) -> frozenset[int] | None:
    """The positions (0-based, among the file's scenarios) a ``--limit`` sample keeps: ``limit``
    of ``total`` drawn with ``random.Random(seed)``; None (keep all) without a limit or when the
    limit covers the file."""
    if limit is None or limit >= total:
        return None
    return frozenset(random.Random(seed).sample(range(total), limit))


def _selected(path: Path, keep: frozenset[int] | None) -> Iterator[Scenario]:
    stream = stream_scenarios(path)
    try:
        for index, scenario in enumerate(stream):
            if keep is None or index in keep:
                yield scenario
    finally:
        stream.close()


def run(
    path: Path, *, embedding: EmbeddingAdapter, ks: Sequence[int] = (5, 10),
    determinism: int = 20, resamples: int = BOOTSTRAP_RESAMPLES,
    progress: Callable[[Scenario, list[ScenarioResult]], None] | None = None,
    backend: str = "asyncio", keep: frozenset[int] | None = None,
    rankings: TextIO | None = None, second_process: Callable[[int], str] | None = None,
    arms: Sequence[Arm] = DEFAULT_ARMS,
) -> dict[str, Any]:
    """Evaluate the file at ``path`` (the scenarios at the positions in ``keep``, or all) and
    return the report as a JSON-ready dict. ``rankings`` receives one JSON line per scenario x
    arm x strategy. ``second_process(n)`` returns the ranking digest of the first ``n``
    scenarios computed by another process (the determinism check; without it, this process
    runs them again). ``arms`` are the arms evaluated, each with both strategies."""
    evaluator = Evaluator(embedding=embedding, cells=cells_for(arms))
    scored: list[ScoredRow] = []

    def collect(scenario: Scenario, rows: list[ScenarioResult]) -> None:
        scored.extend(score_row(row, scenario, ks) for row in rows)
        if rankings is not None:
            for row in rows:
                rankings.write(json.dumps(ranking_line(row, scenario), ensure_ascii=False)
                               + "\n")
        if progress is not None:
            progress(scenario, rows)

    report = anyio.run(
        lambda: evaluator.evaluate(_selected(path, keep), on_scenario=collect), backend=backend
    )
    check: dict[str, Any] = {"checked": 0, "identical": None, "processes": 1}
    if determinism > 0:
        ids = list(dict.fromkeys(row.scenario_id for row in report.rows))[:determinism]
        first = [row for row in report.rows if row.scenario_id in set(ids)]
        if second_process is not None:
            other = second_process(len(ids))
            check = {"checked": len(ids), "identical": ranking_digest(first) == other,
                     "processes": 2}
        else:
            again = anyio.run(
                lambda: evaluator.evaluate(itertools.islice(_selected(path, keep), len(ids))),
                backend=backend,
            )
            check = {"checked": len(ids),
                     "identical": ranking_digest(first) == ranking_digest(again.rows),
                     "processes": 1}
    summary = summarise(scored, ks, resamples=resamples)
    policy = attrs.asdict(evaluator.policy)
    return {
        "scenarios": len({row["scenario"] for row in scored}),
        "policy": policy,
        "ranking": attrs.asdict(evaluator.ranking),
        "embedding": report.embedding,
        "ks": list(ks),
        "metrics": list(metric_names(ks)),
        "families": [*dict.fromkeys(row["family"] for row in scored), ALL],
        "statistics": {"bootstrap_resamples": resamples, "bootstrap_seed": BOOTSTRAP_SEED,
                       "interval": "percentile 95%", "correction": "holm across metrics",
                       "p_values_from_n": MIN_N_FOR_P},
        **summary,
        "determinism": {**check, "ranking_digest": ranking_digest(report.rows)},
    }


def ranking_line(row: ScenarioResult, scenario: Scenario) -> dict[str, Any]:
    """One ``rankings.jsonl`` line: what one cell asked and ranked for one scenario."""
    return {
        "scenario": row.scenario_id, "family": row.family, "arm": row.arm,
        "strategy": row.strategy, "query_strategy": row.query_strategy,
        "query": row.query,
        "top": [[item, round(score, 6)] for item, score in
                zip(row.ranked[:TOP_K_RANKINGS], row.scores[:TOP_K_RANKINGS], strict=False)],
        "relevant": dict(scenario.relevant), "must_not": list(scenario.must_not),
    }


def _git_commit() -> str | None:
    """The commit of the checkout this package runs from, when it is one (else None)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def _version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("recallbound")
    except metadata.PackageNotFoundError:
        return None


def provenance(path: Path, embedding: str, argv: Sequence[str]) -> dict[str, Any]:
    """Where a report comes from: recallbound's version, the git commit when available, the
    scenario file's SHA-256, the embedding model, the date (UTC) and the command line."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return {
        "recallbound_version": _version(),
        "git_commit": _git_commit(),
        "scenario_file": str(path),
        "scenario_sha256": digest.hexdigest(),
        "embedding": embedding,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command_line": shlex.join(argv),
        "python_hash_seed": os.environ.get("PYTHONHASHSEED"),
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


def verdict(report: dict[str, Any], metric: str = "recall@5") -> str:
    """One paragraph: where task_context helps or harms on ``metric``, per arm, and whether
    fusion reaches the best single arm."""
    sentences: list[str] = []
    for arm, families in report["differences"].items():
        gains, harms = [], []
        for family, metrics in families.items():
            if family == ALL or metric not in metrics:
                continue
            d = metrics[metric]
            if d["ci95"][0] > 0:
                gains.append(f"{family} {d['mean']:+.3f}")
            elif d["ci95"][1] < 0 or d["mean"] < -0.02:
                harms.append(f"{family} {d['mean']:+.3f}")
        said = f"On {arm}, task_context "
        said += (f"helps {', '.join(gains)} (95% CI above 0)" if gains
                 else "helps no family with its 95% CI above 0")
        said += f" and costs {', '.join(harms)}." if harms else " and costs no family more " \
            "than 0.02."
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


def _fail(message: str) -> int:
    print(f"recallbound: {message}", file=sys.stderr)
    return 1


def _forwarded(args: argparse.Namespace) -> list[str]:
    """The options a second process needs to evaluate the same scenarios the same way."""
    forwarded = ["--scenarios", str(args.scenarios), "--out", str(args.out),
                 "--backend", args.backend, "--seed", str(args.seed),
                 "--arms", ",".join(arm.value for arm in args.arms)]
    if args.semantic is not None:
        forwarded += ["--semantic", args.semantic]
    if args.limit is not None:
        forwarded += ["--limit", str(args.limit)]
    return forwarded


def _second_process(args: argparse.Namespace) -> Callable[[int], str]:
    """Runs the first ``n`` scenarios in another process with another ``PYTHONHASHSEED``
    and returns its ranking digest."""

    def digest(n: int) -> str:
        env = dict(os.environ)
        env["PYTHONHASHSEED"] = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
        done = subprocess.run(
            [sys.executable, "-m", "plugin.evaluation", *_forwarded(args),
             "--digest-only", str(n)],
            capture_output=True, text=True, env=env, check=False,
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or ["no output"]
            raise EvaluationError(f"the determinism check's second process failed: {lines[-1]}")
        return done.stdout.strip()

    return digest


def main(args: argparse.Namespace, command_line: Sequence[str] | None = None) -> int:
    """Run ``recallbound evaluate`` with parsed ``args``; returns the exit status.

    ``command_line`` is what the report's provenance records (default: ``sys.argv``, its
    program reduced to its file name).

    Errors print one ``recallbound: ...`` line and return 1 (bad input, a missing model, a
    failed determinism check); argparse's usage errors exit 2 before this runs.
    """
    path: Path = args.scenarios
    try:
        embedding = embedding_for(args.semantic)
    except (ImportError, FileNotFoundError, ValueError) as exc:
        return _fail(f"the {args.semantic or 'default'} semantic model is not available: {exc}")
    try:
        total = count_scenario_lines(path)
        keep = sample_indices(total, args.limit, args.seed)
        if args.digest_only is not None:
            return _digest_only(args, path, embedding, keep)
        args.out.mkdir(parents=True, exist_ok=True)
        origin = provenance(path, embedding.name, list(command_line) if command_line is not None
                            else [Path(sys.argv[0]).name, *sys.argv[1:]])
    except OSError as exc:
        return _fail(f"cannot use {exc.filename}: {exc.strerror}")
    progress = None if args.quiet else Progress(len(keep) if keep is not None else total).advance
    try:
        with (args.out / "rankings.jsonl").open("w", encoding="utf-8") as rankings:
            report = run(path, embedding=embedding, ks=args.k, determinism=args.determinism,
                         resamples=args.resamples, progress=progress, backend=args.backend,
                         keep=keep, rankings=rankings, second_process=_second_process(args),
                         arms=args.arms)
    except InvalidScenarioError as exc:
        return _fail(f"{path}: {exc}")
    except (RecallboundError, OSError) as exc:
        return _fail(f"evaluation failed: {exc}")
    report = {"provenance": {**origin, "limit": args.limit,
                             "seed": args.seed if args.limit is not None else None},
              **report}
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
        return _fail("determinism check failed: a second process ranked differently")
    return 0


def _digest_only(args: argparse.Namespace, path: Path, embedding: EmbeddingAdapter,
                 keep: frozenset[int] | None) -> int:
    """The determinism check's second process: print the ranking digest of the first
    ``--digest-only`` scenarios."""
    evaluator = Evaluator(embedding=embedding, cells=cells_for(args.arms))
    try:
        report = anyio.run(
            lambda: evaluator.evaluate(itertools.islice(_selected(path, keep),
                                                        args.digest_only)),
            backend=args.backend,
        )
    except InvalidScenarioError as exc:
        return _fail(f"{path}: {exc}")
    except RecallboundError as exc:
        return _fail(f"evaluation failed: {exc}")
    print(ranking_digest(report.rows))
    return 0


def cli(argv: Sequence[str] | None = None, *, prog: str = "recallbound evaluate") -> int:
    """``python -m plugin.evaluation ...``: the same command as ``recallbound evaluate``."""
    parser = configure(argparse.ArgumentParser(prog=prog))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # usage errors: argparse printed them already
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return main(args, [*shlex.split(prog), *(sys.argv[1:] if argv is None else argv)])
    except KeyboardInterrupt:
        return _fail("interrupted")


if __name__ == "__main__":
    sys.exit(cli())
