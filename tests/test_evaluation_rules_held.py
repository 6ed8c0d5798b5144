"""The evaluator's documented rules, each held by a test that fails when the rule is broken:
which items a metric counts and where it stops, the paired bootstrap (95 %, paired, the
resamples asked for, two-sided), per-family rows, the verdict's readings, the determinism
check (every ranked item, another hash seed), and which scenarios of a corpus share a store."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from plugin.evaluation import (
    Evaluator,
    Scenario,
    hashing_embedding,
    parse_scenarios,
    runner,
)
from plugin.evaluation import command as evaluate_command
from plugin.evaluation.analysis import (
    paired_bootstrap,
    ranking_digest,
    score_row,
    summarise,
)
from plugin.evaluation.command import configure, run, tables, verdict
from plugin.evaluation.results import hit_at_k

from .test_evaluate_command import _row

# -- helpers -------------------------------------------------------------------------------------


def _memory(memory_id: str, text: str, principal: str = "u1") -> dict[str, str]:
    return {"id": memory_id, "text": text, "principal": principal, "scope": "proj"}


def _scenario(relevant: dict[str, int], must_not: tuple[str, ...] = ()) -> Scenario:
    ids = [f"m{i}" for i in range(1, 13)]
    return Scenario.from_json({
        "id": "s1", "family": "continuation", "principal": "u1", "scope": "proj",
        "memories": [_memory(i, f"note {i}") for i in ids],
        "people": [{"name": "Alice", "beliefs": [{"id": "b1", "text": "Alice likes dry-runs."}]}],
        "state": {"current_request": "x"}, "relevant": relevant, "must_not": list(must_not)})


def _scored(scenario: str, family: str, strategy: str, value: float,
            arm: str = "sparse") -> dict[str, Any]:
    """A scored row whose quality metrics are all ``value`` (harm 0)."""
    return {"scenario": scenario, "family": family, "arm": arm, "strategy": strategy,
            "recall@5": value, "hit@5": value, "recall@10": value, "hit@10": value,
            "mrr": value, "ndcg@10": value, "harm@5": 0.0, "query_bytes": 5,
            "fallback": False, "latency_s": 0.0, "reserved": 1, "executed": 1,
            "short": False, "ranked": ()}


def _pairs(family: str, pairs: list[tuple[float, float]], arm: str = "sparse") -> list[Any]:
    rows = []
    for i, (base, treated) in enumerate(pairs):
        rows.append(_scored(f"{family}-{i}", family, "baseline", base, arm))
        rows.append(_scored(f"{family}-{i}", family, "task_context", treated, arm))
    return rows


def _report(rows: list[Any], resamples: int = 500) -> dict[str, Any]:
    n = len({r["scenario"] for r in rows})
    return {"scenarios": n, "embedding": "hashing", "ks": [5],
            "policy": {"max_searches": 1, "max_rounds": 1},
            "statistics": {"bootstrap_resamples": resamples},
            "determinism": {"checked": 0, "identical": None},
            **summarise(rows, (5,), resamples=resamples)}


def _helps_clause(said: str, arm: str = "sparse") -> str:
    start = said.index(f"On {arm}, task_context helps ")
    return said[start:said.index(" on recall@5", start)]


# -- metrics -------------------------------------------------------------------------------------


def test_hit_at_k_counts_a_graded_item_at_rank_k_itself() -> None:
    grades = {"b1": 1}
    assert hit_at_k(["x1", "x2", "x3", "x4", "b1"], grades, 5) == 1.0
    scored = score_row(_row(("m3", "m4", "m5", "m6", "b1", "m1")), _scenario({"m1": 2, "b1": 1}),
                       (5, 10))
    assert scored["hit@5"] == 1.0  # the grade-1 belief at rank 5


@pytest.mark.anyio
async def test_the_report_counts_must_not_items_the_round_produced() -> None:
    scenario = Scenario.from_json({
        "id": "s1", "family": "continuation", "principal": "u1", "scope": "proj",
        "memories": [_memory("m1", "Run the invoice backfill dry-run on staging."),
                     _memory("m2", "The invoice backfill dry-run once wiped staging.")],
        "state": {"current_request": "Run the invoice backfill dry-run on staging"},
        "relevant": {"m1": 2}, "must_not": ["m2"]})
    report = await Evaluator(embedding=hashing_embedding()).evaluate([scenario])
    for row in report.rows:  # two memories: the whole ranking is kept
        assert row.must_not == int("m2" in row.ranked), row
    assert "m2" in report.results("s1")[0].ranked
    assert report.cell("baseline", "sparse").must_not == 1


# -- the paired bootstrap ------------------------------------------------------------------------


def test_the_interval_is_95_percent_not_90() -> None:
    # 100 differences of +1 and -1: the resampled mean has sd 0.1, so the 95 % interval is
    # about +-0.196 (a 90 % one would be +-0.164).
    mean, lo, hi, _ = paired_bootstrap([1.0, -1.0] * 50)
    assert mean == 0.0
    assert hi == pytest.approx(0.196, abs=0.015) and lo == pytest.approx(-0.196, abs=0.015)


def test_the_p_value_is_two_sided() -> None:
    # Differences centred on 0: about half the resampled means fall on each side, so the
    # two-sided p-value is 1 (a one-sided one would be about a half).
    assert paired_bootstrap([1.0, -1.0] * 10)[3] == 1.0


def test_differences_are_paired_by_scenario() -> None:
    # task_context adds exactly 0.1 to every scenario's baseline, whatever the baseline:
    # every paired difference is 0.1, so the interval is a point.
    pairs = [(b / 20, b / 20 + 0.1) for b in (0, 17, 3, 12, 8, 1, 15, 6, 10, 2)]
    diff = _report(_pairs("f", pairs))["differences"]["sparse"]["f"]["recall@5"]
    assert diff["mean"] == pytest.approx(0.1)
    assert diff["ci95"] == pytest.approx([0.1, 0.1])
    assert (diff["wins"], diff["ties"], diff["losses"]) == (10, 0, 0)


def test_the_resample_count_asked_for_is_used() -> None:
    # One resample: one resampled mean, so the interval's ends are the same number.
    rows = _pairs("f", [(0.0, 1.0), (0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (0.5, 1.0)] * 2)
    diff = summarise(rows, (5,), resamples=1)["differences"]["sparse"]["f"]["recall@5"]
    lo, hi = diff["ci95"]
    assert lo == hi
    many = summarise(rows, (5,), resamples=2000)["differences"]["sparse"]["f"]["recall@5"]
    assert many["ci95"][0] < many["ci95"][1]


# -- families and the verdict --------------------------------------------------------------------


def test_each_family_row_holds_only_that_family() -> None:
    rows = _pairs("hot", [(1.0, 1.0)] * 3) + _pairs("cool", [(0.0, 0.0)] * 2)
    results = summarise(rows, (5,), resamples=50)["results"]["sparse"]["baseline"]
    assert (results["hot"]["recall@5"], results["hot"]["n"]) == (1.0, 3)
    assert (results["cool"]["recall@5"], results["cool"]["n"]) == (0.0, 2)
    assert (results["all"]["recall@5"], results["all"]["n"]) == (0.6, 5)


def test_the_verdict_names_only_families_whose_interval_is_above_0() -> None:
    rows = (_pairs("sure", [(0.0, 1.0)] * 12)
            + _pairs("unsure", [(0.0, 1.0), (1.0, 0.0), (0.0, 1.0)] * 4))
    report = _report(rows)
    unsure = report["differences"]["sparse"]["unsure"]["recall@5"]
    assert unsure["mean"] > 0 and unsure["ci95"][0] <= 0
    assert report["differences"]["sparse"]["all"]["recall@5"]["ci95"][0] > 0
    helps = _helps_clause(verdict(report))
    assert "sure +1.000" in helps
    assert "unsure" not in helps
    assert "all" not in helps  # the whole file is not a family


def test_fused_is_compared_with_the_best_single_arm() -> None:
    rows = (_pairs("f", [(0.8, 0.8)] * 10, arm="sparse")
            + _pairs("f", [(0.4, 0.4)] * 10, arm="semantic")
            + _pairs("f", [(0.6, 0.6)] * 10, arm="fused"))
    said = verdict(_report(rows))
    assert "fused recall@5 0.600 is below the best single arm (0.800)" in said


def test_a_p_value_is_shown_from_n_equal_10() -> None:
    text = tables(_report(_pairs("f", [(0.0, 1.0)] * 10)), markdown=True)
    line = next(row for row in text.splitlines() if row.startswith("| sparse | f | recall@5 |"))
    assert "| 10 |" in line and "n<10" not in line


# -- the determinism check -----------------------------------------------------------------------


def test_the_ranking_digest_covers_every_ranked_item() -> None:
    first = _row(("m1", "m2", "m3"))
    assert ranking_digest([first]) != ranking_digest([_row(("m1", "m3", "m2"))])
    assert ranking_digest([first]) != ranking_digest([_row(("m1", "m2"))])


ROOT = Path(__file__).resolve().parents[1]


def _tiny_file(tmp_path: Path) -> Path:
    lines = []
    for index, request in enumerate(("Run the invoice backfill dry-run", "Book the team lunch")):
        lines.append({
            "id": f"s{index}", "family": "continuation", "principal": "u1", "scope": "proj",
            "memories": [_memory("m1", "Invoice backfill dry-run on the staging snapshot."),
                         _memory("m2", "Team lunch on Thursday at the usual place."),
                         _memory("m3", "The staging snapshot is refreshed nightly.")],
            "state": {"current_request": request}, "relevant": {"m1": 2, "m3": 1},
            "must_not": ["m2"] if index == 0 else []})
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_an_in_process_recheck_that_ranks_a_later_row_differently_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    class Flaky(Evaluator):
        async def evaluate(self, *args: Any, **kwargs: Any) -> Any:
            report = await super().evaluate(*args, **kwargs)
            calls.append(1)
            if len(calls) == 1:
                return report
            *head, last = report.rows
            return attrs.evolve(report, rows=(*head, attrs.evolve(
                last, ranked=(*last.ranked, "an extra id"))))

    monkeypatch.setattr(runner, "Evaluator", Flaky)
    report = run(_tiny_file(tmp_path), embedding=hashing_embedding(), determinism=2,
                 resamples=20)
    assert len(calls) == 2
    assert report["determinism"]["identical"] is False


def test_cut_offs_given_with_k_are_scored_at_that_k(tmp_path: Path) -> None:
    report = run(_tiny_file(tmp_path), embedding=hashing_embedding(), ks=(1, 5, 10),
                 determinism=0, resamples=20)
    for strategies in report["results"].values():
        for families in strategies.values():
            cell = families["all"]
            assert cell["recall@1"] is not None
            assert cell["recall@1"] <= cell["recall@5"] <= cell["recall@10"]


@pytest.mark.parametrize("ours", [None, "0", "1", "2"])
def test_the_second_process_runs_under_another_hash_seed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ours: str | None) -> None:
    if ours is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", ours)
    seen: dict[str, str] = {}

    def fake_run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(argv, 0, "digest\n", "")

    monkeypatch.setattr(subprocess, "run", fake_run)  # the command's second process
    args = configure(argparse.ArgumentParser()).parse_args(
        ["--scenarios", str(_tiny_file(tmp_path)), "--out", str(tmp_path / "out")])
    assert evaluate_command._second_process(args)(1) == "digest"
    assert seen["PYTHONHASHSEED"] not in (os.environ.get("PYTHONHASHSEED"), "random", "")


# -- cell isolation across scenarios of one corpus -----------------------------------------------

_CORPUS = {"corpus": "c1", "memories": [_memory("m1", "Invoice backfill dry-run on staging.")],
           "people": [{"name": "Alice",
                       "beliefs": [{"id": "b1", "text": "Alice prefers green tea."}]}]}


def _reads(scenario_id: str, scope: str = "proj", **extra: Any) -> dict[str, Any]:
    return {"id": scenario_id, "family": "anaphoric", "principal": "u1", "scope": scope,
            "corpus": "c1", "state": {"current_request": "What does Alice prefer to drink?"},
            "relevant": {"b1": 2}, **extra}


def _ranked(lines: list[dict[str, Any]], scenario_id: str) -> tuple[tuple[str, ...], ...]:
    text = "".join(json.dumps(line) + "\n" for line in lines)
    report = anyio.run(Evaluator(embedding=hashing_embedding()).evaluate, parse_scenarios(text))
    return tuple(row.ranked for row in report.rows if row.scenario_id == scenario_id)


def test_a_scenario_adding_memories_to_a_corpus_gets_them_after_one_that_did_not() -> None:
    extra = _reads("B", memories=[_memory("m5", "Alice drinks green tea every morning.")],
                   relevant={"m5": 2})
    alone = _ranked([_CORPUS, extra], "B")
    assert all("m5" in ranked for ranked in alone)
    assert _ranked([_CORPUS, _reads("A"), extra], "B") == alone


def test_a_corpus_read_in_another_scope_gets_its_own_people() -> None:
    alone = _ranked([_CORPUS, _reads("B", scope="other")], "B")
    assert any("b1" in ranked for ranked in alone)
    assert _ranked([_CORPUS, _reads("A"), _reads("B", scope="other")], "B") == alone
