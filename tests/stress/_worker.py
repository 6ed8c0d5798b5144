"""A child process for the stress tests: ``python -m tests.stress._worker MODE JSON``.

Modes (one JSON line per event on stdout, flushed at once):
  runs    run the workload's agent runs for ``run_ids`` (a resumed run continues where another
          process left it); print {"event": "done", "taken": n, "runs": n}.
  faulty  print "started"; then, until every run is spent: reserve a round of a random run,
          print it once committed ("reserved"), pause, attempt (pausing inside), end the
          phase (writes traces). Kill me anywhere; "phase" events say where I was.
"""

from __future__ import annotations

import functools
import json
import random
import sys
from typing import Any

import anyio

from plugin.control import (
    AllowancePolicy,
    AttemptKind,
    ManualClock,
    RecallAllowance,
    RecallBudgetExceeded,
    RoundKind,
    SqliteLedger,
)

from .workload import LoadReport, agent_run


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


async def runs(args: dict[str, Any]) -> None:
    async with SqliteLedger(args["path"], timeout=60.0) as ledger:
        allowance = RecallAllowance(ledger, clock=ManualClock(wall=args["wall"]))
        report = LoadReport()
        async with anyio.create_task_group() as tg:
            for run_id in args["run_ids"]:
                tg.start_soon(
                    functools.partial(
                        agent_run, allowance, run_id, report,
                        automatic=args["automatic"], deliberate=args["deliberate"],
                    )
                )
        assert all(permit.closed for permit in report.permits)
        emit("done", taken=report.taken, runs=report.runs)


async def faulty(args: dict[str, Any]) -> None:
    rng = random.Random(args["seed"])
    pause = args["pause"]
    async with SqliteLedger(args["path"], timeout=60.0) as ledger:
        allowance = RecallAllowance(
            ledger, policy=AllowancePolicy(), clock=ManualClock(wall=args["wall"])
        )
        emit("started")
        refused_in_a_row = 0
        while refused_in_a_row < 50:  # every run spent: stop rather than spin
            run_id = f"{args['prefix']}run-{rng.randrange(args['runs'])}"
            kind = rng.choice([RoundKind.AUTOMATIC, RoundKind.DELIBERATE])
            try:
                async with allowance.round(
                    run_id, kind, slots=None if kind is RoundKind.AUTOMATIC else 3
                ) as permit:
                    emit("reserved", run_id=run_id, round_index=permit.round_index,
                         first_slot=permit.first_slot, slots=permit.slots)
                    emit("phase", where="between_reserve_and_attempt")
                    await anyio.sleep(rng.uniform(0, pause))
                    for _ in range(permit.slots):
                        async with permit.attempt(AttemptKind.DELIBERATE):
                            emit("phase", where="inside_attempt")
                            await anyio.sleep(rng.uniform(0, pause))
                    emit("phase", where="trace_write")
                refused_in_a_row = 0
            except RecallBudgetExceeded:
                refused_in_a_row += 1
                await anyio.sleep(0)
        emit("exhausted")


MODES = {"runs": runs, "faulty": faulty}


def main() -> None:
    mode, raw = sys.argv[1], sys.argv[2]
    args = json.loads(raw)
    anyio.run(MODES[mode], args, backend=args["backend"])


if __name__ == "__main__":
    main()
