"""Permits: scoped, nonrenewable authority to search, shared by every task of a phase.

A permit is one mutable object with identity. The phase that holds it binds it to a
:class:`~contextvars.ContextVar`; every task spawned inside the phase copies the context and so
holds a reference to the *same* object. Taking a slot is a check-and-increment under a
:class:`threading.Lock` with no ``await`` in between, so parallel tool calls (tasks or worker
threads) always take distinct slots. Leaving the phase calls :meth:`Permit.close` first, which
reaches every copied context at once, and only then resets the ContextVar.

A round reserved with a ``key`` issues a *keyed* permit: it gives a slot, a source read or a
close only to a caller that presents the same key (the permit keeps a digest, never the key).
The hooks reserve their rounds this way, so a permit that leaks to code they run (through a
task tree, ``Task.get_context()`` or a frame) is useless to whoever finds it; a permit reserved
without a key keeps the plain API for callers that use the allowance directly.

A permit is never built from outside: only :meth:`RecallAllowance.round
<plugin.control.allowance.RecallAllowance.round>` issues one, after its reservation committed.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import hmac
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn

import anyio
import anyio.from_thread
import attrs

from plugin.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LedgerLockedError,
    PermitMisuseError,
)

from . import observe
from .clock import Clock
from .ledger import AttemptOutcome, AttemptTrace, CallRecord, RefusalRecord
from .policy import AttemptKind, RoundKind
from .refusal import BudgetRefusal, RecallBudgetExceeded, RefusalReason

if TYPE_CHECKING:
    from .ledger import Ledger

_issuing = threading.local()
"""Set by :func:`_issue_permit` for exactly one construction (so ``attrs.evolve`` cannot)."""

_ISSUED: weakref.WeakSet[Permit] = weakref.WeakSet()
"""Every permit this process issued; a forged object (``object.__new__``) is not in it."""

_RECORD_RETRIES = (0.05, 0.2, None)
"""Pauses between tries of a trace write that found the ledger locked (None: give up)."""

_KEY_MISUSE = "this permit gives slots only to the holder of its round's key"

_MISUSE = (
    "a Permit is one object, issued only by RecallAllowance.round() after its reservation "
    "committed; it cannot be built, copied, pickled, rebuilt or modified"
)


def _issue_permit(**fields: object) -> Permit:
    """Build the one permit of a committed round (called only by the allowance)."""
    _issuing.active = True
    try:
        return Permit(**fields)  # type: ignore[arg-type]
    finally:
        _issuing.active = False

LEGACY_SLOTS = sys.maxsize
"""``Permit.slots`` of a legacy (unenforced) permit."""


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


@attrs.define(eq=False)
class _Binding:
    """How a round installed its permit, so that leaving the phase can undo exactly that."""

    holder: PermitHolder | None
    previous: Permit | None
    token: contextvars.Token[Permit | PermitHolder | None] | None

    @classmethod
    def install(cls, permit: Permit) -> _Binding:
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


@attrs.define(eq=False)
class Permit:
    """The authority to run this round's search attempts.

    ``slots`` were granted to the round; each attempt takes one (:meth:`attempt`), numbered
    across the whole run. The permit expires at the run's original wall deadline *and* when
    the monotonic time elapsed since issue exceeds what was left at issue, whichever comes
    first, so a wall clock stepped backwards never extends it. It closes when its phase ends.
    It can never be extended, refilled or re-issued.
    """

    run_id: str
    round_index: int
    kind: RoundKind
    slots: int
    first_slot: int
    legacy: bool
    _clock: Clock = attrs.field(repr=False)
    _ledger: Ledger = attrs.field(repr=False)
    _deadline_wall: float = attrs.field(repr=False)
    _expires_wall: float = attrs.field(repr=False)
    _issued_mono: float = attrs.field(repr=False)
    _left_at_issue: float = attrs.field(repr=False)
    _source_reads_limit: int = attrs.field(repr=False)
    _reserved_total: int = attrs.field(repr=False)
    _executed_before: int = attrs.field(repr=False)
    _key_digest: bytes | None = attrs.field(default=None, repr=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)
    _taken: int = attrs.field(default=0, init=False, repr=False)
    _closed: bool = attrs.field(default=False, init=False, repr=False)
    _flushed: bool = attrs.field(default=False, init=False, repr=False)
    _source_reads: dict[int, int] = attrs.field(factory=dict, init=False, repr=False)
    _dropped: dict[int, int] = attrs.field(factory=dict, init=False, repr=False)
    _traces: dict[str, AttemptTrace] = attrs.field(factory=dict, init=False, repr=False)
    _refusals: list[RefusalRecord] = attrs.field(factory=list, init=False, repr=False)
    _calls: list[CallRecord] = attrs.field(factory=list, init=False, repr=False)
    _retain_limit: list[int] = attrs.field(factory=list, init=False, repr=False)
    _wall: Callable[[], float] = attrs.field(init=False, repr=False)
    _monotonic: Callable[[], float] = attrs.field(init=False, repr=False)
    _mono_deadline: float = attrs.field(init=False, repr=False)
    _sealed: bool = attrs.field(default=False, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not getattr(_issuing, "active", False):
            raise PermitMisuseError(_MISUSE)
        _issuing.active = False  # one construction per issue: evolve() cannot ride on it
        # Bound once: taking a slot reads both clocks, and it is the hot path.
        self._wall = self._clock.wall
        self._monotonic = self._clock.monotonic
        self._mono_deadline = self._issued_mono + self._left_at_issue
        _ISSUED.add(self)
        self._sealed = True

    # -- one object: no copies, no pickles, no edits -------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        if getattr(self, "_sealed", False):
            raise PermitMisuseError(f"{_MISUSE} (tried to set {name!r})")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise PermitMisuseError(f"{_MISUSE} (tried to delete {name!r})")

    def __copy__(self) -> NoReturn:
        raise PermitMisuseError(_MISUSE)

    def __deepcopy__(self, memo: object) -> NoReturn:
        raise PermitMisuseError(_MISUSE)

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise PermitMisuseError(_MISUSE)

    def __reduce__(self) -> NoReturn:
        raise PermitMisuseError(_MISUSE)

    def __getstate__(self) -> NoReturn:
        raise PermitMisuseError(_MISUSE)

    def _check_issued(self) -> None:
        if self not in _ISSUED:
            raise PermitMisuseError(_MISUSE)

    def _check_key(self, key: bytes | None) -> None:
        """Refuse a keyed permit's authority to a caller without its round's key."""
        digest = self._key_digest
        if digest is None:
            return
        if not isinstance(key, bytes) or not hmac.compare_digest(key_digest(key), digest):
            raise PermitMisuseError(_KEY_MISUSE)

    # -- state -------------------------------------------------------------------------------

    @property
    def remaining(self) -> int:
        """Slots of this round not yet taken."""
        with self._lock:
            return self.slots - self._taken

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def deadline_wall(self) -> float:
        """The run's original wall-clock deadline (``inf`` for a legacy permit)."""
        return self._deadline_wall

    def seconds_left(self) -> float:
        """Seconds until the permit expires; never negative (``inf`` for a legacy permit)."""
        by_wall = self._expires_wall - self._wall()
        by_worker = self._mono_deadline - self._monotonic()
        return max(0.0, min(by_wall, by_worker))

    def expired(self) -> bool:
        """Whether the deadline has passed (a closed permit need not be expired)."""
        return (
            self._wall() >= self._expires_wall or self._monotonic() >= self._mono_deadline
        )

    def _outlived(self) -> bool:
        """Whether the monotonic (worker) deadline has passed: what the cancel scope follows."""
        return self._monotonic() >= self._mono_deadline

    def close(self, *, key: bytes | None = None) -> None:
        """End the permit for every context that holds it. Idempotent; never un-closes.

        A keyed permit closes only for its round's ``key`` (:class:`PermitMisuseError`).
        """
        self._check_key(key)
        object.__setattr__(self, "_closed", True)

    def refusal(self, reason: RefusalReason) -> BudgetRefusal:
        """A refusal carrying the run's totals as this permit knows them."""
        with self._lock:
            executed = self._executed_before + self._taken
        return BudgetRefusal(
            reason=reason, run_id=self.run_id, reserved=self._reserved_total, executed=executed
        )

    # -- taking slots ------------------------------------------------------------------------

    def _take(self, kind: AttemptKind) -> int:
        """Take one slot or raise; the refusal is buffered for the ledger either way."""
        if not isinstance(kind, AttemptKind):
            raise InvalidArgumentTypeError(f"kind must be an AttemptKind, got {kind!r}")
        expired = self.expired()  # the clocks need no lock; only check-and-increment does
        with self._lock:
            if self._closed:
                reason: RefusalReason | None = RefusalReason.CLOSED
            elif expired:
                reason = RefusalReason.DEADLINE
            elif self._taken >= self.slots:
                reason = RefusalReason.SLOTS
            else:
                reason = None
                taken = self._taken + 1
                _set_taken(self, taken)  # sealed against setattr; the slot's own setter
                slot = self.first_slot + taken - 1
            if reason is not None:
                self._refusals.append(
                    RefusalRecord(
                        run_id=self.run_id,
                        round_index=self.round_index,
                        what="attempt",
                        kind=kind.value,
                        reason=reason,
                        at_wall=self._clock.wall(),
                    )
                )
        if reason is not None:
            raise RecallBudgetExceeded(self.refusal(reason))
        return slot

    def _trace(self, trace: AttemptTrace) -> None:
        with self._lock:
            self._traces[trace.attempt_id] = trace

    def attempt(
        self,
        kind: AttemptKind = AttemptKind.DELIBERATE,
        *,
        strategy: str | None = None,
        fingerprint: str | None = None,
        key: bytes | None = None,
    ) -> Attempt:
        """One search attempt: ``async with permit.attempt() as slot: ...``.

        Takes a slot (its number is distinct across the run) and runs the body in a cancel
        scope that ends at the permit's deadline. Raises :class:`RecallBudgetExceeded` with
        reason ``CLOSED`` after the phase ended, ``DEADLINE`` when the permit has expired, or
        ``SLOTS`` when the round has no slot left; a body cancelled by the deadline, or one that
        returns after the deadline (it blocked where no cancel scope reaches: a thread, a
        blocking call on the loop), also leaves as ``DEADLINE``. The slot stays consumed
        whatever happens; the trace is recorded. A keyed permit needs its round's ``key``
        (:class:`PermitMisuseError` otherwise; no slot is taken).
        """
        return Attempt(self, kind, strategy, fingerprint, sync=False, key=key)

    def attempt_sync(
        self,
        kind: AttemptKind = AttemptKind.DELIBERATE,
        *,
        strategy: str | None = None,
        fingerprint: str | None = None,
        key: bytes | None = None,
    ) -> Attempt:
        """:meth:`attempt` as a plain context manager, for tools running in worker threads.

        The deadline is checked when the slot is taken; there is no cancel scope.
        """
        return Attempt(self, kind, strategy, fingerprint, sync=True, key=key)

    def source_read(self, slot: int, *, key: bytes | None = None) -> int:
        """Account one source-read fallback of the attempt holding ``slot``; return its number.

        A fallback stays inside its attempt: it takes no new slot and keeps the deadline. It
        raises :class:`RecallBudgetExceeded` (``SOURCE_READS``) past the policy's finite number
        of fallbacks, ``DEADLINE`` when expired, ``CLOSED`` after the phase ended. A keyed
        permit needs its round's ``key``.
        """
        self._check_key(key)
        with self._lock:
            if not self.first_slot <= slot < self.first_slot + self._taken:
                raise InvalidArgumentError(f"slot {slot} was not taken from this permit")
            if self._closed:
                reason: RefusalReason | None = RefusalReason.CLOSED
            elif self.expired():
                reason = RefusalReason.DEADLINE
            elif self._source_reads.get(slot, 0) >= self._source_reads_limit:
                reason = RefusalReason.SOURCE_READS
            else:
                reason = None
                self._source_reads[slot] = count = self._source_reads.get(slot, 0) + 1
        if reason is not None:
            raise RecallBudgetExceeded(self.refusal(reason))
        return count

    def note_dropped(self, slot: int, count: int, *, key: bytes | None = None) -> None:
        """Count, in the trace of the attempt holding ``slot``, ``count`` evidence items its
        retriever returned for another principal or scope (dropped before anything was
        rendered). A keyed permit needs its round's ``key``."""
        self._check_key(key)
        if count <= 0:
            return
        with self._lock:
            if not self.first_slot <= slot < self.first_slot + self._taken:
                raise InvalidArgumentError(f"slot {slot} was not taken from this permit")
            self._dropped[slot] = self._dropped.get(slot, 0) + count

    # -- traces ------------------------------------------------------------------------------

    def record_calls(self, calls: Sequence[CallRecord], *, retain_limit: int = 0) -> None:
        """Buffer the round's call outcomes: written in the same commit as the round's traces,
        when its phase ends, with the ``ok`` calls' evidence retained within ``retain_limit``
        (see :meth:`Ledger.record`). Only while the phase runs (``PermitMisuseError`` after)."""
        with self._lock:
            if self._flushed:
                raise PermitMisuseError("call outcomes are recorded before the round ends")
            self._calls.extend(calls)
            self._retain_limit.append(retain_limit)

    async def flush(self) -> None:
        """Write buffered traces and refusals to the ledger (shielded from cancellation).

        A flush takes what is buffered out of the buffer, so flushes running at once (late
        attempts ending in parallel) never write a record twice. A failed write (a locked or
        closed ledger) puts it back for the next flush, behind nothing newer, and its error
        propagates: nothing leaves for good before the ledger committed it.
        """
        with self._lock:
            traces = dict(self._traces)
            refusals = list(self._refusals)
            calls = list(self._calls)
            self._traces.clear()
            self._refusals.clear()
            self._calls.clear()
        if not traces and not refusals and not calls:
            return
        try:
            with anyio.CancelScope(shield=True):
                for delay in _RECORD_RETRIES:
                    try:
                        if calls:
                            await self._ledger.record(
                                list(traces.values()), refusals, calls,
                                retain_limit=max(self._retain_limit, default=0))
                        else:  # a ledger written before call records still takes this
                            await self._ledger.record(list(traces.values()), refusals)
                        break
                    except LedgerLockedError:
                        if delay is None:
                            raise
                        await anyio.sleep(delay)
        except BaseException:
            with self._lock:
                for attempt_id, trace in traces.items():
                    self._traces.setdefault(attempt_id, trace)  # a newer trace wins
                self._refusals[:0] = refusals
                self._calls[:0] = calls
            raise

    def _flush_from_thread(self) -> None:
        """After the phase, write what a worker thread recorded, if it can reach the loop.

        Only an anyio worker thread (``to_thread.run_sync``) can; from any other thread the
        record stays buffered (an attempt keeps its ``in_flight`` trace).
        """
        if not self._flushed:
            return  # the phase will write it
        with contextlib.suppress(RuntimeError):  # not an anyio worker thread, or no loop
            anyio.from_thread.run(self.flush)

    async def _finish_phase(self) -> None:
        """Close, then persist what the phase recorded. Later records are written as they come."""
        object.__setattr__(self, "_closed", True)  # the round's own close needs no key
        object.__setattr__(self, "_flushed", True)
        await self.flush()


def key_digest(key: bytes) -> bytes:
    """What a keyed permit keeps of its round's key."""
    return hashlib.sha256(key).digest()


_set_taken = Permit.__dict__["_taken"].__set__
"""The ``_taken`` slot's setter: the hot path's write past the sealed ``__setattr__``."""


class Attempt:
    """The context manager returned by :meth:`Permit.attempt` and :meth:`Permit.attempt_sync`."""

    __slots__ = (
        "_fingerprint", "_id", "_key", "_kind", "_permit", "_scope", "_slot", "_started_mono",
        "_started_wall", "_strategy", "_sync", "_watch",
    )

    def __init__(
        self,
        permit: Permit,
        kind: AttemptKind,
        strategy: str | None,
        fingerprint: str | None,
        *,
        sync: bool,
        key: bytes | None = None,
    ) -> None:
        self._permit = permit
        self._key = key
        self._kind = kind
        self._strategy = strategy
        self._fingerprint = fingerprint
        self._sync = sync
        self._scope: anyio.CancelScope | None = None
        self._slot = 0
        self._id = ""
        self._started_wall = 0.0
        self._started_mono = 0.0
        self._watch: tuple[observe.Observer, object] | None = None

    @property
    def slot(self) -> int:
        return self._slot

    def _begin(self) -> int:
        permit = self._permit
        permit._check_issued()
        permit._check_key(self._key)
        observer = observe.active
        try:
            self._slot = permit._take(self._kind)
        except RecallBudgetExceeded as exc:
            if observer is not None:
                observer.attempt_refused(permit, self._kind, exc.refusal)
            raise
        self._id = uuid.uuid4().hex
        clock = permit._clock
        self._started_wall = clock.wall()
        self._started_mono = clock.monotonic()
        trace = self._record(AttemptOutcome.IN_FLIGHT)
        permit._trace(trace)
        if observer is not None:
            self._watch = (observer, observer.attempt_started(permit, trace))
        return self._slot

    def _end(self, outcome: AttemptOutcome) -> None:
        trace = self._record(outcome)
        self._permit._trace(trace)
        if self._watch is not None:
            self._watch[0].attempt_ended(self._watch[1], trace)

    def _record(self, outcome: AttemptOutcome) -> AttemptTrace:
        permit = self._permit
        elapsed = (
            None
            if outcome is AttemptOutcome.IN_FLIGHT
            else permit._clock.monotonic() - self._started_mono
        )
        return AttemptTrace(
            attempt_id=self._id,
            run_id=permit.run_id,
            round_index=permit.round_index,
            slot=self._slot,
            kind=self._kind.value,
            outcome=outcome,
            started_wall=self._started_wall,
            elapsed_s=elapsed,
            strategy=self._strategy,
            fingerprint=self._fingerprint,
            legacy=permit.legacy,
            dropped=permit._dropped.get(self._slot, 0),
        )

    # -- async -------------------------------------------------------------------------------

    async def __aenter__(self) -> int:
        if self._sync:
            raise PermitMisuseError("use `with permit.attempt_sync()`, not `async with`")
        try:
            slot = self._begin()
        except RecallBudgetExceeded:
            if self._permit._flushed:
                await self._permit.flush()
            raise
        self._scope = anyio.CancelScope(
            deadline=anyio.current_time() + self._permit.seconds_left()  # inf for legacy
        )
        self._scope.__enter__()
        return slot

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._scope is not None
        scope, self._scope = self._scope, None
        swallowed = scope.__exit__(exc_type, exc, tb)
        if scope.cancelled_caught or (exc is None and self._permit._outlived()):
            # A body that returns past the deadline blocked where no cancel scope reaches:
            # what it produced is late, so it leaves the way a cancelled one does. Like the
            # cancel scope, this follows the monotonic deadline (a wall step ends the permit,
            # not the attempt in flight).
            outcome = AttemptOutcome.DEADLINE
        elif exc is None:
            outcome = AttemptOutcome.OK
        elif isinstance(exc, anyio.get_cancelled_exc_class()):
            outcome = AttemptOutcome.CANCELLED
        else:
            outcome = AttemptOutcome.ERROR
        self._end(outcome)
        if self._permit._flushed:
            await self._permit.flush()
        if outcome is AttemptOutcome.DEADLINE:
            raise RecallBudgetExceeded(self._permit.refusal(RefusalReason.DEADLINE)) from None
        return bool(swallowed)

    # -- sync --------------------------------------------------------------------------------

    def __enter__(self) -> int:
        if not self._sync:
            raise PermitMisuseError("use `async with permit.attempt()`, or permit.attempt_sync()")
        try:
            return self._begin()
        except RecallBudgetExceeded:
            self._permit._flush_from_thread()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end(AttemptOutcome.OK if exc is None else AttemptOutcome.ERROR)
        self._permit._flush_from_thread()


@contextmanager
def hide_permit() -> Iterator[None]:
    """Run a block (and every task it spawns) with no permit visible: ``current_permit()`` is
    None there. The hooks run untrusted retriever code this way; it gets a narrow handle instead.
    """
    token = _current.set(None)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # left from another context: nothing to undo
            _current.reset(token)
