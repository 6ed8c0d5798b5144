"""The bench's retrieval variants (measured and not kept, kept runnable): each one, patched over
the shipped code, evaluates a scenario file, changes what it says it changes, and leaves the
shipped code as it was."""

from __future__ import annotations

import itertools
from pathlib import Path

import anyio
import pytest

from bench import retrieval_variants
from plugin.evaluation import Evaluator, Scenario, stream_scenarios
from plugin.evaluation.command import embedding_for
from plugin.evaluation.evaluator import ScenarioResult
from plugin.memory import pipeline, ranking
from plugin.memory.ranking import RankingPolicy
from plugin.memory.store import MemoryStore, vectors, words

pytest.importorskip("wordllama")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HARDER_B = EXAMPLES / "harder_b.jsonl"

#: Variants whose change reaches the first scenarios of harder B's task-context rankings, by
#: model. ``beliefs-words-once`` places beliefs, which these scenarios do not read;
#: ``request-new-words`` weighs a short request that holds a word the state lacks, which none
#: of them has (a test below runs it on a request that has one); ``fragment-words`` is how
#: MiniLM's arm, which borrows WordLlama's words, scores them already.
CHANGES_RANKINGS = {
    "wordllama": sorted(set(retrieval_variants.VARIANTS)
                        - {"default", "beliefs-words-once", "request-new-words"}),
    "minilm": sorted(set(retrieval_variants.VARIANTS)
                     - {"default", "beliefs-words-once", "request-new-words", "fragment-words"}),
}


def _shipped() -> list[object]:
    return [pipeline.MemoryRetriever._rank, pipeline.MemoryRetriever._sparse,
            pipeline.MemoryRetriever._semantic, pipeline.MemoryRetriever._request_share,
            pipeline.WordQuery, pipeline.combined_vector,
            pipeline.weighted_score_fuse, pipeline.fragment_weights, MemoryStore.sparse_candidates,
            words.WordIndex.scores, words.WordIndex.scored, words.WordIndex.best_matches,
            vectors.Matrix.scores, vectors.mixed, ranking.query_coverage]


def _rankings(count: int = 6, path: Path = HARDER_B, only: str | None = None,
              model: str = "wordllama") -> dict[tuple[str, str, str], tuple[str, ...]]:
    """Each task-context row's ranked ids, by scenario and arm, for the first ``count`` of
    ``path`` (or for the scenario ``only`` alone), with the semantic arm's ``model``."""
    evaluator = Evaluator(embedding=embedding_for(model), ranking=RankingPolicy())
    found: dict[tuple[str, str, str], tuple[str, ...]] = {}

    def collect(scenario: Scenario, rows: list[ScenarioResult]) -> None:
        for row in rows:
            if row.strategy == "task_context":
                found[(row.scenario_id, str(row.arm), row.strategy)] = tuple(row.ranked)

    scenarios = (itertools.islice(stream_scenarios(path), count) if only is None
                 else (s for s in stream_scenarios(path) if s.id == only))
    anyio.run(lambda: evaluator.evaluate(scenarios, on_scenario=collect))
    return found


@pytest.fixture(scope="module", params=sorted(CHANGES_RANKINGS))
def model(request: pytest.FixtureRequest) -> str:
    """The variants run on both semantic arms: WordLlama's, on which most were measured, and
    MiniLM's with WordLlama's words, the default where both extras are installed."""
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def shipped_rankings(model: str) -> dict[tuple[str, str, str], tuple[str, ...]]:
    return _rankings(model=model)


@pytest.mark.parametrize("name", sorted(retrieval_variants.VARIANTS))
def test_a_variant_evaluates_and_leaves_the_shipped_code_as_it_was(
    name: str, model: str, shipped_rankings: dict[tuple[str, str, str], tuple[str, ...]]
) -> None:
    before = _shipped()
    with retrieval_variants.VARIANTS[name]():
        patched = _rankings(model=model)
    assert _shipped() == before
    assert patched.keys() == shipped_rankings.keys()
    changed = [key for key in patched if patched[key] != shipped_rankings[key]]
    if name in CHANGES_RANKINGS[model]:
        assert changed, f"{name} changed no ranking: its patch no longer reaches the arms"
    else:
        assert not changed


def test_request_new_words_weighs_a_short_request_that_names_what_the_state_does_not() -> None:
    # "honeymoon flights next" while the state plans the seating: "honeymoon" is in the notes,
    # not in the state, so the request keeps its whole weight instead of a sixteenth.
    shipped = _rankings(path=EXAMPLES / "harder_a.jsonl", only="a039")
    with retrieval_variants.VARIANTS["request-new-words"]():
        patched = _rankings(path=EXAMPLES / "harder_a.jsonl", only="a039")
    assert patched.keys() == shipped.keys() and len(shipped) == 3
    assert patched[("a039", "semantic", "task_context")] != shipped[
        ("a039", "semantic", "task_context")]


def test_request_topicality_lists_the_requests_no_note_holds_a_word_of(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``bench.request_topicality`` measures the requests that weigh 0 today: B's marathon
    request (no note says "marathon") is listed with its family; "switch to the talk slides"
    (the notes say "slides") and "continue" (no content word) are not."""
    from bench import request_topicality

    assert request_topicality.main([str(HARDER_B)]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert "b037" in rows and "topic_switch" in rows["b037"] and "marathon" in rows["b037"]
    assert "b040" not in rows and "b001" not in rows
    best = float(rows["b037"].split()[2])
    assert -1.0 <= best <= 1.0
