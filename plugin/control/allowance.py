"""The recall allowance: durable rounds that issue permits.

``async with allowance.round(run_id, RoundKind.AUTOMATIC) as permit:`` reserves the round in
the ledger (durably), awaits the host's checkpoint callback if one is given, and only then
issues a :class:`~plugin.control.permit.Permit`, bound to
:func:`~plugin.control.permit.current_permit` while the block runs and closed when it ends.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Awaitable, Callable
from types import TracebackType

import attrs

from plugin.errors import InvalidRunIdError

from .clock import Clock, SystemClock
from .ledger import Ledger, Usage
from .permit import _ISSUER, LEGACY_SLOTS, Permit, _Binding
from .policy import AllowancePolicy, RoundKind
from .refusal import BudgetRefusal, RecallBudgetExceeded

Checkpoint = Callable[[str, int], Awaitable[None]]
"""The host's checkpoint callback: ``await checkpoint(run_id, round_index)``."""

MAX_RUN_ID_BYTES = 512


def validate_run_id(run_id: object) -> str:
    """Return ``run_id`` if it is a non-empty, storable string; raise ``InvalidRunIdError``."""
    if not isinstance(run_id, str):
        raise InvalidRunIdError(f"run_id must be a str, got {type(run_id).__name__}")
    if not run_id.strip():
        raise InvalidRunIdError("run_id must not be empty or blank")
    try:
        size = len(run_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidRunIdError(f"run_id is not valid Unicode text: {exc}") from None
    if size > MAX_RUN_ID_BYTES or "\x00" in run_id:
        raise InvalidRunIdError(
            f"run_id must be at most {MAX_RUN_ID_BYTES} UTF-8 bytes with no NUL character"
        )
    return run_id


@attrs.frozen
class _Anchor:
    """What this process observed of a run's deadline on its own monotonic clock."""

    deadline_wall: float
    mono: float
    left: float


@attrs.define(eq=False)
class RecallAllowance:
    """Issues permits for a run's recall rounds under an :class:`AllowancePolicy`.

    ``checkpoint``, when given, is awaited after a round's reservation is committed and before
    its permit is issued; if it raises, the error propagates, no permit is issued, and the
    reserved slots stay consumed. Use :meth:`legacy` for the explicit unenforced mode.
    """

    ledger: Ledger
    policy: AllowancePolicy = attrs.field(factory=AllowancePolicy)
    clock: Clock = attrs.field(factory=SystemClock)
    checkpoint: Checkpoint | None = None
    is_legacy: bool = attrs.field(default=False, kw_only=True)
    _anchors: collections.OrderedDict[str, _Anchor] = attrs.field(
        factory=collections.OrderedDict, init=False, repr=False
    )

    max_anchors = 65_536
    """How many runs' monotonic anchors this process remembers (oldest forgotten first)."""

    def __attrs_post_init__(self) -> None:
        if self.ledger is None:
            raise TypeError("RecallAllowance needs a ledger; use RecallAllowance.legacy() "
                            "for the explicit unenforced mode")
        if not isinstance(self.policy, AllowancePolicy):
            raise TypeError(f"policy must be an AllowancePolicy, got {self.policy!r}")

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
            raise TypeError(f"kind must be a RoundKind, got {kind!r}")
        if kind is RoundKind.AUTOMATIC:
            if slots is not None:
                raise ValueError("an automatic round reserves policy.automatic_slots; "
                                 "slots= is for deliberate rounds")
            requested = self.policy.automatic_slots
        else:
            if slots is None:
                raise ValueError("a deliberate round needs slots= (one per validated call)")
            if isinstance(slots, bool) or not isinstance(slots, int):
                raise TypeError(f"slots must be an int, got {type(slots).__name__}")
            if slots < 1:
                raise ValueError(f"slots must be >= 1, got {slots}")
            requested = slots
        return Round(self, run_id, kind, requested)

    async def usage(self, run_id: str) -> Usage:
        """The run's totals from the ledger."""
        return await self.ledger.usage(validate_run_id(run_id))

    # -- internals ---------------------------------------------------------------------------

    def _now_wall(self, run_id: str) -> float:
        """Wall time, never earlier than this process's monotonic observation of the run allows.

        A wall clock stepped backwards between two rounds must not re-open a deadline that
        this process has watched pass on its monotonic clock.
        """
        wall = self.clock.wall()
        anchor = self._anchors.get(run_id)
        if anchor is not None:
            left = anchor.left - (self.clock.monotonic() - anchor.mono)
            wall = max(wall, anchor.deadline_wall - left)
        return wall

    def _anchor(self, run_id: str, deadline_wall: float, left: float) -> None:
        if run_id not in self._anchors:
            self._anchors[run_id] = _Anchor(deadline_wall, self.clock.monotonic(), left)
            while len(self._anchors) > self.max_anchors:
                self._anchors.popitem(last=False)

    async def _issue(self, run_id: str, kind: RoundKind, requested: int) -> Permit:
        if self.is_legacy:
            return Permit(
                run_id=run_id, round_index=0, kind=kind, slots=LEGACY_SLOTS, first_slot=1,
                legacy=True, clock=self.clock, ledger=self.ledger, deadline_wall=math.inf,
                issued_mono=self.clock.monotonic(), left_at_issue=math.inf,
                source_reads_limit=LEGACY_SLOTS, reserved_total=0, executed_before=0,
                _issuer=_ISSUER,
            )
        result = await self.ledger.reserve(
            run_id, kind, requested, self.policy, self._now_wall(run_id)
        )
        if isinstance(result, BudgetRefusal):
            raise RecallBudgetExceeded(result)
        if self.checkpoint is not None:
            await self.checkpoint(run_id, result.round_index)
        now = self._now_wall(run_id)
        left = max(0.0, result.deadline_wall - now)
        self._anchor(run_id, result.deadline_wall, left)
        return Permit(
            run_id=run_id, round_index=result.round_index, kind=kind, slots=result.slots,
            first_slot=result.first_slot, legacy=False, clock=self.clock, ledger=self.ledger,
            deadline_wall=result.deadline_wall, issued_mono=self.clock.monotonic(),
            left_at_issue=left, source_reads_limit=self.policy.source_read_fallbacks,
            reserved_total=result.reserved, executed_before=result.executed, _issuer=_ISSUER,
        )


class Round:
    """The async context manager returned by :meth:`RecallAllowance.round`."""

    __slots__ = ("_allowance", "_binding", "_kind", "_permit", "_requested", "_run_id")

    def __init__(
        self, allowance: RecallAllowance, run_id: str, kind: RoundKind, requested: int
    ) -> None:
        self._allowance = allowance
        self._run_id = run_id
        self._kind = kind
        self._requested = requested
        self._permit: Permit | None = None
        self._binding: _Binding | None = None

    async def __aenter__(self) -> Permit:
        if self._permit is not None:
            raise RuntimeError("a round is entered once; reserve a new round instead")
        permit = await self._allowance._issue(self._run_id, self._kind, self._requested)
        self._permit = permit
        self._binding = _Binding.install(permit)
        return permit

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        permit, binding = self._permit, self._binding
        assert permit is not None and binding is not None
        try:
            await permit._finish_phase()
        finally:
            binding.uninstall(permit)
