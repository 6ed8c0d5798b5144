"""One invocation's automatic round, shared by every model request of the invocation.

The automatic round belongs to the *invocation* (one call into the framework for one user
turn), not to each model request: :class:`Invocation` runs it once, before the first model
request, and hands the same prepared context to every later request of that invocation. An
invocation object lives only as long as its invocation, so prepared evidence is never carried
into the next one.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import attrs

if TYPE_CHECKING:
    from .batch import RunRecall


enclosing_invocation: contextvars.ContextVar[Invocation | None] = contextvars.ContextVar(
    "recallbound_enclosing_invocation", default=None
)
"""The invocation whose tool is running, set by an adapter around its tools: a run started
inside that tool (agent delegation) for the same host run is part of the same user turn."""


@attrs.define(eq=False)
class Invocation:
    """One invocation's automatic round: run once, before its first model request.

    Every later request of the invocation gets the same rendered text and takes no round.
    Create one per invocation and :meth:`end` it when the invocation ends. ``run`` pins the run's
    :class:`RunRecall` for the invocation: a registry that forgets the run meanwhile (under
    pressure from other runs) cannot lose the results of a batch before its tools read them.
    ``enclosing`` is the invocation whose tool started this one, if any (see :meth:`turn`).
    """

    run: RunRecall | None = attrs.field(default=None, init=False)
    enclosing: Invocation | None = attrs.field(factory=enclosing_invocation.get, init=False)
    _done: bool = attrs.field(default=False, init=False)
    _ended: bool = attrs.field(default=False, init=False)
    _turn: Invocation | None = attrs.field(default=None, init=False, repr=False)
    _text: str = attrs.field(default="", init=False)
    _lock: anyio.Lock = attrs.field(factory=anyio.Lock, init=False, repr=False)

    async def context(self, prepare: Callable[[], Awaitable[str]]) -> str:
        """The invocation's rendered context: ``prepare()`` the first time, the same after."""
        async with self._lock:
            if not self._done:
                self._text = await prepare()
                self._done = True
            return self._text

    @property
    def prepared(self) -> bool:
        """Whether the invocation's automatic round has run."""
        return self._done

    def end(self) -> None:
        """The invocation is over: no invocation started later shares its context."""
        self._ended = True

    @property
    def ended(self) -> bool:
        """Whether :meth:`end` was called."""
        return self._ended

    def turn(self, run: RunRecall) -> Invocation:
        """The invocation whose automatic round the requests of ``run`` share, fixed at its
        first request: the nearest enclosing invocation that has not ended, when this was
        started inside its tool (or inside a tool of an invocation it started) for the same
        host run (one user turn, one automatic round), else this one. Another run id, scope
        or principal never shares, and neither does a run that starts after every enclosing
        invocation ended (a follow-up a tool scheduled in a background task): it is the next
        turn. A run that started within the turn keeps sharing it after the turn ends."""
        if self._turn is None:
            self._turn = self._shared(run)
        return self._turn

    def _shared(self, run: RunRecall) -> Invocation:
        outer = self.enclosing
        while outer is not None and outer.ended:  # its own enclosing may still run
            outer = outer.enclosing
        if outer is None or outer.run is None:
            return self
        if (outer.run.run_id, outer.run.scope, outer.run.principal) != (
                run.run_id, run.scope, run.principal):
            return self
        return outer.turn(outer.run)
