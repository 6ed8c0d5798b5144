"""A fleet worker for tests/test_postgres_fleet.py: ``python _pg_fleet_worker.py MODE JSON``.

Each process opens one :class:`PostgresLedger` (the DSN and schema named in the JSON arguments,
the server's clock, the fleet default) on the backend named there, and writes one JSON line per
event to stdout, flushed at once (the parent reads them while we run).

Modes:
  fleet   reserve one deliberate round of each of ``runs`` runs (in an order of this worker's
          own), run attempts in it, and report every grant and refusal at the end.
  hold    reserve a round, take a slot, report, then block forever (SIGKILL me).
  resume  reserve a round of a run another (killed) process opened; run its attempts.
  one     reserve a round of one run; on a ledger failure report it and retry until granted.
  stream  reserve rounds of random runs and run attempts, reporting each grant at once, until
          the file ``stop`` names exists (ledger failures are reported, then retried).
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any

import anyio
import sniffio

from plugin import PostgresLedger
from plugin.control import (
    AllowancePolicy,
    Permit,
    RecallAllowance,
    RecallBudgetExceeded,
    RoundKind,
    SystemClock,
)
from plugin.errors import LedgerError

DELIB = RoundKind.DELIBERATE


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def _ledger(args: dict[str, Any]) -> PostgresLedger:
    return PostgresLedger(args["dsn"], schema=args["schema"], max_size=args.get("pool", 4),
                          pool_timeout=args.get("pool_timeout", 10.0))


def _allowance(ledger: PostgresLedger, args: dict[str, Any]) -> RecallAllowance:
    return RecallAllowance(
        ledger, policy=AllowancePolicy(**args.get("policy", {})), clock=SystemClock()
    )


def _grant(run_id: str, permit: Permit, **more: Any) -> dict[str, Any]:
    return {"run_id": run_id, "round_index": permit.round_index,
            "first_slot": permit.first_slot, "slots": permit.slots, **more}


async def fleet(args: dict[str, Any]) -> None:
    rng = random.Random(args["seed"] * 1000 + args["worker"])
    runs = [f"run-{i:05d}" for i in range(args["runs"])]
    shift = args["worker"] * len(runs) // args["workers"]
    order = runs[shift:] + runs[:shift]  # each run is opened by one worker, resumed by others
    granted: list[dict[str, Any]] = []
    refused: dict[str, int] = {}
    limiter = anyio.CapacityLimiter(args["concurrency"])

    async def one(run_id: str, slots: int, attempts: int) -> None:
        async with limiter:
            try:
                async with allowance.round(run_id, DELIB, slots=slots) as permit:
                    taken = [await _attempt(permit) for _ in range(min(attempts, permit.slots))]
                    granted.append(_grant(run_id, permit, taken=taken))
            except RecallBudgetExceeded as exc:
                refused[exc.reason.value] = refused.get(exc.reason.value, 0) + 1

    async with _ledger(args) as ledger:
        allowance = _allowance(ledger, args)
        emit("ready")
        async with anyio.create_task_group() as tg:
            for run_id in order:
                tg.start_soon(one, run_id, rng.randint(1, 3), rng.randint(0, 3))
    emit("done", backend=sniffio.current_async_library(), granted=granted, refused=refused)


async def _attempt(permit: Permit) -> int:
    async with permit.attempt() as slot:
        return slot


async def hold(args: dict[str, Any]) -> None:
    async with _ledger(args) as ledger:
        allowance = _allowance(ledger, args)
        async with allowance.round(args["run_id"], DELIB, slots=args["slots"]) as permit:
            async with permit.attempt() as slot:
                emit("reserved", slot=slot, **_grant(args["run_id"], permit))
                await anyio.sleep_forever()


async def resume(args: dict[str, Any]) -> None:
    async with _ledger(args) as ledger:
        old = await ledger.reservations(args["run_id"])
        allowance = _allowance(ledger, args)
        async with allowance.round(args["run_id"], DELIB, slots=args["slots"]) as permit:
            taken = [await _attempt(permit) for _ in range(permit.slots)]
        emit("resumed", old_rounds=len(old), taken=taken, **_grant(args["run_id"], permit))


async def one(args: dict[str, Any]) -> None:
    async with _ledger(args) as ledger:
        allowance = _allowance(ledger, args)
        emit("ready")
        with anyio.fail_after(120):
            while True:
                try:
                    async with allowance.round(args["run_id"], DELIB, slots=1) as permit:
                        emit("granted", **_grant(args["run_id"], permit))
                        return
                except LedgerError as exc:
                    emit("failed", error=type(exc).__name__)
                    await anyio.sleep(0.2)


async def stream(args: dict[str, Any]) -> None:
    rng = random.Random(args["seed"])
    async with _ledger(args) as ledger:
        allowance = _allowance(ledger, args)
        emit("ready")
        while not os.path.exists(args["stop"]):
            run_id = f"stream-{rng.randrange(args['runs'])}"
            issued = False
            try:
                async with allowance.round(run_id, DELIB, slots=rng.randint(1, 3)) as permit:
                    issued = True
                    emit("granted", **_grant(run_id, permit))
                    for _ in range(rng.randint(0, permit.slots)):
                        await _attempt(permit)
            except RecallBudgetExceeded:
                pass
            except LedgerError as exc:
                emit("failed", error=type(exc).__name__, phase="record" if issued else "reserve")
                await anyio.sleep(0.05)


MODES = {"fleet": fleet, "hold": hold, "resume": resume, "one": one, "stream": stream}


def main() -> None:
    mode, raw = sys.argv[1], sys.argv[2]
    args = json.loads(raw)
    anyio.run(MODES[mode], args, backend=args["backend"])


if __name__ == "__main__":
    main()
