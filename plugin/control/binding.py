"""Where code finds the permit of the phase it runs in: one ContextVar, and a run-scoped holder.

The phase that holds a permit binds it to a :class:`~contextvars.ContextVar`; every task spawned
inside the phase copies the context and so holds a reference to the *same* permit object.
Frameworks that run their hooks in copied contexts bind a :class:`PermitHolder` at the run
boundary instead (:func:`bind_permits`), and each round installs its permit into it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from .permit import Permit


@attrs.define(eq=False)
class PermitHolder:
    """A run-scoped binding: one mutable cell that each round installs its permit into.

    Frameworks run their before-model hooks in copied contexts, so a ContextVar *set* there
    never reaches the tools. Binding a holder at the run boundary (:func:`bind_permits`) and
    letting each round write its permit into the holder makes the permit visible to every
    context copied from the run.
    """

    permit: Permit | None = None


_current: contextvars.ContextVar[Permit | PermitHolder | None] = contextvars.ContextVar(
    "recallbound_permit", default=None
)


def current_permit() -> Permit | None:
    """The permit of the phase this code runs in (possibly closed), or None outside one."""
    value = _current.get()
    if isinstance(value, PermitHolder):
        return value.permit
    return value


@contextmanager
def bind_permits() -> Iterator[PermitHolder]:
    """Bind a run-scoped :class:`PermitHolder` for the duration of an agent run.

    Use it at the run boundary (around the framework's run call); every round opened inside
    installs its permit into the holder, where tools running in copied contexts find it.
    """
    holder = PermitHolder()
    token = _current.set(holder)
    try:
        yield holder
    finally:
        holder.permit = None
        with contextlib.suppress(ValueError):  # left from another context: holder emptied anyway
            _current.reset(token)


@contextmanager
def hide_permit() -> Iterator[None]:
    """Run a block (and every task it spawns) with no permit bound: ``current_permit()`` is
    None there. The hooks call a retriever this way, so that a retriever that looks for the
    ambient permit by mistake finds none; it works with the narrow handle it is given.
    """
    token = _current.set(None)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # left from another context: nothing to undo
            _current.reset(token)


@attrs.define(eq=False)
class Binding:
    """How a round installed its permit, so that leaving the phase can undo exactly that."""

    holder: PermitHolder | None
    previous: Permit | None
    token: contextvars.Token[Permit | PermitHolder | None] | None

    @classmethod
    def install(cls, permit: Permit) -> Binding:
        value = _current.get()
        if isinstance(value, PermitHolder):
            previous, value.permit = value.permit, permit
            return cls(holder=value, previous=previous, token=None)
        return cls(holder=None, previous=None, token=_current.set(permit))

    def uninstall(self, permit: Permit) -> None:
        if self.holder is not None:
            if self.holder.permit is permit:
                self.holder.permit = self.previous
        elif self.token is not None:
            with contextlib.suppress(ValueError):  # from another context; the permit is closed
                _current.reset(self.token)
