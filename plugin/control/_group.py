"""Group commit: requests that arrive while a transaction is in flight share the next one.

A request joins the queue and waits for the connection's lock. Whoever gets the lock takes
*every* queued request and runs them in one transaction (one ``COMMIT``, one fsync); the
others find their outcome when they get the lock in turn. A lone request takes the lock at
once, so it never waits for a batch to fill. The batch runs shielded: cancelling a waiter
before its batch starts removes it (nothing reserved); once its batch started, its work
commits (consumed, as any cancelled attempt's slot), and the cancelled waiter may still
receive its outcome (the task that ran the batch can return it before its cancellation lands).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import anyio
import attrs

from .shield import finish

R = TypeVar("R")
Out = TypeVar("Out")


@attrs.define(eq=False)
class _Entry(Generic[R, Out]):
    request: R
    outcome: Out | BaseException | None = None
    done: bool = False


@attrs.define(eq=False)
class GroupCommit(Generic[R, Out]):
    """Batches requests into transactions run by ``run`` under ``lock``.

    ``run(batch)`` commits the whole batch and returns one outcome per request, in order: a
    value, or the exception that request alone raises (an isolated failure). If ``run`` itself
    raises, the task that ran the batch gets that error and every other request gets
    ``shared_failure(error)``, a fresh exception of its own.
    """

    lock: anyio.Lock
    run: Callable[[Sequence[R]], Awaitable[Sequence[Out | BaseException]]]
    shared_failure: Callable[[BaseException], BaseException]
    _pending: list[_Entry[R, Out]] = attrs.field(factory=list, init=False)

    async def submit(self, request: R) -> Out:
        """Commit ``request`` (in a batch, perhaps) and return its outcome, or raise its error."""
        entry: _Entry[R, Out] = _Entry(request)
        self._pending.append(entry)
        try:
            while not entry.done:
                async with self.lock:
                    if not entry.done:
                        await self._run_pending()
        except BaseException:
            if not entry.done:  # still queued: it never ran, so nothing was committed for it
                with contextlib.suppress(ValueError):
                    self._pending.remove(entry)
            raise
        outcome = entry.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome

    async def _run_pending(self) -> None:
        batch, self._pending = self._pending, []
        ran: list[Sequence[Out | BaseException]] = []

        async def run() -> None:
            ran.append(await self.run([entry.request for entry in batch]))

        try:
            # To its end whatever cancels this task (a native asyncio cancel too): the batch
            # holds other tasks' requests, which must each learn their real outcome.
            await finish(run)
        except BaseException as exc:
            failure = exc  # the batch's own failure, behind this task's cancellation if any
            if isinstance(exc, anyio.get_cancelled_exc_class()) and exc.__cause__ is not None:
                failure = exc.__cause__
            for index, entry in enumerate(batch):
                entry.outcome = ran[0][index] if ran else self.shared_failure(failure)
                entry.done = True
            raise
        for entry, outcome in zip(batch, ran[0], strict=True):
            entry.outcome, entry.done = outcome, True
