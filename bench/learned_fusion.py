"""Fusion learned from data, measured and not kept: a linear re-ranking of the arms' first ten.

The shipped fusion adds each arm's ``weight / rank`` (the weights by hand, times each arm's
peakedness). This bench asks whether weights fitted on data, over the same ranks and a few
more signals, order the candidates better. For each scenario's task-context round, the
candidates are the union of the sparse, semantic and fused arms' first ten; each gets up to
nine features in three groups:

- ``ranks``: ``1 / rank`` in the sparse, semantic and fused lists (0 where absent);
- ``words``: the cell's rarity (idf, over ``log(n + 1)``) of the rarest content word the
  memory shares with the state, the sum of the shared words' idf (over 3), the share of the
  state's six fields (objective, next action, open tasks, questions, constraints, facts) it
  shares a content word with, and 1 when only the next action's words are shared;
- ``fields``: the memory's sentence cosine with each field, standardised over the
  candidates, as its best z-score and as the mean square root of its positive z-scores.

A pairwise logistic model (RankNet: every needed memory against every other candidate of the
same scenario, L2 0.01, 400 full-batch gradient steps, so the fit is deterministic) is fitted on
the ``--train`` files and scores the candidates of every file. The table gives continuation
recall@5 (all families for files without continuation requests) of the arms, the shipped
fused ranking, the learned one, and the pool's ceiling (the needed memories among the
candidates, at most five)::

    python -m bench.learned_fusion --train DEV.jsonl --test examples/harder_a.jsonl \
        --test examples/harder_b.jsonl [--features ranks,words,fields] [--semantic MODEL]

The figures are in the evaluation documentation.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import anyio
import attrs
import numpy as np
import numpy.typing as npt

from plugin.evaluation import Evaluator, stream_scenarios
from plugin.evaluation.command import SEMANTIC_CHOICES, embedding_for
from plugin.evaluation.results import Cell, ScenarioResult, recall_at_k
from plugin.evaluation.scenario_values import Scenario
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.state import WorkingState
from plugin.memory.terms import content_terms

ARMS = ("sparse", "semantic", "fused")
POOL = 10
GROUPS = {"ranks": 3, "words": 4, "fields": 2}
Floats = npt.NDArray[np.float64]


@attrs.frozen
class Candidates:
    """One scenario's task-context candidates, their features and what each arm ranked."""

    family: str
    ids: tuple[str, ...]
    features: Floats
    needed: frozenset[str]
    ranked: dict[str, tuple[str, ...]]

    def recall(self, ranking: Sequence[str], k: int = 5) -> float:
        found = recall_at_k(ranking, self.needed, k)
        assert found is not None  # only scenarios with needed memories are candidates
        return found

    def ceiling(self, k: int = 5) -> float:
        return min(k, len(self.needed.intersection(self.ids))) / len(self.needed)


def state_fields(state: WorkingState) -> list[str]:
    """The six fields a memory can share words with (the request is left out)."""
    return [
        state.objective,
        state.next_action,
        " ".join(task.text for task in state.tasks if not task.done),
        " ".join(state.open_questions),
        " ".join(state.constraints),
        " ".join(f"{fact.text} {' '.join(fact.entities)}" for fact in state.facts),
    ]


def _words(text: str) -> frozenset[str]:
    return frozenset(term for term in content_terms(text) if len(term) > 1)


def word_features(memory: frozenset[str], fields: Sequence[frozenset[str]],
                  idf: dict[str, float]) -> list[float]:
    shared = frozenset[str]().union(*(memory & field for field in fields))
    rarities = [idf.get(word, 1.0) for word in shared]
    next_only = bool(memory & fields[1]) and not any(
        memory & field for i, field in enumerate(fields) if i != 1)
    return [max(rarities, default=0.0), sum(rarities) / 3,
            sum(1 for field in fields if memory & field) / len(fields), float(next_only)]


def field_features(embedding: EmbeddingAdapter, texts: Sequence[str],
                   fields: Sequence[str]) -> Floats:
    """Per candidate: the best z-score of its cosine with a field, and the mean square root
    of its positive z-scores (z over the candidates, per field)."""
    present = [field for field in fields if field.strip()]
    if not present:
        return np.zeros((len(texts), 2))
    vectors = np.asarray(embedding.embed([*texts, *present]), dtype=np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True) + 1e-12
    cosines = vectors[: len(texts)] @ vectors[len(texts):].T
    z = (cosines - cosines.mean(axis=0)) / (cosines.std(axis=0) + 1e-9)
    return np.column_stack([z.max(axis=1),
                            np.sqrt(np.clip(z, 0.0, None)).sum(axis=1) / len(present)])


def candidates(scenario: Scenario, rows: Iterable[ScenarioResult],
               embedding: EmbeddingAdapter, groups: Sequence[str]) -> Candidates | None:
    ranked = {row.arm: row.ranked for row in rows if row.strategy == "task_context"}
    if not scenario.essential or set(ranked) != set(ARMS):
        return None
    texts = {m.id: m.text for m in scenario.memories
             if (m.principal, m.scope) == (scenario.principal, scenario.scope)}
    texts.update((b.id, b.text) for person in scenario.people for b in person.beliefs)
    ids = tuple(dict.fromkeys(i for arm in ARMS for i in ranked[arm][:POOL]))
    columns: list[Floats] = []
    if "ranks" in groups:
        columns.append(np.array([[1 / (ranked[arm][:POOL].index(i) + 1)
                                  if i in ranked[arm][:POOL] else 0.0 for arm in ARMS]
                                 for i in ids]))
    fields = state_fields(scenario.state)
    if "words" in groups:
        words = {i: _words(text) for i, text in texts.items()}
        frequency = Counter(word for memory in words.values() for word in memory)
        scale = math.log(len(words) + 1)
        idf = {word: math.log((len(words) + 1) / (df + 0.5)) / scale
               for word, df in frequency.items()}
        field_words = [_words(field) for field in fields]
        columns.append(np.array([word_features(words[i], field_words, idf) for i in ids]))
    if "fields" in groups:
        columns.append(field_features(embedding, [texts[i] for i in ids], fields))
    return Candidates(scenario.family, ids, np.hstack(columns), scenario.essential,
                      {arm: ranked[arm] for arm in ARMS})


def collect(path: Path, evaluator: Evaluator, groups: Sequence[str]) -> list[Candidates]:
    found: list[Candidates] = []

    def keep(scenario: Scenario, rows: Sequence[ScenarioResult]) -> None:
        pool = candidates(scenario, rows, evaluator.embedding, groups)
        if pool is not None:
            found.append(pool)

    anyio.run(lambda: evaluator.evaluate(stream_scenarios(path), on_scenario=keep))
    return found


def fit(pools: Sequence[Candidates], *, l2: float = 0.01, steps: int = 400,
        rate: float = 0.5) -> Floats:
    """Pairwise logistic weights: each needed memory against every other candidate."""
    pairs = [pool.features[i] - pool.features[j] for pool in pools
             for i, a in enumerate(pool.ids) if a in pool.needed
             for j, b in enumerate(pool.ids) if b not in pool.needed]
    differences = np.array(pairs)
    weights = np.zeros(differences.shape[1])
    for _ in range(steps):
        margins = np.clip(differences @ weights, -30.0, 30.0)
        gradient = -(differences / (1 + np.exp(margins))[:, None]).mean(axis=0) + l2 * weights
        weights -= rate * gradient
    return weights


def learned_ranking(pool: Candidates, weights: Floats) -> tuple[str, ...]:
    order = np.argsort(-(pool.features @ weights), kind="stable")
    return tuple(pool.ids[i] for i in order)


def table(name: str, pools: Sequence[Candidates], weights: Floats) -> str:
    chosen = [p for p in pools if p.family == "continuation"] or list(pools)
    family = "continuation" if chosen[0].family == "continuation" else "all"

    def mean(values: Iterable[float]) -> float:
        return float(np.mean(list(values)))

    cells = [mean(p.recall(p.ranked[arm]) for p in chosen) for arm in ARMS]
    learned = mean(p.recall(learned_ranking(p, weights)) for p in chosen)
    ceiling = mean(p.ceiling() for p in chosen)
    return (f"{name:<28}{family:<14}{len(chosen):>5}" + "".join(f"{v:>10.3f}" for v in cells)
            + f"{learned:>10.3f}{ceiling:>10.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, action="append", required=True)
    parser.add_argument("--test", type=Path, action="append", default=[])
    parser.add_argument("--features", default="ranks,words,fields")
    parser.add_argument("--semantic", choices=SEMANTIC_CHOICES, default=None,
                        help="the semantic arm's model (default: the best installed)")
    args = parser.parse_args(argv)
    groups = [group for group in args.features.split(",") if group]
    if not groups or set(groups) - set(GROUPS):
        parser.error(f"--features: a comma-separated subset of {', '.join(GROUPS)}")
    cells = tuple(Cell("task_context", arm) for arm in ARMS)
    evaluator = Evaluator(embedding=embedding_for(args.semantic), cells=cells)
    files = list(dict.fromkeys([*args.train, *args.test]))
    pools = {path: collect(path, evaluator, groups) for path in files}
    weights = fit([pool for path in args.train for pool in pools[path]])
    print(f"features {','.join(groups)}; weights {np.round(weights, 3).tolist()}")
    print(f"{'file':<28}{'family':<14}{'n':>5}" + "".join(
        f"{label:>10}" for label in (*ARMS, "learned", "ceiling")))
    for path in files:
        print(table(path.name + (" (train)" if path in args.train else ""), pools[path], weights))
    return 0


if __name__ == "__main__":
    sys.exit(main())
