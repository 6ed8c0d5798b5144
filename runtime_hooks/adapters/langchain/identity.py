"""Whose run this is: the host's trusted run id, scope and principal from the runtime context."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from plugin.errors import RecallboundError, RunIdentityError


class MissingRecallContextError(RecallboundError, TypeError):
    """The run's context does not carry the host's run id, scope and principal."""


RecallContextMismatchError = RunIdentityError
"""One run id was given with a different scope or principal than before (the package's
:class:`~plugin.errors.RunIdentityError`, under this module's older name)."""


# A frozen dataclass, not attrs: LangGraph types ``context_schema`` as a dataclass, a
# TypedDict or a pydantic model.
@dataclasses.dataclass(frozen=True, kw_only=True)
class RecallContext:
    """The host's trusted identity of one agent run; pass it as the runtime context."""

    run_id: str
    scope: str
    principal: str


def context_of(context: object) -> RecallContext:
    """The default ``identity``: the runtime context itself, or its ``recall`` attribute."""
    for candidate in (context, getattr(context, "recall", None)):
        if isinstance(candidate, RecallContext):
            return candidate
    raise MissingRecallContextError(
        "the run's context must be a RecallContext (or carry one as .recall); pass "
        f"context=RecallContext(run_id=..., scope=..., principal=...), got {type(context)!r}"
    )


Identify = Callable[[object], RecallContext]
