"""The allowance on its own: rounds, parallel attempts on distinct slots, a typed refusal.

    python examples/allowance.py            # asyncio
    python examples/allowance.py trio       # trio
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio

from plugin import (
    AttemptKind,
    RecallAllowance,
    RecallBudgetExceeded,
    RoundKind,
    SqliteLedger,
    SystemClock,
    current_permit,
)


async def search(name: str, log: list[str]) -> None:
    """A stand-in tool: takes a slot from whatever permit its context holds."""
    permit = current_permit()
    assert permit is not None
    try:
        async with permit.attempt(AttemptKind.DELIBERATE) as slot:
            await anyio.sleep(0.01)
            log.append(f"  {name}: searched on slot {slot}")
    except RecallBudgetExceeded as exc:
        log.append(f"  {name}: refused ({exc.refusal.reason.value})")


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        async with SqliteLedger(Path(folder) / "ledger.db") as ledger:
            allowance = RecallAllowance(ledger, clock=SystemClock())
            run = "demo-run"

            async with allowance.round(run, RoundKind.AUTOMATIC) as permit:
                print(f"round 1 (automatic): {permit.slots} slots, "
                      f"{permit.seconds_left():.1f} s left")
                async with permit.attempt(AttemptKind.BASE) as slot:
                    print(f"  base search on slot {slot}")
            print(f"  phase over: permit closed = {permit.closed}")

            log: list[str] = []
            async with allowance.round(run, RoundKind.DELIBERATE, slots=5) as permit:
                print(f"round 2 (deliberate, 5 calls): granted {permit.slots} slots "
                      f"(slots {permit.first_slot}..{permit.first_slot + permit.slots - 1})")
                async with anyio.create_task_group() as tg:
                    for i in range(5):
                        tg.start_soon(search, f"call {i + 1}", log)
            print("\n".join(sorted(log)))

            try:
                async with allowance.round(run, RoundKind.DELIBERATE, slots=1):
                    pass
            except RecallBudgetExceeded as exc:
                print(f"round 3: refused: {exc.refusal.reason.value}")
                print(f"  model sees: {exc.refusal.message}")

            usage = await ledger.usage(run)
            print(f"ledger: rounds={usage.rounds} reserved={usage.reserved} "
                  f"executed={usage.executed} refused={usage.refused}")


if __name__ == "__main__":
    anyio.run(main, backend=sys.argv[1] if len(sys.argv) > 1 else "asyncio")
