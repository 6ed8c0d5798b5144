"""A stress file of wordy go-on requests: ``python -m bench.verbose_requests FILE > OUT``.

Writes the continuation scenarios of a scenario file (JSONL) with their current request
replaced, in turn, by one of eight go-on requests of five words or more, with filler and in
four languages ("ok so, um, keep going I guess", "passt schon, mach einfach weiter so"…). The
notes, the state and the grades are unchanged, so ``recallbound evaluate`` on the output,
against the same command on the file itself, shows what a wordier way of saying "go on" costs.
It checks the rule that a request carries content only through words the scope's notes hold
and that are not acknowledgements; it is not a set to tune on (the requests are templates).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

REQUESTS = (
    "ok so, um, keep going I guess",
    "alright, that all looks good to me, please carry on",
    "yes please, go ahead and do that now",
    "d'accord, on y va, continue comme prévu",
    "passt schon, mach einfach weiter so",
    "sounds good, let's keep moving on this",
    "sí, vale, sigue adelante por favor",
    "great, carry on with whatever is next",
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", type=Path)
    args = parser.parse_args()
    requests = itertools.cycle(REQUESTS)
    with args.scenarios.open(encoding="utf-8") as lines:
        for line in lines:
            scenario = json.loads(line)
            if scenario.get("family") != "continuation" or "state" not in scenario:
                continue
            scenario["state"]["current_request"] = next(requests)
            sys.stdout.write(json.dumps(scenario, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
