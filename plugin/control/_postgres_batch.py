"""How the PostgreSQL ledger sends a batch of reservations: waves of at most one request per
run, each one statement, and the outcome of each request from its row."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from .ledger import Reservation, read_time
from .refusal import BudgetRefusal, RefusalReason
from .sql_rows import reservation
from .sql_schema import ReserveRequest, Row

Send: TypeAlias = "Callable[[Sequence[tuple[str, Any]]], Awaitable[list[list[Row]]]]"
"""Sends statements to the server, one trip, and returns each one's rows."""


def judged(request: ReserveRequest, row: Row) -> Reservation | BudgetRefusal:
    """The outcome of one request from its row of the reserving statement."""
    _, judged, executed, rounds, reserved, grant, deadline, opened, reason, before = row
    if rounds is None:
        return BudgetRefusal(reason=RefusalReason(reason), run_id=request.run_id,
                             reserved=before, executed=executed)
    return reservation(request.run_id, request.kind, request.requested, rounds=rounds,
                       reserved=reserved, grant=grant, executed=executed, deadline=deadline,
                       opened=opened, judged=judged)


def in_waves(batch: Sequence[ReserveRequest], ready: list[int]) -> list[list[int]]:
    """``ready`` (indexes into ``batch``) in waves of at most one request per run, each run's
    requests in their order: a wave's statement sees the waves before it."""
    waves: list[list[int]] = []
    seen: dict[str, int] = {}
    for i in ready:
        k = seen.get(batch[i].run_id, 0)
        seen[batch[i].run_id] = k + 1
        if k == len(waves):
            waves.append([])
        waves[k].append(i)
    return waves


def wave_params(batch: Sequence[ReserveRequest], wave: list[int],
          times: Mapping[int, tuple[float | None, float]], server: bool) -> dict[str, Any]:
    """The parameters of one wave's statement: its requests as one JSON array (one value to
    send instead of ten arrays), times as exact text (``repr``; ``-inf`` and ``inf`` too)."""
    requests = []
    for i in wave:
        request, (now, floor) = batch[i], times[i]
        policy = request.policy
        requests.append({
            "ord": i, "run_id": request.run_id, "kind": request.kind.value,
            "requested": request.requested, "deadline_s": repr(float(policy.deadline_s)),
            "max_searches": policy.max_searches, "max_rounds": policy.max_rounds,
            "now": None if now is None else repr(float(now)), "floor": repr(float(floor)),
        })
    return {"server": server, "requests": json.dumps(requests)}


BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
READ_COMMITTED: tuple[str, None] = ("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", None)
"""The first statement of an implicit transaction that writes: whatever isolation the server,
database, role or DSN makes the default, a reservation waits on the run's lock and then reads
what was committed meanwhile (under a snapshot taken before the wait it would fail to
serialize, and a round the allowance grants would be lost)."""


@attrs.frozen(kw_only=True)
class Judge:
    """How one PostgreSQL ledger judges a batch of reservations (its statements and settings)."""

    settings: str
    """The statement setting what every transaction sets for itself."""
    lone_settings: Mapping[str, str]
    """The same settings as the lone statement's parameters."""
    space: int
    """The advisory-lock space of the ledger's runs."""
    caller: bool
    """Whether rounds are judged by the callers' clocks (else by the server's)."""
    reserve: str
    reserve_one: str
    lock_runs: str

    async def judge(
        self, batch: Sequence[ReserveRequest], send: Send
    ) -> list[Reservation | BudgetRefusal | BaseException]:
        """The batch's transaction through ``send``: the run locks, the waves, ``COMMIT`` in one
        trip; by the callers' clocks, two (the clocks are read after the locks); a lone
        request by the server's clock, the settings and one statement."""
        outcomes: dict[int, Reservation | BudgetRefusal | BaseException] = {}
        caller = self.caller
        if not caller and len(batch) == 1:
            return await self._lone(batch[0], send)
        locks = (self.lock_runs, {"space": self.space, "runs": sorted({r.run_id for r in batch})})
        settings = (self.settings, None)
        head: list[tuple[str, Any]] = [READ_COMMITTED, settings, locks]
        tail: list[tuple[str, Any]] = []
        if caller:
            # Two trips: an explicit transaction across them; the clocks are read between.
            await send([(BEGIN, None), settings, locks])
            head, tail = [], [("COMMIT", None)]
        times: dict[int, tuple[float | None, float]] = {}
        for i, request in enumerate(batch):
            try:
                times[i] = (read_time(request.now) if caller else None, read_time(request.floor))
            except BaseException as exc:  # that caller's clock, whatever it raises: alone
                outcomes[i] = exc
        waves = in_waves(batch, list(times))
        statements = [
            *head,
            *((self.reserve, wave_params(batch, one, times, not caller)) for one in waves),
            *tail,
        ]
        results = await send(statements)
        for rows in results[len(head):len(head) + len(waves)]:
            for row in rows:
                outcomes[row[0]] = judged(batch[row[0]], row)
        return [outcomes[i] for i in range(len(batch))]

    async def _lone(
        self, request: ReserveRequest, send: Send
    ) -> list[Reservation | BudgetRefusal | BaseException]:
        """A lone request judged by the server's clock: one round trip, the transaction's
        settings first, a statement of their own: the server arms a statement's timeout when
        the statement starts, so ``statement_timeout`` set inside the reserving statement
        would not bound that statement (a lock wait would then end only at ``lock_timeout``)."""
        try:
            floor = read_time(request.floor)
        except BaseException as exc:  # the caller's clock, whatever it raises
            return [exc]
        params = {"space": self.space, **self.lone_settings,
                  "requests": wave_params([request], [0], {0: (None, floor)}, True)["requests"]}
        *_, (row,) = await send([READ_COMMITTED, (self.settings, None),
                                 (self.reserve_one, params)])
        return [judged(request, row)]
