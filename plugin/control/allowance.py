"""The recall allowance: durable rounds that issue permits.

``async with allowance.round(run_id, RoundKind.AUTOMATIC) as permit:`` reserves the round in
the ledger (durably), awaits the host's checkpoint callback if one is given, and only then
issues a :class:`~plugin.control.permit.Permit`, bound to
:func:`~plugin.control.permit.current_permit` while the block runs and closed when it ends.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from numbers import Real

import anyio.lowlevel
import attrs

from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError

from . import validate
from .clock import Clock, FiniteClock, SystemClock, finite_clock
from .headroom import Headroom
from .ledger import Ledger, Usage
from .logs import CONTROL, log_event
from .permit import LEGACY_SLOTS, Permit
from .policy import MAX_COUNT, AllowancePolicy, RoundKind
from .refusal import BudgetRefusal, RecallBudgetExceeded
from .rounds import Round
from .tally import RunTally
from .validate import MAX_RUN_ID_BYTES as MAX_RUN_ID_BYTES

Checkpoint = Callable[[str, int], Awaitable[None]]
"""The host's checkpoint callback: ``await checkpoint(run_id, round_index)``."""



def validate_run_id(run_id: object) -> str:
    """Return ``run_id`` if it is a valid run id (:func:`plugin.control.validate.run_id`)."""
    return validate.run_id(run_id)


class _Anchors:
    """What this *process* has watched pass for each run (all allowance objects share it).

    A wall clock stepped backwards between two rounds must not re-open a deadline that this
    process watched pass on its monotonic clock, whichever :class:`RecallAllowance` object
    reserves the next round. For each run it keeps one number, ``reserved_wall - mono``: a
    round's judged time minus a monotonic reading taken after that reservation returned, so
    ``offset + monotonic()`` never exceeds the time that has really passed in the ledger's
    clock. Keyed by the clock (instances of :class:`SystemClock` are equal; a
    :class:`ManualClock` is its own domain) and the run id; the oldest are forgotten first,
    so memory stays flat (about 200 bytes a run, ``limit`` runs).
    """

    limit = 16_384

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offsets: dict[tuple[object, str], float] = {}

    @staticmethod
    def _key(clock: Clock, run_id: str) -> tuple[object, str]:
        if isinstance(clock, FiniteClock):  # the checked view of a clock shares its domain
            clock = clock.inner
        try:
            hash(clock)
        except TypeError:  # an unhashable user clock: its identity is its domain
            return (id(clock), run_id)
        return (clock, run_id)

    def floor(self, clock: Clock, run_id: str) -> float:
        """The earliest ledger time this process knows has passed for ``run_id``."""
        with self._lock:
            offset = self._offsets.get(self._key(clock, run_id))
        return -math.inf if offset is None else offset + clock.monotonic()

    def observe(self, clock: Clock, run_id: str, reserved_wall: float, mono: float) -> None:
        key = self._key(clock, run_id)
        with self._lock:
            offset = max(self._offsets.pop(key, -math.inf), reserved_wall - mono)
            self._offsets[key] = offset
            while len(self._offsets) > self.limit:
                del self._offsets[next(iter(self._offsets))]


_ANCHORS = _Anchors()

KNOWN_ROOMS = 4096
"""How many runs an allowance remembers what it learned of (least recently used go)."""
MAX_OWED_RECORDS = 10_000
"""The most records an allowance holds for a ledger it cannot write (see ``_hand_over``)."""


@attrs.frozen(kw_only=True)
class Room:
    """What a run has left: slots a round could get, rounds, and its deadline once opened."""

    slots: int
    rounds: int
    deadline_wall: float | None = None

    def expired(self, now: float) -> bool:
        """Whether the run's deadline has passed at ``now``."""
        return self.deadline_wall is not None and now >= self.deadline_wall

    def slots_at(self, now: float) -> int:
        """Slots a round could get at ``now`` (0 once the deadline has passed)."""
        return 0 if self.expired(now) else self.slots


def _is_clock(_: object, __: object, clock: object) -> None:
    if not (callable(getattr(clock, "wall", None))
            and callable(getattr(clock, "monotonic", None))):
        raise InvalidArgumentTypeError(
            f"clock must be a Clock (wall() and monotonic()), got {type(clock).__name__}")


@attrs.define(eq=False)
class RecallAllowance:
    """Issues permits for a run's recall rounds under an :class:`AllowancePolicy`.

    ``checkpoint``, when given, is awaited after a round's reservation is committed and before
    its permit is issued; if it raises, the error propagates, no permit is issued, and the
    reserved slots stay consumed. Use :meth:`legacy` for the explicit unenforced mode.
    """

    ledger: Ledger
    policy: AllowancePolicy = attrs.field(factory=AllowancePolicy)
    clock: Clock = attrs.field(factory=SystemClock, validator=_is_clock)
    """The clock as given (its own object: ``allowance.clock.advance(...)`` moves it); every
    reading the allowance takes goes through :attr:`checked_clock`."""
    checkpoint: Checkpoint | None = None
    is_legacy: bool = attrs.field(default=False, kw_only=True)
    _known: OrderedDict[str, Room] = attrs.field(factory=OrderedDict, init=False, repr=False)
    """What this allowance last learned of each run from its own reservations (bounded)."""
    _tallies: OrderedDict[str, RunTally] = attrs.field(factory=OrderedDict, init=False,
                                                       repr=False)
    """The totals this process saw of each run, shared by the run's permits (bounded)."""
    _owed: list[Permit] = attrs.field(factory=list, init=False, repr=False)
    """Permits whose records a failed write left unwritten (see :meth:`flush`)."""
    _flushing: anyio.Lock = attrs.field(factory=anyio.Lock, init=False, repr=False)
    _owing: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.is_legacy, bool):  # "false" must never switch enforcement off
            raise InvalidArgumentTypeError(
                f"is_legacy must be a bool, got {type(self.is_legacy).__name__}"
            )
        if self.ledger is None:
            raise InvalidArgumentTypeError("RecallAllowance needs a ledger; use "
                                        "RecallAllowance.legacy() for the explicit unenforced mode")
        if not isinstance(self.policy, AllowancePolicy):
            raise InvalidArgumentTypeError(
                f"policy must be an AllowancePolicy, got {self.policy!r}"
            )
        if self.checkpoint is not None and not callable(self.checkpoint):
            raise InvalidArgumentTypeError(
                f"checkpoint must be an async callable or None, got "
                f"{type(self.checkpoint).__name__}")

    @property
    def checked_clock(self) -> Clock:
        """:attr:`clock` with every reading checked (:func:`~plugin.control.clock.finite_clock`):
        a reading that is no finite number raises InvalidArgumentError."""
        return finite_clock(self.clock)

    @classmethod
    def legacy(cls, ledger: Ledger, *, clock: Clock | None = None) -> RecallAllowance:
        """The explicit legacy mode: no reservation, no limit, every attempt traced as legacy.

        For unconfigured callers and the frozen control arm only; it is never reached by
        default.
        """
        return cls(ledger, clock=clock if clock is not None else SystemClock(), is_legacy=True)

    def round(self, run_id: str, kind: RoundKind, *, slots: int | None = None) -> Round:
        """Reserve a round and yield its permit: ``async with allowance.round(...) as permit``.

        An automatic round reserves ``policy.automatic_slots`` (or what is left); a deliberate
        round needs ``slots`` (>= 1, one per validated search call) and gets that many or what
        is left. Raises :class:`RecallBudgetExceeded` when the round is refused (too many
        rounds, no slot left, deadline passed), :class:`~plugin.errors.LedgerError` when the
        reservation cannot be committed; in both cases no permit exists.
        """
        validate_run_id(run_id)
        if not isinstance(kind, RoundKind):
            raise InvalidArgumentTypeError(f"kind must be a RoundKind, got {kind!r}")
        if kind is RoundKind.AUTOMATIC:
            if slots is not None:
                raise InvalidArgumentError("an automatic round reserves policy.automatic_slots; "
                                        "slots= is for deliberate rounds")
            requested = self.policy.automatic_slots
        else:
            if slots is None:
                raise InvalidArgumentError("a deliberate round needs slots= (one per valid call)")
            given: object = slots
            if isinstance(given, bool) or not isinstance(given, int):
                # a number that is no count (0.5, 1.0, True) is a bad value, as in the policy
                bad = InvalidArgumentError if isinstance(given, Real) else InvalidArgumentTypeError
                raise bad(f"slots must be an int, got {type(given).__name__}")
            if not 1 <= slots <= MAX_COUNT:
                raise InvalidArgumentError(f"slots must be between 1 and {MAX_COUNT}, got {slots}")
            requested = slots
        return Round(self, run_id, kind, requested)

    async def headroom(self, run_id: str) -> int:
        """How many slots a round of ``run_id`` could get now (``LEGACY_SLOTS`` in legacy mode).

        An estimate from the run's usage, for deciding what is worth preparing before a round;
        only the ledger's reservation decides what is granted. 0 once the run has all its
        rounds, its deadline has passed, or every slot is reserved.
        """
        return (await self.room(run_id)).slots_at(self.checked_clock.wall())

    async def room(self, run_id: str) -> Room:
        """What ``run_id`` has left by its usage (an estimate, as :meth:`headroom`)."""
        validate_run_id(run_id)
        if self.is_legacy:
            return Room(slots=LEGACY_SLOTS, rounds=LEGACY_SLOTS)
        usage = await self.ledger.usage(run_id)
        left = Headroom(rounds=usage.rounds, max_rounds=self.policy.max_rounds,
                        reserved=usage.reserved, max_searches=self.policy.max_searches,
                        deadline_wall=usage.deadline_wall)
        room = Room(slots=left.slots_left, rounds=left.rounds_left,
                    deadline_wall=usage.deadline_wall)
        self._learn(run_id, room)
        return room

    async def slots_estimate(self, run_id: str) -> int:
        """:meth:`headroom` from what this allowance last learned of the run
        (:meth:`known_room`); read from the ledger only when it has learned nothing.

        Never below what the ledger would say: a run's use only grows, so what this process
        learned can only be too high (another process used the run since), and the
        reservation refuses what is not there.
        """
        known = self.known_room(validate_run_id(run_id))
        if known is None:
            return await self.headroom(run_id)
        return known.slots_at(self.checked_clock.wall())

    def learn_opened(self, run_id: str) -> None:
        """Note that this process has just opened ``run_id`` (``Ledger.open_run`` said it was
        new): until it reserves, it is taken to have the whole policy, an estimate as
        :meth:`known_room` is."""
        if self.known_room(validate_run_id(run_id)) is None:
            self._learn(run_id, self.fresh_room())

    def now_for(self, run_id: str) -> float:
        """The wall time to judge ``run_id`` by: never before what this process watched pass
        for it on its monotonic clock (a wall clock stepped back does not revive a run)."""
        clock = self.checked_clock
        return max(clock.wall(), _ANCHORS.floor(clock, run_id))

    def known_room(self, run_id: str) -> Room | None:
        """What this allowance last learned of ``run_id`` (from a round it reserved or was
        refused, or from :meth:`room`), without reading the ledger; None if nothing. An
        estimate (another process may have used the run since), as :meth:`headroom`."""
        room = self._known.get(run_id)
        if room is not None:
            self._known.move_to_end(run_id)
        return room

    def _learn(self, run_id: str, room: Room) -> None:
        self._known[run_id] = room
        self._known.move_to_end(run_id)
        while len(self._known) > KNOWN_ROOMS:
            self._known.popitem(last=False)

    def fresh_room(self) -> Room:
        """What a run that has not opened yet has: the whole policy."""
        if self.is_legacy:
            return Room(slots=LEGACY_SLOTS, rounds=LEGACY_SLOTS)
        return Room(slots=self.policy.max_searches, rounds=self.policy.max_rounds)

    async def usage(self, run_id: str) -> Usage:
        """The run's totals from the ledger."""
        return await self.ledger.usage(validate_run_id(run_id))

    async def flush(self) -> None:
        """Write the records this allowance's permits still owe: those a write found the
        ledger locked, unreachable or full for (the round answered; its records waited).

        Each round this allowance issues takes them over and writes them with its own, so
        this is for a host that will open no more rounds (the hooks do it when they close).
        Raises the ledger's error if it still cannot write them: they stay owed, and nothing
        is written twice. Flushes wait for each other.
        """
        async with self._flushing:
            while self._owed:
                await self._owed.pop(0).flush()  # failing, the permit is owed again

    # -- internals ---------------------------------------------------------------------------

    def _owe(self, permit: Permit) -> None:
        with self._owing:  # a worker thread may owe too
            if all(owed is not permit for owed in self._owed):
                self._owed.append(permit)

    def _tally(self, run_id: str) -> RunTally:
        tally = self._tallies.get(run_id)
        if tally is None:
            tally = self._tallies[run_id] = RunTally()
            while len(self._tallies) > KNOWN_ROOMS:
                self._tallies.popitem(last=False)
        self._tallies.move_to_end(run_id)
        return tally

    def _hand_over(self, permit: Permit) -> Permit:
        """``permit``, holding what earlier permits owe: its flush writes it with its own.

        At most :data:`MAX_OWED_RECORDS` are held, the oldest going first (traces, then
        refusals, then call outcomes), logged: a ledger that stays locked for good (legacy
        mode opens rounds all the same) must not grow them without end."""
        dropped = 0
        while self._owed:
            traces, refusals, calls, limits = self._owed.pop(0)._take_records()
            excess = len(traces) + len(refusals) + len(calls) - MAX_OWED_RECORDS
            if excess > 0:
                dropped += excess
                oldest = list(traces)[:excess]
                for attempt_id in oldest:
                    del traces[attempt_id]
                excess -= len(oldest)
                cut = min(excess, len(refusals))
                del refusals[:cut]
                del calls[:excess - cut]
            permit._put_back((traces, refusals, calls, limits), owed=False)
        if dropped:
            log_event(CONTROL, logging.WARNING, "round.traces_dropped", run_id=permit.run_id,
                      records=dropped, reason="the ledger could not be written for too long")
        return permit

    async def _issue(self, run_id: str, kind: RoundKind, requested: int) -> Permit:
        # Every reading checked: a non-finite one is a InvalidArgumentError before it is judged
        # or stored (raised inside the reservation, it rolls the reservation back).
        clock = self.checked_clock
        if self.is_legacy:
            return self._hand_over(Permit._create(
                run_id=run_id, round_index=0, kind=kind, slots=LEGACY_SLOTS, first_slot=1,
                legacy=True, clock=clock, ledger=self.ledger, deadline_wall=math.inf,
                expires_wall=math.inf, issued_mono=clock.monotonic(), left_at_issue=math.inf,
                source_reads_limit=LEGACY_SLOTS, reserved_total=0, executed_before=0,
                owner=self._owe,
            ))
        # Read before the reservation: the permit's monotonic deadline counts from here, so
        # no wall step at any later point (lock wait, commit, checkpoint) can lengthen it.
        wall_before, mono_before = clock.wall(), clock.monotonic()
        judged: list[float] = []  # this clock's readings the ledger judged by (none: a server's)

        def now() -> float:
            judged.append(clock.wall())
            return judged[-1]

        result = await self.ledger.reserve(
            run_id, kind, requested, self.policy, now,
            floor=lambda: _ANCHORS.floor(clock, run_id),
        )
        # A caller cancelled while its reservation was committed (a shared batch, a lock
        # handed over as the cancellation arrived) gets no permit: the slots stay consumed.
        await anyio.lowlevel.checkpoint_if_cancelled()
        tally = self._tally(run_id)
        if isinstance(result, BudgetRefusal):
            self._learn(run_id, Room(slots=0, rounds=0))  # every refusal leaves the run spent
            # The ledger counts attempts whose round ended; this process's rounds still open
            # count theirs here.
            reserved, executed = tally.totals(reserved=result.reserved, executed=result.executed)
            raise RecallBudgetExceeded(BudgetRefusal(  # its message says these totals too
                reason=result.reason, run_id=run_id, reserved=reserved, executed=executed))
        tally.saw(reserved=result.reserved, executed=result.executed)
        rounds_left = max(0, self.policy.max_rounds - result.round_index)
        self._learn(run_id, Room(
            slots=max(0, self.policy.max_searches - result.reserved) if rounds_left else 0,
            rounds=rounds_left, deadline_wall=result.deadline_wall))
        # Anchored at once, before the host's checkpoint can fail or step the clock.
        _ANCHORS.observe(clock, run_id, result.reserved_wall, clock.monotonic())
        if self.checkpoint is not None:
            await self.checkpoint(run_id, result.round_index)
        # What was left when the round was judged, never more than the run's own deadline_s.
        left = max(0.0, min(result.deadline_wall - result.reserved_wall,
                            result.deadline_wall - result.opened_wall))
        # Judged by this clock, never past the stored deadline either: a wall stepped back
        # during the wait for the reservation set that deadline from the stepped-back time. (A
        # server's clock is another frame: there the countdown from what was left decides.)
        expires_wall = min(wall_before + left, result.deadline_wall) if judged \
            else wall_before + left
        return self._hand_over(Permit._create(
            run_id=run_id, round_index=result.round_index, kind=kind, slots=result.slots,
            first_slot=result.first_slot, legacy=False, clock=clock, ledger=self.ledger,
            deadline_wall=result.deadline_wall, expires_wall=expires_wall,
            issued_mono=mono_before, left_at_issue=left,
            source_reads_limit=self.policy.source_read_fallbacks,
            reserved_total=result.reserved, executed_before=result.executed,
            owner=self._owe, tally=tally,
        ))
