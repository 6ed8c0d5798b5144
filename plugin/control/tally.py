"""What this process saw of a run's totals, shared by every permit it issued for the run.

A refusal carries the run's totals "at the moment of refusal". The ledger counts an attempt
once its trace is written (when its round ends), and a permit knows the totals of when it was
issued; two rounds of one run open at once would each miss the other's attempts. Every permit
of the run in this process counts the attempts it starts here, so a refusal says at least what
this process knows (the most of the two views: never more than really happened).
"""

from __future__ import annotations

import threading

import attrs


@attrs.define(eq=False)
class RunTally:
    """A run's slots reserved and attempts started, as far as this process saw them."""

    reserved: int = 0
    executed: int = 0
    _lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False)

    def saw(self, *, reserved: int, executed: int) -> None:
        """A view of the run's totals (the ledger's, at a reservation or a refusal)."""
        with self._lock:
            self.reserved = max(self.reserved, reserved)
            self.executed = max(self.executed, executed)

    def started(self) -> None:
        """One more attempt started here (a permit gave a slot)."""
        with self._lock:
            self.executed += 1

    def totals(self, *, reserved: int, executed: int) -> tuple[int, int]:
        """The most of ``reserved``/``executed`` and what this tally saw."""
        with self._lock:
            return max(reserved, self.reserved), max(executed, self.executed)
