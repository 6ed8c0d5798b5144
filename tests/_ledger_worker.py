"""A child process for tests/test_ledger_processes.py: ``python _ledger_worker.py MODE JSON``.

Each mode opens the ledger named in the JSON arguments on the backend named there, with a
:class:`ManualClock` at the wall time given (so every process agrees on time), and writes one
JSON line per event to stdout (flushed at once: the parent reads them while we run).

Modes:
  race    print "ready", wait for "go" on stdin, then open the ledger and reserve one round.
  hold    reserve a round, take a slot, print the reservation, then block forever (SIGKILL me).
  resume  reserve a round of a run an earlier (killed) process opened; run one attempt.
  stream  reserve rounds and run attempts in a loop, forever (SIGKILL me at a random moment).
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import anyio
import sniffio

from plugin.control import (
    AllowancePolicy,
    ManualClock,
    RecallAllowance,
    RecallBudgetExceeded,
    RoundKind,
    SqliteLedger,
)


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def _allowance(ledger: SqliteLedger, args: dict[str, Any]) -> RecallAllowance:
    return RecallAllowance(
        ledger,
        policy=AllowancePolicy(**args.get("policy", {})),
        clock=ManualClock(wall=args["wall"]),
    )


async def race(args: dict[str, Any]) -> None:
    emit("ready")
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("no go")
    async with SqliteLedger(args["path"]) as ledger:
        allowance = _allowance(ledger, args)
        try:
            async with allowance.round(
                args["run_id"], RoundKind.DELIBERATE, slots=args["slots"]
            ) as permit:
                emit(
                    "granted", backend=sniffio.current_async_library(),
                    round_index=permit.round_index, first_slot=permit.first_slot,
                    slots=permit.slots,
                )
        except RecallBudgetExceeded as exc:
            emit("refused", backend=sniffio.current_async_library(), reason=exc.reason.value)


async def hold(args: dict[str, Any]) -> None:
    async with SqliteLedger(args["path"]) as ledger:
        allowance = _allowance(ledger, args)
        async with allowance.round(args["run_id"], RoundKind.AUTOMATIC) as permit:
            async with permit.attempt() as slot:
                emit(
                    "reserved", round_index=permit.round_index, first_slot=permit.first_slot,
                    slots=permit.slots, slot=slot, deadline_wall=permit.deadline_wall,
                )
                await anyio.sleep_forever()


async def resume(args: dict[str, Any]) -> None:
    async with SqliteLedger(args["path"]) as ledger:
        old = await ledger.reservations(args["run_id"])
        allowance = _allowance(ledger, args)
        async with allowance.round(
            args["run_id"], RoundKind.DELIBERATE, slots=args["slots"]
        ) as permit:
            async with permit.attempt() as slot:
                pass
            emit(
                "resumed", old_rounds=len(old), round_index=permit.round_index,
                first_slot=permit.first_slot, slots=permit.slots, slot=slot,
                deadline_wall=permit.deadline_wall, seconds_left=permit.seconds_left(),
            )


async def stream(args: dict[str, Any]) -> None:
    rng = random.Random(args["seed"])
    async with SqliteLedger(args["path"]) as ledger:
        allowance = _allowance(ledger, args)
        n = 0
        while True:
            run_id = f"stream-{rng.randrange(args['runs'])}"
            async with allowance.round(
                run_id, RoundKind.DELIBERATE, slots=rng.randint(1, 4)
            ) as permit:
                for _ in range(rng.randint(0, permit.slots)):
                    async with permit.attempt():
                        pass
            n += 1
            if n == 1:
                emit("started")


MODES = {"race": race, "hold": hold, "resume": resume, "stream": stream}


def main() -> None:
    mode, raw = sys.argv[1], sys.argv[2]
    args = json.loads(raw)
    anyio.run(MODES[mode], args, backend=args["backend"])


if __name__ == "__main__":
    main()
