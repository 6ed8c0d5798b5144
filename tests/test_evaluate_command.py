"""`recallbound evaluate`: shared corpora, streaming, the statistics and the report's shape,
and the committed development set."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plugin.evaluation import (
    Evaluator,
    InvalidScenarioError,
    Scenario,
    hashing_embedding,
    iter_scenarios,
    parse_scenarios,
    stream_scenarios,
)
from plugin.evaluation.analysis import holm, paired_bootstrap, score_row, summarise
from plugin.evaluation.command import (
    Progress,
    count_scenario_lines,
    run,
    sample_indices,
    tables,
    verdict,
)
from plugin.evaluation.evaluator import ScenarioResult

ROOT = Path(__file__).resolve().parents[1]
DEVSET = ROOT / "examples" / "devset.jsonl"


def _devset_module() -> Any:
    spec = importlib.util.spec_from_file_location("devset", ROOT / "examples" / "devset.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["devset"] = module
    spec.loader.exec_module(module)
    return module


def _memory(memory_id: str, text: str, principal: str = "u1") -> dict[str, str]:
    return {"id": memory_id, "text": text, "principal": principal, "scope": "proj"}


CORPUS = {"corpus": "c1", "memories": [
    _memory("m1", "Invoice backfill dry-run on the staging snapshot."),
    _memory("m2", "Team lunch on Thursday."),
    _memory("m9", "Invoice backfill dry-run notes of someone else.", principal="u2"),
], "people": [{"name": "Alice", "beliefs": [{"id": "b1", "text": "Alice likes dry-runs."}]}]}


def _ref(scenario_id: str, request: str, **extra: Any) -> dict[str, Any]:
    return {"id": scenario_id, "family": "continuation", "principal": "u1", "scope": "proj",
            "corpus": "c1", "state": {"current_request": request,
                                      "next_action": "Run the invoice backfill dry-run"},
            "relevant": {"m1": 2}, "must_not": ["m9"], **extra}


def _lines(*objects: dict[str, Any]) -> str:
    return "\n".join(json.dumps(o) for o in objects) + "\n"


# -- the format ----------------------------------------------------------------------------------


def test_a_corpus_is_defined_once_and_shared() -> None:
    first, second = parse_scenarios(_lines(CORPUS, _ref("a", "Continue"), _ref("b", "go on")))
    assert first.corpus == second.corpus == "c1"
    assert [m.id for m in first.memories] == ["m1", "m2", "m9"]
    assert first.memories is second.memories  # shared, not copied per scenario
    assert first.people[0].name == "Alice" and not first.own_items
    assert first.foreign_ids == frozenset({"m9"})


def test_a_scenario_may_add_its_own_memories_to_a_corpus() -> None:
    (scenario,) = parse_scenarios(_lines(CORPUS, _ref(
        "a", "Continue", memories=[_memory("m3", "Extra note.")], relevant={"m3": 2})))
    assert [m.id for m in scenario.memories] == ["m1", "m2", "m9", "m3"]
    assert scenario.own_items


@pytest.mark.parametrize(
    ("lines", "message", "line"),
    [
        ([_ref("a", "Continue")], "corpus 'c1' is not defined on an earlier line", 1),
        ([CORPUS, CORPUS], "corpus 'c1' is already defined", 2),
        ([CORPUS, _ref("a", "x", relevant={"m9": 2})], "belongs to another principal", 2),
        ([CORPUS, _ref("a", "x", memories=[_memory("m1", "dup")])], "already used", 2),
        ([{k: v for k, v in _ref("a", "x").items() if k != "corpus"}], "'memories'", 1),
    ],
)
def test_bad_corpus_references_name_the_line(
    lines: list[dict[str, Any]], message: str, line: int
) -> None:
    with pytest.raises(InvalidScenarioError, match=re.escape(message)) as caught:
        parse_scenarios(_lines(*lines))
    assert caught.value.line == line


def test_the_old_form_stays_readable() -> None:
    scenarios = parse_scenarios((ROOT / "examples" / "scenarios.jsonl").read_bytes())
    assert len(scenarios) == 20 and all(s.corpus is None and s.own_items for s in scenarios)


def test_a_file_is_streamed_not_loaded(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(_lines(CORPUS, _ref("a", "Continue"), _ref("b", "go on")) + "{broken\n",
                    encoding="utf-8")
    stream = stream_scenarios(path)
    assert next(stream).id == "a" and next(stream).id == "b"  # read before the bad line
    with pytest.raises(InvalidScenarioError) as caught:
        next(stream)
    assert caught.value.line == 4
    assert count_scenario_lines(path) == 3


# -- the evaluator on shared corpora -------------------------------------------------------------


@pytest.mark.anyio
async def test_a_shared_corpus_ranks_exactly_like_the_old_form() -> None:
    with DEVSET.open("rb") as source:
        shared = list(iter_scenarios(list(itertools.islice(source, 8))))
    expanded = [
        Scenario.from_json({
            "id": s.id, "family": s.family, "principal": s.principal, "scope": s.scope,
            "memories": [{"id": m.id, "text": m.text, "principal": m.principal,
                          "scope": m.scope} for m in s.memories],
            "people": [{"name": p.name, "beliefs": [{"id": b.id, "text": b.text}
                                                    for b in p.beliefs]} for p in s.people],
            "state": _state_dict(s), "relevant": dict(s.relevant), "must_not": list(s.must_not),
        })
        for s in shared
    ]
    evaluator = Evaluator(embedding=hashing_embedding())
    one = await evaluator.evaluate(shared)
    other = await evaluator.evaluate(expanded)
    assert [r.ranked for r in one.rows] == [r.ranked for r in other.rows]
    assert all(r.ranked for r in one.rows if r.arm != "semantic")


def _state_dict(scenario: Scenario) -> dict[str, Any]:
    state = scenario.state
    return {
        "current_request": state.current_request, "objective": state.objective,
        "next_action": state.next_action,
        "tasks": [{"text": t.text, "done": t.done} for t in state.tasks],
        "open_questions": list(state.open_questions), "constraints": list(state.constraints),
        "facts": [{"text": f.text, "entities": list(f.entities)} for f in state.facts],
    }


# -- statistics ----------------------------------------------------------------------------------


def test_paired_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    d = [0.5, 0.0, 1.0, -0.5, 0.5, 0.0, 1.0, 0.5]
    mean, lo, hi, p = paired_bootstrap(d)
    assert mean == pytest.approx(0.375)
    assert lo < mean < hi and lo >= -0.5 and hi <= 1.0
    assert paired_bootstrap(d) == (mean, lo, hi, p)
    assert paired_bootstrap([0.0] * 5) == (0.0, 0.0, 0.0, 1.0)
    assert paired_bootstrap([1.0] * 5)[1:] == (1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="at least one"):
        paired_bootstrap([])


def test_holm_adjusts_in_order_and_stays_monotone() -> None:
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adjusted == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})
    assert holm({"a": 0.6, "b": 0.5}) == {"b": 1.0, "a": 1.0}


def _row(ranked: tuple[str, ...], strategy: str = "baseline", **kw: Any) -> ScenarioResult:
    values: dict[str, Any] = {
        "scenario_id": "s1", "family": "continuation", "strategy": strategy, "arm": "sparse",
        "query_strategy": strategy, "baseline_reason": None, "query": "q", "query_bytes": 1,
        "fingerprint": "f", "semantic_withheld": None, "people": (), "retrieved": ranked,
        "recall_at_k": None, "ndcg_at_k": None, "mrr": None, "must_not": 0, "foreign": 0,
        "reserved": 2, "executed": 1, "rounds": 1, "refused": 0, "bounded": False,
        "ranked": ranked,
    }
    values.update(kw)
    return ScenarioResult(**values)


def test_row_metrics() -> None:
    scenario = Scenario.from_json({
        "id": "s1", "family": "continuation", "principal": "u1", "scope": "proj",
        "memories": CORPUS["memories"], "people": CORPUS["people"],
        "state": {"current_request": "x"}, "relevant": {"m1": 2, "b1": 1},
        "must_not": ["m2"]})
    scored = score_row(_row(("x1", "x2", "b1", "x3", "m2", "m1")), scenario, (5, 10))
    assert (scored["recall@5"], scored["recall@10"]) == (0.0, 1.0)
    assert (scored["hit@5"], scored["hit@10"]) == (1.0, 1.0)  # b1 is graded (1)
    assert scored["mrr"] == pytest.approx(1 / 6)
    assert scored["harm@5"] == 1.0
    assert 0 < scored["ndcg@10"] < 1


def test_the_summary_has_the_documented_shape() -> None:
    scenario = Scenario.from_json({
        "id": "s1", "family": "continuation", "principal": "u1", "scope": "proj",
        "memories": CORPUS["memories"], "state": {"current_request": "x"},
        "relevant": {"m1": 2}})
    rows = [score_row(_row(("m2", "m1")), scenario, (5,)),
            score_row(_row(("m1",), strategy="task_context", query_strategy="baseline"),
                      scenario, (5,))]
    summary = summarise(rows, (5,), resamples=200)
    cell = summary["results"]["sparse"]["task_context"]["continuation"]
    assert set(cell) >= {"recall@5", "hit@5", "recall@10", "mrr", "ndcg@10", "harm@5", "n"}
    assert summary["results"]["sparse"]["baseline"]["all"]["mrr"] == 0.5
    diff = summary["differences"]["sparse"]["continuation"]["mrr"]
    assert diff["mean"] == 0.5 and (diff["wins"], diff["ties"], diff["losses"]) == (1, 0, 0)
    assert diff["ci95"] == [0.5, 0.5]
    assert summary["costs"]["sparse"]["task_context"]["all"]["baseline_fallback_rate"] == 1.0
    assert summary["work"]["sparse"]["baseline"] == {"reserved": 2, "executed": 1}


def test_the_progress_bar_reaches_the_total() -> None:
    stream = io.StringIO()
    bar = Progress(3, stream=stream)
    for _ in range(3):
        bar.advance(None, [])  # type: ignore[arg-type]
    assert stream.getvalue().splitlines()[-1].startswith("evaluate [")
    assert "3/3 scenarios" in stream.getvalue()


# -- the command ---------------------------------------------------------------------------------


def test_recallbound_evaluate_writes_the_report(tmp_path: Path) -> None:
    scenarios = tmp_path / "dev.jsonl"
    with DEVSET.open("rb") as source:
        lines = list(itertools.islice(source, 14))
    scenarios.write_bytes(b"".join(lines))
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "runtime_hooks", "evaluate", "--scenarios", str(scenarios),
         "--out", str(out), "--semantic", "hashing", "--determinism", "3"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "13/13 scenarios" in result.stderr  # the progress bar
    assert "task_context - baseline" in result.stdout
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["scenarios"] == 13
    assert set(report["policy"]) >= {"max_searches", "max_rounds", "deadline_s"}
    for arm in ("sparse", "semantic", "fused"):
        for strategy in ("baseline", "task_context"):
            cell = report["results"][arm][strategy]["all"]
            assert set(cell) >= {"recall@5", "hit@5", "recall@10", "mrr", "ndcg@10",
                                 "harm@5", "n"}
            work = report["work"][arm][strategy]
            assert work["reserved"] >= work["executed"] > 0
        diff = report["differences"][arm]["continuation"]["recall@5"]
        assert set(diff) >= {"mean", "ci95", "wins", "ties", "losses"}
        assert diff["ci95"][0] <= diff["mean"] <= diff["ci95"][1]
    # The determinism check ran in a second process, with another PYTHONHASHSEED.
    assert report["determinism"] | {"ranking_digest": None} == {
        "checked": 3, "identical": True, "processes": 2, "ranking_digest": None}
    assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "| arm | strategy |" in markdown
    # Every column of report.md has a legend line, and there is a verdict.
    head = next(line for line in markdown.splitlines() if line.startswith("| arm | strategy"))
    legend = markdown.split("## Legend", 1)[1]
    for column in (c.strip() for c in head.strip("|").split("|")):
        assert any(column in line.split(":", 1)[0] for line in legend.splitlines()), column
    assert "## Verdict" in markdown and "On fused, task_context" in markdown
    # Provenance.
    origin = report["provenance"]
    assert origin["scenario_sha256"] == hashlib.sha256(scenarios.read_bytes()).hexdigest()
    assert origin["embedding"] == report["embedding"]
    assert re.fullmatch(r"[0-9a-f]{40}", origin["git_commit"] or "0" * 40)
    assert origin["recallbound_version"] and origin["date"].endswith("+00:00")
    assert "--determinism 3" in origin["command_line"]
    # One rankings.jsonl line per scenario x arm x strategy.
    ranking_lines = [json.loads(line) for line in
                     (out / "rankings.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(ranking_lines) == 13 * 6
    assert {(x["arm"], x["strategy"]) for x in ranking_lines} == {
        (a, s) for a in ("sparse", "semantic", "fused") for s in ("baseline", "task_context")}
    first = ranking_lines[0]
    assert set(first) >= {"scenario", "family", "arm", "strategy", "query", "top", "relevant"}
    assert first["query"] and all(isinstance(i, str) and isinstance(sc, float)
                                  for i, sc in first["top"])
    assert first["relevant"]


def test_no_p_value_is_shown_below_ten_paired_scenarios() -> None:
    rows = []
    for i in range(4):
        for strategy, hit in (("baseline", 0.0), ("task_context", 1.0)):
            rows.append({"scenario": f"s{i}", "family": "f", "arm": "sparse",
                         "strategy": strategy, "recall@5": hit, "hit@5": hit,
                         "recall@10": hit, "hit@10": hit, "mrr": hit, "ndcg@10": hit,
                         "harm@5": 0.0, "query_bytes": 5, "fallback": False,
                         "latency_s": 0.0, "reserved": 1, "executed": 1, "short": False,
                         "ranked": ()})
    summary = summarise(rows, (5, 10), resamples=200)
    report = {"scenarios": 4, "embedding": "hashing", "ks": [5, 10],
              "policy": {"max_searches": 1, "max_rounds": 1},
              "statistics": {"bootstrap_resamples": 200},
              "determinism": {"checked": 0, "identical": None}, **summary}
    text = tables(report, markdown=True)
    difference = next(line for line in text.splitlines()
                      if line.startswith("| sparse | f | recall@5 |"))
    assert "| 4 |" in difference and "n<10" in difference
    assert "anecdotes" in verdict(report)


def test_a_limit_is_a_seeded_sample() -> None:
    assert sample_indices(10, None, 0) is None and sample_indices(10, 10, 0) is None
    picked = sample_indices(100, 7, 3)
    assert picked is not None and len(picked) == 7 and picked == sample_indices(100, 7, 3)
    assert picked != sample_indices(100, 7, 4)
    assert max(picked) > 13  # a sample, not the head of the file


def test_limit_evaluates_that_many_scenarios(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "plugin.evaluation", "--scenarios", str(DEVSET),
         "--out", str(out), "--semantic", "hashing", "--limit", "4", "--seed", "1",
         "--determinism", "0", "--quiet"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["scenarios"] == 4
    assert report["provenance"]["limit"] == 4 and report["provenance"]["seed"] == 1
    total = count_scenario_lines(DEVSET)
    expected = sample_indices(total, 4, 1)
    assert expected is not None
    ids = [s.id for i, s in enumerate(stream_scenarios(DEVSET)) if i in expected]
    assert sorted({x["scenario"] for x in map(json.loads, (out / "rankings.jsonl")
                                              .read_text(encoding="utf-8").splitlines())}) \
        == sorted(ids)


def test_a_determinism_check_that_differs_fails() -> None:
    path = ROOT / "examples" / "scenarios.jsonl"
    report = run(path, embedding=hashing_embedding(), determinism=2, resamples=100,
                 second_process=lambda n: "not the same digest")
    assert report["determinism"]["identical"] is False
    assert report["determinism"]["processes"] == 2


def test_recallbound_evaluate_reports_a_bad_file(tmp_path: Path) -> None:
    scenarios = tmp_path / "bad.jsonl"
    scenarios.write_text(_lines(_ref("a", "Continue")), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "runtime_hooks", "evaluate", "--scenarios", str(scenarios),
         "--out", str(tmp_path / "out"), "--semantic", "hashing", "--quiet"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert result.returncode == 1
    [line] = result.stderr.splitlines()  # one line, the same style as every command
    assert line.startswith("recallbound: ") and "line 1" in line and "not defined" in line


def _evaluate(scenarios: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime_hooks", "evaluate", "--scenarios", str(scenarios),
         "--out", str(out), "--semantic", "hashing", "--quiet", "--determinism", "0"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )


def test_a_failed_run_leaves_the_previous_runs_files_as_they_were(tmp_path: Path) -> None:
    scenarios, out = tmp_path / "dev.jsonl", tmp_path / "out"
    with DEVSET.open("rb") as source:
        lines = list(itertools.islice(source, 6))
    scenarios.write_bytes(b"".join(lines))
    assert _evaluate(scenarios, out).returncode == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    # fewer scenarios, then a bad line: the run fails after ranking the good ones
    scenarios.write_bytes(b"".join(lines[:4]) + b'{"id":\n')
    failed = _evaluate(scenarios, out)
    assert failed.returncode == 1, failed.stderr
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before


def test_an_input_in_the_output_folder_is_read_whole(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with DEVSET.open("rb") as source:
        (out / "rankings.jsonl").write_bytes(b"".join(itertools.islice(source, 6)))
    done = _evaluate(out / "rankings.jsonl", out)
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "report.json").read_text(encoding="utf-8"))["scenarios"] == 5


@pytest.mark.parametrize("argv", [["--limit", "0"], ["--k", "x"], [], ["--digest-only", "-1"],
                                  ["--out", ""]])
def test_usage_errors_exit_2(tmp_path: Path, argv: list[str]) -> None:
    base = [] if not argv else ["--scenarios", str(DEVSET), "--out", str(tmp_path)]
    result = subprocess.run(
        [sys.executable, "-m", "plugin.evaluation", *base, *argv],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert result.returncode == 2 and "usage:" in result.stderr


# -- the development set ------------------------------------------------------------------------


def test_the_committed_development_set_is_what_the_seeded_generator_writes(
    tmp_path: Path,
) -> None:
    devset = _devset_module()
    out = tmp_path / "devset.jsonl"
    devset.write(out, devset.DEFAULT_SEED)
    assert out.read_bytes() == DEVSET.read_bytes()
    devset.write(out, devset.DEFAULT_SEED + 1)
    assert out.read_bytes() != DEVSET.read_bytes()


def test_the_development_set_is_hard_in_the_ways_a_real_state_is() -> None:
    scenarios = list(stream_scenarios(DEVSET))
    assert len(scenarios) >= 300
    families = {s.family for s in scenarios}
    assert families == {"continuation", "anaphoric", "self_contained", "topic_switch",
                        "long_request", "self_contained_in_flight"}
    for scenario in scenarios:
        state = scenario.state
        assert len(state.tasks) > 8 and len(state.facts) > 8, scenario.id
        texts = {m.id: m.text for m in scenario.memories}
        state_texts = [state.current_request, state.next_action, state.objective,
                       *(t.text for t in state.tasks)]
        for item, grade in scenario.relevant.items():
            gold = texts[item]
            # Paraphrased: no gold memory repeats a state text, nor the other way round.
            assert all(gold.casefold() not in s.casefold() and s.casefold() not in
                       gold.casefold() for s in state_texts if len(s) > 12), (scenario.id, item)
            assert grade in (1, 2)
        assert scenario.must_not and set(scenario.must_not) <= scenario.foreign_ids
        words = set(re.findall(r"\w+", " ".join(state_texts).casefold())) - {"the", "for", "a"}
        distractors = [text for mid, text in texts.items()
                       if mid not in scenario.relevant and mid not in scenario.foreign_ids]
        sharing = [t for t in distractors if words & set(re.findall(r"\w+", t.casefold()))]
        assert len(sharing) >= 10, scenario.id
    in_flight = [s for s in scenarios if s.family == "self_contained_in_flight"]
    assert all(s.state.next_action for s in in_flight)
    continuation = [s for s in scenarios if s.family == "continuation"]
    assert {s.state.current_request for s in continuation} >= {"Continue", "go on", "yes"}
