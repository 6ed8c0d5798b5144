"""Ranking variants on development data: ``python -m bench.tune_ranking [--scenarios FILE]``.

Runs a development file (default ``examples/devset.jsonl``; also the hand-written dev half
``examples/handwritten_dev.jsonl``, a hand-written development set and the LoCoMo dev split
converted under /tmp, never a test half or held-out data) once per named variant of
:class:`~plugin.memory.ranking.RankingPolicy` and prints recall@5 per arm, strategy and
family, plus task_context - baseline per family with the lower end of its 95 % interval.
``--only NAME`` runs one variant (repeatable); ``--set FIELD=VALUE`` (repeatable) runs the
defaults with those fields changed instead, e.g. ``--set entity=1.5 --set fragment_power=1``.

``--check-fusion`` is the regression check on long conversations: with ``--only default`` and
each LoCoMo dev conversion, it exits 1 when fused recall@5 is below the best single arm::

    for v in sc cont scctx; do
      python -m bench.tune_ranking --only default --check-fusion \
        --scenarios /tmp/locomo-s60/locomo_$v.jsonl || echo "fusion regression on $v"
    done
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from plugin.evaluation import Evaluator, stream_scenarios
from plugin.evaluation.analysis import ScoredRow, score_row, summarise
from plugin.evaluation.command import embedding_for
from plugin.memory.ranking import RankingPolicy

DEVSET = Path(__file__).resolve().parents[1] / "examples" / "devset.jsonl"

ROUND_ONE: dict[str, object] = {
    "question": 1.0, "constraint": 0.6, "entity": 0.6, "request_terms": 6,
    "request_power": 1.0, "semantic": 0.5, "words": 0.0,
}
"""The previous defaults (role weights, a linear request share, semantic weight 0.5)."""

FIRST: dict[str, object] = {**ROUND_ONE, "short_words": 6, "request_terms": 2}
"""The request share the first variants were measured with (before the request share was
tuned on the LoCoMo dev split)."""


def _policy(base: dict[str, object], **changes: object) -> RankingPolicy:
    return RankingPolicy(**{**base, **changes})  # type: ignore[arg-type]


def _round_three(**changes: object) -> RankingPolicy:
    """Rounds two and three: the semantic arm by sentence vectors alone."""
    return _policy({"words": 0.0}, **changes)


def _round_four(**changes: object) -> RankingPolicy:
    """Round four: the word match, fused with the rank constant 10 and weight 4."""
    return _policy({"rrf_k_words": 10, "semantic_words": 4.0}, **changes)


def _first(**changes: object) -> RankingPolicy:
    return _policy(FIRST, **changes)


def _round_one(**changes: object) -> RankingPolicy:
    return _policy(ROUND_ONE, **changes)


VARIANTS: dict[str, tuple[RankingPolicy, float | None]] = {
    "default": (RankingPolicy(), None),
    # Round five: the fusion's rank constant when the semantic arm matches words.
    "words-k0-semantic4": (RankingPolicy(semantic_words=4.0), None),
    "words-k0-semantic5": (RankingPolicy(semantic_words=5.0), None),
    "words-k0-semantic8": (RankingPolicy(semantic_words=8.0), None),
    "words-k1": (RankingPolicy(rrf_k_words=1), None),
    "words-k2": (RankingPolicy(rrf_k_words=2), None),
    # Round four: the semantic arm's word-level match (its share), and the semantic arm's
    # fusion weight when it matches words, with round four's rank constant (10).
    "words-k10": (_round_four(), None),
    "words0": (RankingPolicy(words=0.0), None),
    "words0.3": (_round_four(words=0.3, semantic_words=0.5), None),
    "words0.5-semantic0.5": (_round_four(semantic_words=0.5), None),
    "words0.7": (_round_four(words=0.7, semantic_words=0.5), None),
    "words-semantic1": (_round_four(semantic_words=1.0), None),
    "words-semantic1.5": (_round_four(semantic_words=1.5), None),
    "words-semantic2": (_round_four(semantic_words=2.0), None),
    "words-semantic3": (_round_four(semantic_words=3.0), None),
    "words-semantic6": (_round_four(semantic_words=6.0), None),
    "words-semantic4-k30": (_round_four(rrf_k_words=30), None),
    "words-score1": (_round_four(semantic_words=1.0, fusion="score"), None),
    "words-score2": (_round_four(semantic_words=2.0, fusion="score"), None),
    "words-equal": (_round_four(semantic_words=1.0, confidence=False), None),
    "words-semantic1.5-equal": (_round_four(semantic_words=1.5, confidence=False), None),
    # Round three: the turns around the best memories of a conversation (opt-in).
    "turns": (_round_three(adjacent=0.8), None),
    "turns-0.9": (_round_three(adjacent=0.9), None),
    "turns-one-source": (_round_three(adjacent=0.8, adjacent_sources=1), None),
    "turns-three-sources": (_round_three(adjacent=0.9, adjacent_sources=3), None),
    "turns-words": (RankingPolicy(adjacent=0.8), None),
    "turns-words-0.3": (RankingPolicy(adjacent=0.3), None),
    "turns-words-0.5": (RankingPolicy(adjacent=0.5), None),
    "turns-words-k10": (_round_four(adjacent=0.8), None),
    # Round two: names, ids and questions over the next action's common words; "Continue"
    # that the scope knows keeps a small share; no fixed lower weight for one arm.
    "round-one": (_round_one(), None),
    "r1-request-terms12": (_round_one(request_terms=12), None),
    "r1-share-bm25": (_round_one(fragment_scores="bm25"), None),
    "r1-entity1": (_round_one(entity=1.0, constraint=1.0), None),
    "r1-entity1.5-q1.5": (_round_one(entity=1.5, constraint=1.0, question=1.5,
                                     request_terms=12), None),
    "r1-entity2-q1.5": (_round_one(entity=2.0, constraint=1.0, question=1.5,
                                   request_terms=12), None),
    "r1-entity3-q1.5": (_round_one(entity=3.0, constraint=1.0, question=1.5,
                                   request_terms=12), None),
    "entity2-q2-linear": (_round_one(entity=2.0, constraint=1.0, question=2.0,
                                     request_terms=12), None),
    "entity2-q2-linear-semantic1": (_round_one(entity=2.0, constraint=1.0, question=2.0,
                                               request_terms=12, semantic=1.0), None),
    "r1-entity2-q1.5-semantic1": (_round_one(entity=2.0, constraint=1.0, question=1.5,
                                             request_terms=12, semantic=1.0), None),
    "r1-entity2-q1.5-equal-rrf": (_round_one(entity=2.0, constraint=1.0, question=1.5,
                                             request_terms=12, confidence=False,
                                             semantic=1.0), None),
    "r1-entity2-q1.5-rrf-k20": (_round_one(entity=2.0, constraint=1.0, question=1.5,
                                           request_terms=12, confidence=False, semantic=0.6,
                                           rrf_k=20), None),
    "round-three": (_round_three(), None),
    "default-semantic1": (_round_three(semantic=1.0), None),
    "default-semantic0.75": (_round_three(semantic=0.75), None),
    "default-rrf-k5": (_round_three(semantic=1.0, rrf_k=5), None),
    "default-rrf-k20": (_round_three(semantic=1.0, rrf_k=20), None),
    # Round one.
    "first": (_first(), None),
    "equal-rrf": (_first(confidence=False, rrf_k=60, semantic=1.0), None),
    "equal-rrf-floor": (_first(confidence=False, rrf_k=60, semantic=1.0), 0.25),
    "context0.05": (_first(context=0.05), None),
    "context0.3": (_first(context=0.3), None),
    "request8": (_first(request=8.0), None),
    "rrf-k10-semantic1": (_first(semantic=1.0), None),
    "rrf-k60": (_first(rrf_k=60, semantic=1.0), None),
    "score": (_first(fusion="score", semantic=1.0), None),
    "score-semantic0.5": (_first(fusion="score"), None),
    "rrf-k3": (_first(rrf_k=3, semantic=1.0), None),
    "k10-semantic0.3": (_first(semantic=0.3), None),
    "k20-semantic0.5": (_first(rrf_k=20), None),
    "context0": (_first(context=0.0), None),
    "next2": (_first(next_action=2.0), None),
    "next3": (_first(next_action=3.0), None),
    "sparse2": (_first(sparse=2.0), None),
    "entity0.3": (_first(entity=0.3), None),
    "request-terms3": (_first(request_terms=3), None),
    "request-terms4": (_first(request_terms=4), None),
    "request-terms6": (_first(request_terms=6), None),
    "rt4-short4": (_round_one(request_terms=4, short_words=4), None),
    "rt6-short4": (_round_one(request_terms=6, short_words=4), None),
}


def summary_for(
    policy: RankingPolicy, path: Path, *, floor: float | None = None,
    semantic: str | None = None, limit: int | None = None, ks: tuple[int, ...] = (5, 10),
    resamples: int = 1000,
) -> dict[str, Any]:
    """Evaluate ``path`` (its first ``limit`` scenarios) under ``policy``; the evaluator's
    summary (``results`` and ``differences``) at the cut-offs ``ks``."""
    evaluator = Evaluator(embedding=embedding_for(semantic), ranking=policy,
                          min_similarity=floor)
    scored: list[ScoredRow] = []

    def collect(scenario, rows):  # type: ignore[no-untyped-def]
        scored.extend(score_row(row, scenario, ks) for row in rows)

    scenarios = stream_scenarios(path)
    if limit:
        scenarios = itertools.islice(scenarios, limit)  # type: ignore[assignment]
    anyio.run(lambda: evaluator.evaluate(scenarios, on_scenario=collect))
    return summarise(scored, ks, resamples=resamples)


def run(name: str, policy: RankingPolicy, floor: float | None, semantic: str | None,
        path: Path, limit: int | None) -> list[str]:
    """Print the variant's table; return where fused recall@5 is below the best single arm
    (over the whole file, per strategy)."""
    started = time.monotonic()
    summary = summary_for(policy, path, floor=floor, semantic=semantic, limit=limit)
    results, diffs = summary["results"], summary["differences"]
    families = list(results["sparse"]["baseline"])
    print(f"== {name}: {policy}, floor {floor} ({time.monotonic() - started:.0f}s)")
    print(f"{'arm':<9}{'strategy':<13}" + "".join(f"{f[:14]:>15}" for f in families))
    for arm in results:
        for strategy in results[arm]:
            cells = results[arm][strategy]
            print(f"{arm:<9}{strategy:<13}" + "".join(
                f"{cells[f]['recall@5']:>15.3f}" for f in families))
        print(f"{arm:<9}{'difference':<13}" + "".join(
            f"{diffs[arm][f]['recall@5']['mean']:>+8.3f}"
            f"[{diffs[arm][f]['recall@5']['ci95'][0]:+.2f}]" for f in families))
    sys.stdout.flush()
    below = []
    for strategy in results.get("fused", {}):
        fused = results["fused"][strategy]["all"]["recall@5"]
        best = max(results[arm][strategy]["all"]["recall@5"] for arm in ("sparse", "semantic"))
        if fused < best - 1e-9:
            below.append(f"{name} {path.name} {strategy}: fused {fused:.3f} < best arm {best:.3f}")
    return below


def _setting(item: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` as a field name and a JSON value (a bare word stays a string)."""
    name, _, value = item.partition("=")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--semantic", default=None)
    parser.add_argument("--only", action="append")
    parser.add_argument("--scenarios", type=Path, default=DEVSET)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--check-fusion", action="store_true",
                        help="exit 1 when fused recall@5 is below the best single arm")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="the defaults with these RankingPolicy fields changed")
    args = parser.parse_args()
    below: list[str] = []
    if args.set:
        try:
            changed = RankingPolicy(**dict(_setting(item) for item in args.set))
        except (TypeError, ValueError) as error:
            parser.error(f"--set: {error}")
        below += run(" ".join(args.set), changed, None, args.semantic, args.scenarios,
                     args.limit)
    for name, (policy, floor) in VARIANTS.items():
        if (args.set and not args.only) or (args.only and name not in args.only):
            continue
        below += run(name, policy, floor, args.semantic, args.scenarios, args.limit)
    for line in below:
        print(f"fusion regression: {line}", file=sys.stderr)
    return 1 if args.check_fusion and below else 0


if __name__ == "__main__":
    sys.exit(main())
