"""The isolated evaluator: scenario parsing, isolation, determinism, the ablation's invariants."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plugin import AllowancePolicy, QueryStrategy, RecallboundError
from plugin.evaluation import (
    DEFAULT_CELLS,
    Arm,
    Cell,
    Evaluator,
    InvalidScenarioError,
    Report,
    Scenario,
    hashing_embedding,
    load_scenarios,
    parse_scenarios,
)
from plugin.evaluation.evaluator import ndcg_at_k, recall_at_k, reciprocal_rank
from plugin.memory.hashing import HashingEmbedding

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "scenarios.jsonl"



def _scenario(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": "s1",
        "family": "continuation",
        "principal": "u1",
        "scope": "proj",
        "memories": [
            {"id": "m1", "text": "Run the invoice backfill dry-run on staging.",
             "principal": "u1", "scope": "proj"},
            {"id": "m2", "text": "Team lunch on Thursday.", "principal": "u1", "scope": "proj",
             "created_at": 1_700_000_000, "cites": ["src-1"]},
            {"id": "m9", "text": "Someone else's backfill note.", "principal": "u2",
             "scope": "proj"},
        ],
        "people": [{"name": "Alice", "beliefs": [{"id": "b1", "text": "Alice likes dry-runs."}]}],
        "state": {"current_request": "Continue", "objective": "Ship the migration",
                  "next_action": "Run the backfill dry-run",
                  "tasks": [{"text": "Backfill invoices", "done": False}],
                  "facts": [{"text": "Alice owns it", "entities": ["Alice"]}]},
        "relevant": {"m1": 2, "b1": 1},
        "must_not": ["m9"],
    }
    data.update(changes)
    return data


def _line(**changes: Any) -> str:
    return json.dumps(_scenario(**changes))


# -- parsing ------------------------------------------------------------------------------------


def test_a_valid_line_parses() -> None:
    scenario = Scenario.from_json(_line())
    assert scenario.id == "s1" and scenario.family == "continuation"
    assert (scenario.principal, scenario.scope) == ("u1", "proj")
    assert [m.id for m in scenario.memories] == ["m1", "m2", "m9"]
    assert scenario.memories[1].created_at == 1_700_000_000.0
    assert scenario.memories[1].cites == ("src-1",)
    assert scenario.people[0].name == "Alice"
    assert scenario.people[0].beliefs[0].id == "b1"
    assert scenario.state.current_request == "Continue"
    assert scenario.state.facts[0].entities == ("Alice",)
    assert dict(scenario.relevant) == {"m1": 2, "b1": 1}
    assert scenario.must_not == ("m9",)
    assert scenario.foreign_ids == frozenset({"m9"})
    assert scenario.essential == frozenset({"m1"})
    # The same value from a mapping and from UTF-8 bytes.
    assert Scenario.from_json(_scenario()) == scenario
    assert Scenario.from_json(_line().encode()) == scenario
    assert hash(scenario) == hash(Scenario.from_json(_line()))


def test_optional_keys_may_be_absent() -> None:
    data = _scenario(relevant={"m1": 2})
    del data["people"], data["must_not"]
    scenario = Scenario.from_json(data)
    assert scenario.people == () and scenario.must_not == ()


def test_a_prohibition_may_name_an_id_the_scenario_lacks() -> None:
    # As the format's own example does: such an item can never be shown, so never harm.
    scenario = Scenario.from_json(_line(must_not=["m9", "zz"]))
    assert scenario.must_not == ("m9", "zz")


def test_blank_lines_are_skipped_and_line_numbers_kept() -> None:
    text = "\n" + _line(id="a") + "\n   \n\n" + _line(id="b") + "\n"
    assert [s.id for s in parse_scenarios(text)] == ["a", "b"]
    assert parse_scenarios("") == []


def test_the_examples_file_loads() -> None:
    scenarios = load_scenarios(EXAMPLES)
    assert len(scenarios) >= 18
    families = {s.family for s in scenarios}
    assert {"continuation", "anaphoric", "self_contained", "topic_switch",
            "long_request"} <= families
    long = [s for s in scenarios if s.family == "long_request"]
    assert long and all(len(s.state.current_request.encode()) > 512 for s in long)
    assert sum(1 for s in scenarios if s.foreign_ids & set(s.must_not)) >= 5
    assert any(s.people for s in scenarios)


_BAD_LINES: list[tuple[str, bytes, str]] = [
    ("not json", b'{"id": "s1", ', ""),
    ("not utf-8", _line().encode().replace(b"Continue", b"Contin\xffue"), ""),
    ("not an object", b"[1, 2]", ""),
    ("duplicate json key", b'{"id": "a", "id": "b"}', ""),
    ("unknown top-level key", _line(extra=1).encode(), ""),
    ("missing key", json.dumps({k: v for k, v in _scenario().items() if k != "relevant"})
     .encode(), ""),
    ("empty id", _line(id=" ").encode(), "id"),
    ("family not a string", _line(family=3).encode(), "family"),
    ("memories not an array", _line(memories={}).encode(), "memories"),
    ("unknown memory key", _line(memories=[{"id": "m1", "text": "t", "principal": "u1",
                                            "scope": "proj", "tags": []}]).encode(),
     "memories[0]"),
    ("memory principal missing", _line(memories=[{"id": "m1", "text": "t", "scope": "proj"}])
     .encode(), "memories[0]"),
    ("created_at not a number", _line(memories=[{"id": "m1", "text": "t", "principal": "u1",
                                                 "scope": "proj", "created_at": "today"}])
     .encode(), "memories[0].created_at"),
    ("created_at NaN", _line().replace('"created_at": 1700000000', '"created_at": NaN')
     .encode(), ""),
    ("created_at past a float", _line().replace('"created_at": 1700000000',
                                                '"created_at": 1' + "0" * 400).encode(),
     "memories[1].created_at"),
    ("lone surrogate", _line().replace("Team lunch", "Team \\ud800lunch").encode(),
     "memories[1].text"),
    ("grade 3", _line(relevant={"m1": 3}).encode(), "relevant.m1"),
    ("grade 0", _line(relevant={"m1": 0}).encode(), "relevant.m1"),
    ("grade as string", _line(relevant={"m1": "2"}).encode(), "relevant.m1"),
    ("grade as bool", _line(relevant={"m1": True}).encode(), "relevant.m1"),
    ("grade as float", _line(relevant={"m1": 2.0}).encode(), "relevant.m1"),
    ("relevant not an object", _line(relevant=["m1"]).encode(), "relevant"),
    ("relevant unknown id", _line(relevant={"m7": 2}).encode(), "relevant.m7"),
    ("relevant foreign id", _line(relevant={"m9": 2}, must_not=[]).encode(), "relevant.m9"),
    ("must_not also relevant", _line(must_not=["m1"]).encode(), "must_not[0]"),
    ("duplicate memory id", _line(memories=[
        {"id": "m1", "text": "a", "principal": "u1", "scope": "proj"},
        {"id": "m1", "text": "b", "principal": "u2", "scope": "proj"}], must_not=[],
        relevant={"m1": 2}).encode(), "memories[1].id"),
    ("memory id recall cannot render", _line(memories=[
        {"id": "m]1", "text": "a", "principal": "u1", "scope": "proj"}], must_not=[],
        relevant={"m]1": 2}, people=[]).encode(), "memories[0].id"),
    ("belief id reuses a memory id", _line(people=[
        {"name": "Alice", "beliefs": [{"id": "m1", "text": "x"}]}], relevant={"m1": 2})
     .encode(), "people[0].beliefs[0].id"),
    ("unknown belief key", _line(people=[
        {"name": "Alice", "beliefs": [{"id": "b1", "text": "x", "holder": "Bob"}]}]).encode(),
     "people[0].beliefs[0]"),
    ("state unknown key", _line(state={"current_request": "x", "mood": "ok"}).encode(),
     "state"),
    ("state missing request", _line(state={"objective": "x"}).encode(), "state"),
    ("state wrong type", _line(state={"current_request": 5}).encode(), "state"),
]


@pytest.mark.parametrize(("case", "bad", "field"), _BAD_LINES, ids=[c[0] for c in _BAD_LINES])
def test_a_malformed_line_names_its_line_and_field(case: str, bad: bytes, field: str) -> None:
    text = _line(id="ok").encode() + b"\n\n" + bad + b"\n" + _line(id="later").encode()
    with pytest.raises(InvalidScenarioError) as caught:
        parse_scenarios(text)
    error = caught.value
    assert isinstance(error, RecallboundError) and isinstance(error, ValueError)
    assert error.line == 3
    assert str(error).startswith("line 3")
    if field:
        assert error.field == field
        assert repr(field) in str(error)


def test_a_repeated_scenario_id_is_an_error() -> None:
    with pytest.raises(InvalidScenarioError) as caught:
        parse_scenarios(_line() + "\n" + _line())
    assert (caught.value.line, caught.value.field) == (2, "id")
    assert "line 1" in caught.value.reason


def test_load_scenarios_reports_bad_bytes_with_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(_line(id="a").encode() + b"\n" + b'{"id": "\xc3\x28"}\n')
    with pytest.raises(InvalidScenarioError, match="not UTF-8") as caught:
        load_scenarios(path)
    assert caught.value.line == 2


# -- metrics ------------------------------------------------------------------------------------


def test_metric_definitions() -> None:
    essential = frozenset({"a", "b"})
    assert recall_at_k(["x", "a", "y"], essential, 8) == 0.5
    assert recall_at_k(["a", "b"], essential, 1) == 0.5
    assert recall_at_k(["a"], frozenset(), 8) is None
    assert reciprocal_rank(["x", "y", "b"], essential, 8) == pytest.approx(1 / 3)
    assert reciprocal_rank(["x"], essential, 8) == 0.0
    assert ndcg_at_k(["a", "c"], {"a": 2, "c": 1}, 8) == pytest.approx(1.0)
    swapped = (1 + 3 / 1.584962500721156) / (3 + 1 / 1.584962500721156)
    assert ndcg_at_k(["c", "a"], {"a": 2, "c": 1}, 8) == pytest.approx(swapped)
    assert ndcg_at_k(["x"], {}, 8) is None


# -- the evaluator ------------------------------------------------------------------------------

_REPORTS: dict[str, Report] = {}


@pytest.fixture
async def report(anyio_backend: str) -> Report:
    """The examples file under the hashing adapter, evaluated once per backend."""
    if anyio_backend not in _REPORTS:
        evaluator = Evaluator(embedding=hashing_embedding())
        _REPORTS[anyio_backend] = await evaluator.evaluate(load_scenarios(EXAMPLES))
    return _REPORTS[anyio_backend]


async def test_task_context_helps_continuation_on_the_sparse_arm(report: Report) -> None:
    baseline = report.cell("baseline", "sparse", family="continuation")
    task_context = report.cell("task_context", "sparse", family="continuation")
    assert baseline.recall_at_k is not None and task_context.recall_at_k is not None
    assert task_context.recall_at_k > baseline.recall_at_k
    anaphoric = [report.cell(s, "sparse", family="anaphoric") for s in ("baseline",
                                                                       "task_context")]
    assert anaphoric[1].recall_at_k is not None and anaphoric[0].recall_at_k is not None
    assert anaphoric[1].recall_at_k > anaphoric[0].recall_at_k


async def test_task_context_does_not_rank_self_contained_requests_worse(
    report: Report,
) -> None:
    # The request leads the task-context query, and the ranking lets fragment order count,
    # so enrichment does not push a self-contained request's own answer down (sparse arm).
    for family in ("self_contained", "topic_switch"):
        baseline = report.cell("baseline", "sparse", family=family)
        task_context = report.cell("task_context", "sparse", family=family)
        assert baseline.ndcg_at_k is not None and task_context.ndcg_at_k is not None
        assert task_context.ndcg_at_k >= baseline.ndcg_at_k, family


async def test_no_forbidden_or_foreign_evidence_in_any_cell(report: Report) -> None:
    assert {(c.strategy, c.arm) for c in report.overall} == {
        (c.strategy.value, c.arm.value) for c in DEFAULT_CELLS
    }
    for metrics in (*report.overall, *report.by_family):
        assert (metrics.must_not, metrics.foreign) == (0, 0), metrics
    scenarios = {s.id: s for s in load_scenarios(EXAMPLES)}
    for row in report.rows:
        assert (row.must_not, row.foreign) == (0, 0), row
        scenario = scenarios[row.scenario_id]
        assert not set(row.retrieved) & (scenario.foreign_ids | set(scenario.must_not))


async def test_reserved_bounds_executed_in_every_cell(report: Report) -> None:
    policy = report.policy
    for metrics in (*report.overall, *report.by_family):
        assert metrics.reserved >= metrics.executed, metrics
        assert metrics.max_reserved <= policy.max_searches
    for row in report.rows:
        assert row.executed <= row.reserved <= policy.max_searches, row
        assert row.reserved == policy.automatic_slots  # one automatic round, own ledger
        assert (row.rounds, row.refused) == (1, 0)
    # Automatic recall ran: searches were executed in every cell.
    assert all(metrics.executed > 0 for metrics in report.overall)


async def test_a_long_request_takes_the_baseline_path(report: Report) -> None:
    rows = [r for r in report.rows if r.family == "long_request"]
    assert rows
    for row in rows:
        assert row.query_strategy == "baseline"
        expected = "request_too_large" if row.strategy == "task_context" else "default"
        assert row.baseline_reason == expected
    # Both strategies then form the very same query.
    by_scenario: dict[str, set[str]] = {}
    for row in rows:
        by_scenario.setdefault(row.scenario_id, set()).add(row.fingerprint)
    assert all(len(prints) == 1 for prints in by_scenario.values())
    others = [r for r in report.rows if r.family != "long_request" and r.strategy ==
              "task_context"]
    assert all(r.query_strategy == "task_context" for r in others)


async def test_the_table_and_json(report: Report) -> None:
    table = report.format_table()
    header = next(line for line in table.splitlines() if line.startswith("strategy"))
    for column in ("recall@8", "nDCG@8", "MRR", "must_not", "reserved", "executed"):
        assert column in header
    assert "By family:" in table
    for family in report.families:
        assert family in table
    data = json.loads(report.to_json())
    assert data["k"] == 8
    assert len(data["scenarios"]) == len(report.rows) == 20 * len(DEFAULT_CELLS)
    assert {m["arm"] for m in data["overall"]} == {"sparse", "semantic", "fused"}


async def test_the_same_file_gives_the_same_report(report: Report) -> None:
    again = await Evaluator(embedding=hashing_embedding()).evaluate(load_scenarios(EXAMPLES))
    assert again == report
    assert again.to_json() == report.to_json()
    assert again.format_table() == report.format_table()


async def test_scenarios_are_isolated_from_each_other() -> None:
    secret = "The zebra quartz protocol requires two keys."
    a = Scenario.from_json(_scenario(
        id="A",
        memories=[{"id": "a1", "text": secret, "principal": "u1", "scope": "proj"}],
        people=[{"name": "Zed", "beliefs": [{"id": "a-b1", "text": "Zed likes zebra quartz."}]}],
        state={"current_request": "What does the zebra quartz protocol require?"},
        relevant={"a1": 2}, must_not=[],
    ))
    b = Scenario.from_json(_scenario(
        id="B",
        memories=[{"id": "b1", "text": "Quartz clocks drift a little.", "principal": "u1",
                   "scope": "proj"}],
        people=[],
        state={"current_request": "What does the zebra quartz protocol require? Ask Zed."},
        relevant={"b1": 1}, must_not=[],
    ))
    evaluator = Evaluator(embedding=HashingEmbedding())
    result = await evaluator.evaluate([a, b, a])
    for row in result.results("A"):
        assert "a1" in row.retrieved, row
    for row in result.results("B"):
        assert set(row.retrieved) <= {"b1"}, row
        assert row.people == ()  # Zed is known only in scenario A's store
        assert (row.rounds, row.reserved) == (1, 2)  # a fresh ledger for every cell
    # Running A again after B gives exactly A's first results.
    first, second = result.rows[: len(DEFAULT_CELLS)], result.rows[-len(DEFAULT_CELLS):]
    assert first == second


async def test_a_withheld_semantic_query_is_reserved_not_executed() -> None:
    scenario = Scenario.from_json(_scenario(relevant={"m1": 2}))
    evaluator = Evaluator(
        embedding=HashingEmbedding(token_limit=1),
        cells=[Cell(QueryStrategy.TASK_CONTEXT, Arm.SEMANTIC), Cell("task_context", "sparse")],
    )
    result = await evaluator.evaluate([scenario])
    semantic, sparse = result.rows
    assert semantic.semantic_withheld == "token_limit"
    assert (semantic.reserved, semantic.executed, semantic.retrieved) == (2, 0, ())
    assert semantic.recall_at_k == 0.0
    assert sparse.executed >= 1 and "m1" in sparse.retrieved
    assert [c.name for c in result.cells] == ["task_context/semantic", "task_context/sparse"]


async def test_cells_share_the_policy() -> None:
    scenario = Scenario.from_json(_scenario())
    policy = AllowancePolicy(max_searches=1, automatic_slots=1)
    result = await Evaluator(embedding=HashingEmbedding(), policy=policy).evaluate([scenario])
    for row in result.rows:
        assert row.reserved == 1 and row.executed <= 1
    task_context = result.results("s1")[1]
    assert task_context.strategy == "task_context" and task_context.people == ("Alice",)
    assert task_context.bounded  # Alice was found but the delta read had no slot
    assert any("delta refused" in note for note in task_context.notes)


async def test_wordllama_on_a_subset() -> None:
    pytest.importorskip("wordllama")
    from plugin.memory.wordllama_adapter import WordLlamaAdapter

    scenarios = {s.id: s for s in load_scenarios(EXAMPLES)}
    subset = [scenarios["s01"], scenarios["s06"], scenarios["s18"]]
    result = await Evaluator(embedding=WordLlamaAdapter.load()).evaluate(subset)
    assert result.embedding == "wordllama-l2_supercat-256"
    assert len(result.rows) == 3 * len(DEFAULT_CELLS)
    for metrics in result.overall:
        assert (metrics.must_not, metrics.foreign) == (0, 0)
        assert metrics.reserved >= metrics.executed
    semantic = [r for r in result.rows if r.arm == "semantic" and r.scenario_id != "s18"]
    assert all(r.executed >= 1 and r.semantic_withheld is None for r in semantic)
    assert result.cell("task_context", "semantic").recall_at_k is not None


# -- the command line and the layering ---------------------------------------------------------


def test_python_m_plugin_evaluation_is_the_same_command(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "plugin.evaluation", "--scenarios", "examples/scenarios.jsonl",
         "--semantic", "hashing", "--out", str(out), "--quiet", "--determinism", "0"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "reserved" in result.stdout and "executed" in result.stdout
    assert "task_context - baseline" in result.stdout  # the one table renderer
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["embedding"].startswith("hashing")
    assert (out / "rankings.jsonl").exists() and (out / "report.md").exists()


def test_the_cli_reports_a_malformed_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(_line() + "\n" + _line(id="x", relevant={"m1": 5}) + "\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "plugin.evaluation", "--scenarios", str(path),
         "--out", str(tmp_path / "out"), "--semantic", "hashing", "--quiet"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("recallbound: ") and "line 2" in line and "relevant.m1" in line


def test_evaluation_does_not_import_the_runtime_hooks() -> None:
    for path in sorted((ROOT / "plugin" / "evaluation").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert not name.startswith("runtime_hooks"), (path, name)
