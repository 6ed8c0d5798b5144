"""What a ledger object remembers of run identities it read back."""

from __future__ import annotations


class IdentityCache:
    """Bindings a ledger object has already read back: a binding never changes once written,
    so a repeated check of one run costs no statement. Bounded (oldest dropped first)."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._bound: dict[str, tuple[str, str]] = {}

    def get(self, run_id: str) -> tuple[str, str] | None:
        return self._bound.get(run_id)

    def put(self, run_id: str, bound: tuple[str, str]) -> tuple[str, str]:
        self._bound[run_id] = bound
        while len(self._bound) > self._size:
            del self._bound[next(iter(self._bound))]
        return bound
