"""A coordinate search of the role weights on a development file:
``python -m bench.search_weights --scenarios FILE``.

Six parameters are searched: the weights of the next action, the tasks, the open questions,
the objective, the constraints and the entities (:class:`~plugin.memory.ranking.RankingPolicy`;
the request's weight does not take part: a go-on request carries no content). From the
defaults, each weight in turn is multiplied by each ``--steps`` factor, one at a time, and a
change is kept when it raises the objective by more than ``--margin`` while fused recall@5
stays at least its best arm's over the file; passes repeat until none is kept (at most
``--passes``). The objective sums three task-context recall@5 figures: the semantic and the
sparse arms' on ``--family`` (continuation), and fused over the whole file.

The margin is one scenario's worth of noise on the development set (a continuation note
found or lost moves a family's recall by 1/55 to 1/110): a change is kept only when it gains
more than a note. The figures are in the evaluation documentation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from plugin.memory.ranking import RankingPolicy

from .tune_ranking import DEVSET, summary_for

ROLES = ("next_action", "task", "question", "objective", "constraint", "entity")


def measure(path: Path, weights: dict[str, float], family: str) -> dict[str, float]:
    """Task-context recall@5: the arms' on ``family``, fused and the best arm's overall."""
    results = summary_for(RankingPolicy(**weights), path, ks=(5,), resamples=10)["results"]

    def recall(arm: str, cell: str) -> float:
        return float(results[arm]["task_context"][cell]["recall@5"])

    return {"semantic": recall("semantic", family), "sparse": recall("sparse", family),
            "fused": recall("fused", "all"),
            "best arm": max(recall("semantic", "all"), recall("sparse", "all"))}


def objective(figures: dict[str, float]) -> float:
    return figures["semantic"] + figures["sparse"] + figures["fused"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenarios", type=Path, default=DEVSET)
    parser.add_argument("--family", default="continuation")
    parser.add_argument("--steps", type=float, nargs="+", default=[0.5, 1.5])
    parser.add_argument("--margin", type=float, default=0.012)
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    defaults = RankingPolicy()
    weights = {role: float(getattr(defaults, role)) for role in ROLES}
    figures = measure(args.scenarios, weights, args.family)
    best = objective(figures)
    print(f"defaults {weights}: {figures} objective {best:.4f}", flush=True)
    for _ in range(args.passes):
        kept = False
        for role in ROLES:
            for step in args.steps:
                trial = {**weights, role: weights[role] * step}
                found = measure(args.scenarios, trial, args.family)
                score = objective(found)
                print(f"  {role} x{step}: {found} objective {score:.4f}", flush=True)
                if score > best + args.margin and found["fused"] >= found["best arm"] - 1e-9:
                    weights, figures, best, kept = trial, found, score, True
                    print(f"kept {weights}", flush=True)
                    break
        if not kept:
            break
    print(f"result {weights}: {figures} objective {best:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
