"""Optional extras: a missing one is named, with the command that installs it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from plugin.errors import RecallboundError


class MissingExtraError(RecallboundError, ModuleNotFoundError):
    """A module needs an optional extra that is not installed; the message says which."""


@contextmanager
def missing_extra(extra: str, what: str) -> Iterator[None]:
    """Around an optional module's framework imports: a missing package becomes
    :class:`MissingExtraError` naming ``extra`` and the ``pip install`` line for it."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] in ("plugin", "runtime_hooks"):
            raise
        raise MissingExtraError(
            f"{what} needs the {extra!r} extra (missing module {exc.name!r}): "
            f"pip install 'recallbound[{extra}]'",
            name=exc.name,
        ) from exc
