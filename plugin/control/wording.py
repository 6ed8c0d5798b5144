"""The bounded wording: the one place that says, in words the model reads, that recall was
bounded and that this is not evidence that no memory exists.

A refusal, a notice, a part of a search the allowance cut short, and evidence the context caps
left out all say it with these sentences, so a model meets one phrasing for one situation.
"""

from __future__ import annotations

NOT_EVIDENCE = (
    "This is not evidence that no memory exists; do not conclude that nothing is stored, "
    "and do not guess what a search would have found."
)
"""What every bounded message ends with."""


def bounded(why: str) -> str:
    """``why`` recall was bounded, as one message: "Memory recall was bounded: ...". """
    return f"Memory recall was bounded: {why}. {NOT_EVIDENCE}"


def left_out(count: int, noun: str) -> str:
    """The line that says ``count`` items (``noun``, singular) were left out by the caps."""
    plural = "" if count == 1 else "s"
    return (f"({count} more {noun}{plural} left out by the context cap; memory recall was "
            f"bounded: this is not evidence that they are absent)")
