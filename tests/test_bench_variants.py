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

HARDER_B = Path(__file__).resolve().parents[1] / "examples" / "harder_b.jsonl"

#: Variants whose change reaches the first scenarios of harder B's task-context rankings.
#: ``beliefs-words-once`` places beliefs, which these scenarios do not read.
CHANGES_RANKINGS = sorted(set(retrieval_variants.VARIANTS) - {"default", "beliefs-words-once"})


def _shipped() -> list[object]:
    return [pipeline.MemoryRetriever._rank, pipeline.MemoryRetriever._sparse,
            pipeline.MemoryRetriever._semantic, pipeline.WordQuery, pipeline.combined_vector,
            pipeline.weighted_score_fuse, pipeline.fragment_weights, MemoryStore.sparse_candidates,
            words.WordIndex.scores, words.WordIndex.best_matches, vectors.Matrix.scores,
            vectors.mixed, ranking.query_coverage]


def _rankings(count: int = 6) -> dict[tuple[str, str, str], tuple[str, ...]]:
    """Each task-context row's ranked ids, by scenario and arm, for the first ``count``."""
    evaluator = Evaluator(embedding=embedding_for(None), ranking=RankingPolicy())
    found: dict[tuple[str, str, str], tuple[str, ...]] = {}

    def collect(scenario: Scenario, rows: list[ScenarioResult]) -> None:
        for row in rows:
            if row.strategy == "task_context":
                found[(row.scenario_id, str(row.arm), row.strategy)] = tuple(row.ranked)

    scenarios = itertools.islice(stream_scenarios(HARDER_B), count)
    anyio.run(lambda: evaluator.evaluate(scenarios, on_scenario=collect))
    return found


@pytest.fixture(scope="module")
def shipped_rankings() -> dict[tuple[str, str, str], tuple[str, ...]]:
    return _rankings()


@pytest.mark.parametrize("name", sorted(retrieval_variants.VARIANTS))
def test_a_variant_evaluates_and_leaves_the_shipped_code_as_it_was(
    name: str, shipped_rankings: dict[tuple[str, str, str], tuple[str, ...]]
) -> None:
    before = _shipped()
    with retrieval_variants.VARIANTS[name]():
        patched = _rankings()
    assert _shipped() == before
    assert patched.keys() == shipped_rankings.keys()
    changed = [key for key in patched if patched[key] != shipped_rankings[key]]
    if name in CHANGES_RANKINGS:
        assert changed, f"{name} changed no ranking: its patch no longer reaches the arms"
    else:
        assert not changed
