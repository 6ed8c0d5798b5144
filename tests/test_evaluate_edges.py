"""``recallbound evaluate`` at its edges: every input bounded, every error one line, exit 2 for
an input that cannot be used, and a verdict read from the table's own numbers."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import pytest

from plugin.evaluation import InvalidScenarioError, parse_scenarios
from plugin.evaluation.analysis import summarise
from plugin.evaluation.command import cli, tables, verdict
from runtime_hooks.__main__ import main as recallbound


def _memory(memory_id: str, text: str) -> dict[str, str]:
    return {"id": memory_id, "text": text, "principal": "u1", "scope": "proj"}


def _scenario(family: str) -> dict[str, Any]:
    return {"id": "s1", "family": family, "principal": "u1", "scope": "proj",
            "memories": [_memory("m1", "backfill dry-run")],
            "state": {"current_request": "run the backfill dry-run"}, "relevant": {"m1": 2}}


def _run_recallbound(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err):
        code = recallbound(argv, stderr=err, stdout=io.StringIO())
    return code, err.getvalue()


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err):
        code = cli(argv)
    return code, err.getvalue()


@pytest.mark.parametrize("family", ["x\n| sparse | forged | 9 |", "x\rforged", "a\x00b", ""])
def test_a_family_that_could_forge_a_row_is_refused(family: str) -> None:
    with pytest.raises(InvalidScenarioError, match="family"):
        parse_scenarios(json.dumps(_scenario(family)))


@pytest.mark.parametrize("family", ["all", "all ", " all", "ALL", "all\u00a0", "a\u200bll",
                                    "\uff41ll"])
def test_the_whole_files_family_name_is_refused_for_a_scenario(family: str) -> None:
    # "all" is the reports' row of the whole file: a scenario in it would be counted twice,
    # and one that only reads "all" in report.md would forge that row.
    with pytest.raises(InvalidScenarioError, match="family"):
        parse_scenarios(json.dumps(_scenario(family)))
    parse_scenarios(json.dumps(_scenario("all-hands")))  # a family that only starts so is fine


@pytest.mark.parametrize(("own", "field", "clash"), [
    ({"memories": [_memory("m1", "again")]}, "memories[0].id", "memories[0] of corpus 'c1'"),
    ({"memories": [_memory("m9", "new"), _memory("m1", "again")]}, "memories[1].id",
     "memories[0] of corpus 'c1'"),
    ({"people": [{"name": "Priya", "beliefs": []}]}, "people[0].name",
     "people[0] of corpus 'c1'"),
])
def test_an_item_clashing_with_its_corpus_names_its_own_field_and_the_corpus_item(
    own: dict[str, Any], field: str, clash: str
) -> None:
    corpus = {"corpus": "c1", "memories": [_memory("m1", "backfill dry-run")],
              "people": [{"name": "Priya", "beliefs": [{"id": "b1", "text": "prefers mornings"}]}]}
    scenario = {k: v for k, v in _scenario("continuation").items() if k != "memories"}
    with pytest.raises(InvalidScenarioError) as caught:
        parse_scenarios(json.dumps(corpus) + "\n" + json.dumps({**scenario, "corpus": "c1", **own}))
    assert f"line 2, field {field!r}" in str(caught.value) and clash in str(caught.value)


def test_a_corpus_with_a_repeated_id_is_refused_on_its_own_line() -> None:
    corpus = {"corpus": "c1", "memories": [_memory("m1", "a"), _memory("m1", "b")]}
    with pytest.raises(InvalidScenarioError, match=re.escape("line 1, field 'memories[1].id'")):
        parse_scenarios(json.dumps(corpus))


@pytest.mark.parametrize("content", [b"", b"\n\n", b"\xef\xbb\xbf",
                                     b'{"corpus": "c1", "memories": []}\n'])
def test_a_file_without_a_scenario_is_one_line_and_no_report(tmp_path: Path,
                                                             content: bytes) -> None:
    scenarios, out = tmp_path / "none.jsonl", tmp_path / "out"
    scenarios.write_bytes(content)
    code, err = _run_recallbound(["evaluate", "--scenarios", str(scenarios), "--out", str(out),
                                  "--semantic", "hashing", "--quiet", "--determinism", "0"])
    assert code == 1 and err.count("\n") == 1 and "holds no scenario" in err
    assert not (out / "report.json").exists()


def test_a_number_too_long_to_read_is_one_line_naming_its_line(tmp_path: Path) -> None:
    scenarios = tmp_path / "big.jsonl"
    line = json.dumps(_scenario("continuation"))
    scenarios.write_text(line + "\n" + line.replace('"m1": 2', '"m1": ' + "9" * 5_000) + "\n")
    code, err = _run_recallbound(["evaluate", "--scenarios", str(scenarios),
                                  "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 1 and err.count("\n") == 1
    assert "line 2" in err and "too long" in err and "Traceback" not in err


def test_a_table_cell_cannot_open_a_row_of_its_own() -> None:
    rows = [{"scenario": "s", "family": "f|x\ny", "arm": "sparse", "strategy": strategy,
             "recall@5": 1.0, "hit@5": 1.0, "recall@10": 1.0, "hit@10": 1.0, "mrr": 1.0,
             "ndcg@10": 1.0, "harm@5": 0.0,
             "query_bytes": 5, "fallback": False, "latency_s": 0.0, "reserved": 1,
             "executed": 1, "short": False, "ranked": ()}
            for strategy in ("baseline", "task_context")]
    report = {"scenarios": 1, "embedding": "hashing", "ks": [5],
              "policy": {"max_searches": 1, "max_rounds": 1},
              "statistics": {"bootstrap_resamples": 50},
              "determinism": {"checked": 0, "identical": None},
              **summarise(rows, (5,), resamples=50)}
    text = tables(report, markdown=True)
    for line in text.splitlines():
        assert not line.startswith("y") and "f|x" not in line


@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_a_bad_resamples_is_one_line_and_exit_2(tmp_path: Path, value: str) -> None:
    scenarios = tmp_path / "s.jsonl"
    scenarios.write_text(json.dumps(_scenario("f")) + "\n")
    for argv in (["--scenarios", str(scenarios), "--out", str(tmp_path / "o"),
                  "--resamples", value, "--quiet"],):
        code, err = _run(argv)
        assert code == 2
        assert err.startswith("recallbound: ") and err.count("\n") == 1 and "resamples" in err
        code, err = _run_recallbound(["evaluate", *argv])
        assert code == 2 and err.startswith("recallbound: ") and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("option", ["--determinism", "--limit"])
def test_other_negative_counts_are_usage_errors_too(tmp_path: Path, option: str) -> None:
    code, err = _run(["--scenarios", str(tmp_path / "s.jsonl"), "--out", str(tmp_path / "o"),
                      option, "-1", "--quiet"])
    assert code == 2 and err.startswith("recallbound: ") and err.count("\n") == 1


def test_an_unbounded_line_is_refused_not_read_into_memory(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from plugin.evaluation import scenarios

    monkeypatch.setattr(scenarios, "MAX_LINE_BYTES", 1_000)
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps(_scenario("f")) + "\n" + "x" * 5_000 + "\n")
    code, err = _run(["--scenarios", str(long), "--out", str(tmp_path / "o"), "--quiet",
                      "--determinism", "0"])
    assert code == 2 and err.startswith("recallbound: ") and err.count("\n") == 1
    assert "line 2" in err and "1000" in err.replace(",", "")


def test_dev_zero_is_an_error_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from plugin.evaluation import scenarios

    monkeypatch.setattr(scenarios, "MAX_LINE_BYTES", 1 << 20)  # the bound, made quick
    code, err = _run(["--scenarios", "/dev/zero", "--out", str(tmp_path / "o"), "--quiet"])
    assert code == 2 and err.startswith("recallbound: ") and err.count("\n") == 1


def _report(harm: tuple[float, float], recall: tuple[float, float], n: int = 12) -> Any:
    rows = []
    for i in range(n):
        for strategy, (h, r) in (("baseline", (harm[0], recall[0])),
                                 ("task_context", (harm[1], recall[1]))):
            worse = i % 3 == 0  # a third of the scenarios carry the change
            rows.append({"scenario": f"s{i}", "family": "hot" if i < n // 2 else "cool",
                         "arm": "sparse", "strategy": strategy,
                         "recall@5": r if worse else recall[0], "hit@5": 1.0, "mrr": 1.0,
                         "recall@10": 1.0, "hit@10": 1.0,
                         "ndcg@10": 1.0, "harm@5": h if worse else harm[0],
                         "query_bytes": 5, "fallback": False, "latency_s": 0.0, "reserved": 1,
                         "executed": 1, "short": False, "ranked": ()})
    return {"scenarios": n, "embedding": "hashing", "ks": [5],
            "policy": {"max_searches": 1, "max_rounds": 1},
            "statistics": {"bootstrap_resamples": 200},
            "determinism": {"checked": 0, "identical": None},
            **summarise(rows, (5,), resamples=200)}


def test_the_verdict_names_every_family_whose_harm_rose() -> None:
    report = _report(harm=(0.0, 1.0), recall=(1.0, 1.0))
    said = verdict(report)
    assert "no family more than" not in said
    rose = {family: d["harm@5"]["mean"] for family, d in report["differences"]["sparse"].items()}
    for family, mean in rose.items():
        assert mean > 0
        assert f"{family} harm@5 {mean:+.3f}" in said  # the table's own number


def test_the_verdict_names_every_family_whose_recall_fell() -> None:
    report = _report(harm=(0.0, 0.0), recall=(1.0, 0.9))
    said = verdict(report)
    fell = {family: d["recall@5"]["mean"] for family, d in report["differences"]["sparse"].items()}
    for family, mean in fell.items():
        assert mean < 0 and f"{family} recall@5 {mean:+.3f}" in said
    assert f"{fell['hot']:+.3f}" in tables(report, markdown=True)


def test_the_verdict_says_when_nothing_got_worse() -> None:
    said = verdict(_report(harm=(0.0, 0.0), recall=(0.5, 1.0)))
    assert "worse on no family" in said


def test_scenarios_from_a_pipe_are_read_once_and_evaluated_whole(tmp_path: Path) -> None:
    """A pipe can be read only once; the file is read several times (counted, hashed,
    evaluated, checked again): what the pipe held is copied into the output folder first."""
    import os
    import subprocess
    import sys

    examples = Path(__file__).resolve().parent.parent / "examples" / "scenarios.jsonl"
    three = b"".join(examples.read_bytes().splitlines(keepends=True)[:3])
    out = tmp_path / "o"
    done = subprocess.run(
        [sys.executable, "-m", "runtime_hooks", "evaluate", "--scenarios", "/dev/stdin",
         "--out", str(out), "--semantic", "hashing", "--quiet", "--determinism", "0"],
        input=three, capture_output=True, timeout=300, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("RECALLBOUND_")})
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["scenarios"] == 3
    (copy,) = out.glob("scenarios-*.jsonl")
    assert copy.read_bytes() == three


_CORPUS = {"corpus": "c1", "memories": [
    {"id": "m1", "text": "Alice runs the quarterly budget review.", "principal": "u1",
     "scope": "s"},
    {"id": "m2", "text": "Alice runs the budget review for team two.", "principal": "u2",
     "scope": "s"}],
    "people": [{"name": "Alice", "beliefs": [{"id": "b1", "text": "Alice prefers tea."}]}]}


def _drinks(scenario_id: str, principal: str) -> dict[str, Any]:
    return {"id": scenario_id, "family": "anaphoric", "principal": principal, "scope": "s",
            "corpus": "c1", "state": {"current_request": "What does Alice prefer to drink?"},
            "relevant": {"b1": 2}}


def test_a_corpus_shared_by_two_principals_gives_each_its_people() -> None:
    """A corpus's people are seeded under each scenario's principal and scope: a scenario's
    result never depends on which scenario of another principal came before it."""
    import anyio

    from plugin.evaluation.evaluator import Evaluator, hashing_embedding
    from plugin.evaluation.results import Arm, Cell
    from plugin.memory.planning import QueryStrategy

    def ranked(lines: list[dict[str, Any]]) -> tuple[str, ...]:
        text = "".join(json.dumps(line) + "\n" for line in lines)
        evaluator = Evaluator(embedding=hashing_embedding(),
                              cells=(Cell(QueryStrategy.BASELINE, Arm.SPARSE),))
        report = anyio.run(evaluator.evaluate, parse_scenarios(text))
        return next(tuple(row.ranked) for row in report.rows if row.scenario_id == "B")

    alone = ranked([_CORPUS, _drinks("B", "u2")])
    assert "b1" in alone
    assert ranked([_CORPUS, _drinks("A", "u1"), _drinks("B", "u2")]) == alone


def test_limit_counts_a_corpus_line_by_what_it_holds_not_how_it_starts(tmp_path: Path) -> None:
    from plugin.evaluation.runner import count_scenario_lines

    corpus = {"memories": [{"id": "m1", "text": "tea notes", "principal": "u1", "scope": "s"}],
              "corpus": "c1"}
    lines = [json.dumps(corpus), "{ " + json.dumps(_CORPUS)[1:].replace('"c1"', '"c2"', 1)]
    lines += [json.dumps({**_drinks(f"s{i}", "u1"), "corpus": "c1"}) for i in range(4)]
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert count_scenario_lines(path) == 4


def test_a_truncated_line_is_reported_where_it_ends(tmp_path: Path) -> None:
    from plugin.evaluation.scenarios import load_scenarios

    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"id": "s2", "family"\r\n')  # read with its line ending
    with pytest.raises(InvalidScenarioError, match=r"line 1: not valid JSON: .* at column 22"):
        load_scenarios(path)
