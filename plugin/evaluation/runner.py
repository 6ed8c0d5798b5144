"""Running an evaluation for the command: the seeded sample, the streamed scenarios, the
progress bar, the rankings file and the report's provenance.
"""

from __future__ import annotations

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

from plugin.memory.embedding import EmbeddingAdapter
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
from .evaluator import (
    Arm,
    Cell,
    Evaluator,
    ScenarioResult,
)
from .report import LEGEND as LEGEND
from .report import MIN_N_FOR_P
from .report import WORSE as WORSE
from .report import tables as tables
from .report import verdict as verdict
from .report import write_chart as write_chart
from .scenarios import (
    Scenario,
    bounded_lines,
    stream_scenarios,
)

__all__ = ["DEFAULT_ARMS", "Progress", "cells_for", "count_scenario_lines", "provenance",
           "ranking_line", "run", "sample_indices"]

TOP_K_RANKINGS = 10
"""How many ids (with scores) each ``rankings.jsonl`` line keeps."""

DEFAULT_ARMS = (Arm.SPARSE, Arm.SEMANTIC, Arm.FUSED)
"""The arms evaluated without ``--arms``."""



def cells_for(arms: Sequence[Arm]) -> tuple[Cell, ...]:
    """Baseline and task_context on each of ``arms``, in order."""
    return tuple(Cell(strategy, arm) for arm in arms
                 for strategy in (QueryStrategy.BASELINE, QueryStrategy.TASK_CONTEXT))



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
    """Lines that hold a scenario (not a corpus), by the rule the reader uses: a corpus is an
    object with ``corpus`` and no ``id``. Only a line that names ``corpus`` is parsed; one that
    does not parse counts as a scenario (reading it fails with its line named)."""
    count = 0
    with path.open("rb") as file:
        for line in bounded_lines(file):
            stripped = line.lstrip(b"\xef\xbb\xbf \t")
            if stripped.strip() and not _is_corpus(stripped):
                count += 1
    return count


def _is_corpus(line: bytes) -> bool:
    if b'"corpus"' not in line:
        return False
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "corpus" in data and "id" not in data


def sample_indices(total: int, limit: int | None, seed: int) -> frozenset[int] | None:
    """The positions (0-based, among the file's scenarios) a ``--limit`` sample keeps: ``limit``
    of ``total`` drawn with ``random.Random(seed)``; None (keep all) without a limit or when the
    limit covers the file."""
    if limit is None or limit >= total:
        return None
    return frozenset(random.Random(seed).sample(range(total), limit))


def selected_scenarios(path: Path, keep: frozenset[int] | None) -> Iterator[Scenario]:
    """The scenarios of the file a ``--limit`` sample keeps (all without one), streamed."""
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
        lambda: evaluator.evaluate(selected_scenarios(path, keep), on_scenario=collect),
        backend=backend,
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
                lambda: evaluator.evaluate(
                    itertools.islice(selected_scenarios(path, keep), len(ids))),
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


