"""Can a request's sentence vector tell a new topic from "go on"? ``python -m
bench.request_topicality FILE [FILE ...]`` (the default model: MiniLM with both extras).

A request carries content when the scope's notes hold one of its words. "switching to the
marathon stuff for a sec", in a scope whose notes say "Chicago", "32k" and "taper", holds
none, so it weighs what "继续" weighs: nothing. This prints, for every scenario whose request
has content words and none of them in the scope, how close the request's sentence vector comes
to the scope's notes: the best cosine, its lead over the fifth, and its z-score over all the
notes, with the scenario's family. A threshold that puts every topic switch above every
continuation and anaphoric request would be a rule worth measuring; the table says whether
there is one.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

from plugin.evaluation.scenarios import load_scenarios
from plugin.memory.embedding_choice import best_installed, load_embedding
from plugin.memory.ranking import request_terms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.request_topicality")
    parser.add_argument("scenarios", type=Path, nargs="+")
    args = parser.parse_args(argv)
    adapter = load_embedding(best_installed())
    if adapter is None:
        print("no semantic model is installed", file=sys.stderr)
        return 2
    print(f"model: {adapter.name}")
    print(f"{'scenario':<10} {'family':<26} {'best':>6} {'lead':>6} {'z':>5}  request")
    for path in args.scenarios:
        for scenario in load_scenarios(path):
            request = scenario.state.current_request
            texts = [m.text for m in scenario.memories
                     if (m.principal, m.scope) == (scenario.principal, scenario.scope)]
            vocabulary = {w for t in texts for w in re.findall(r"\w+", t.lower())}
            content, _ = request_terms(request)
            if not content or any(term.lower() in vocabulary for term in content):
                continue
            vectors = adapter.embed([request, *texts])
            cosines = np.sort(vectors[1:] @ vectors[0])[::-1]
            lead = cosines[0] - cosines[min(4, len(cosines) - 1)]
            z = (cosines[0] - cosines.mean()) / (cosines.std() + 1e-9)
            print(f"{scenario.id:<10} {scenario.family:<26} {cosines[0]:6.3f} {lead:6.3f} "
                  f"{z:5.2f}  {request[:60]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
