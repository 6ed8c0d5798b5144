"""The evaluator's own errors (the package's root is :class:`plugin.errors.RecallboundError`)."""

from __future__ import annotations

from plugin.errors import RecallboundError

__all__ = ["EvaluationError"]


class EvaluationError(RecallboundError):
    """``recallbound evaluate`` cannot run as asked: its semantic model is not installed, or
    the rankings differ between two processes (the determinism check)."""
