"""RecallHooks: recall in an agent loop's two phases, under the allowance.

* **Preparation** (:meth:`RecallHooks.prepare`, before the model is called): the automatic
  turn (:func:`plugin.memory.turn.prepare_turn`). The query is planned once; the round
  reserves ``automatic_slots``; the base search runs, and a delta (a People-to-belief read)
  only when the base discovered people whose beliefs it did not read. The model gets rendered
  evidence, or a :class:`~plugin.BoundedRecallNotice` when the round is refused or runs out.
  Current correction notices are always included, under the context caps.
* **Tool dispatch** (:meth:`RecallHooks.dispatch`, the model's search calls of one turn): the
  deliberate turn (:func:`plugin.memory.turn.deliberate_turn`). Each call is validated
  (:mod:`runtime_hooks.calls`); the round reserves one slot per valid call plus one per call
  whose query names known People (its nested belief read); a call without a slot, and every
  call once the allowance is spent, gets a typed :class:`~plugin.BudgetRefusal`.

**Enforcement lives in the rounds, not in the retriever** (:mod:`plugin.memory.enforce`): every
attempt is opened before the retriever runs, and every call into the retriever is contained
(it runs where no permit is bound). Whatever a retriever does, each call gets exactly one result,
in order; its failure is its own ``failed`` result; a search that outlived the deadline is a
``deadline`` refusal; evidence of another principal or scope never reaches the model.

**Preparation comes first, under its own bound** (:class:`~plugin.memory.PreparationBound`): a
turn's queries are formed and embedded before the round is reserved; only the calls that can
still get a slot (:meth:`~plugin.RecallAllowance.slots_estimate`: an estimate that is never
too low; the reservation decides) are embedded.

What the model reads is built in :mod:`runtime_hooks.results`; a turn's valid search calls
are replayed, run and recorded in :mod:`runtime_hooks.deliberate`. Bind the run at the run
boundary with :meth:`RecallHooks.bind_run` (frameworks run their before-model hooks in copied
contexts). The hooks reach the memory layer only through its protocols
(:class:`~plugin.memory.RecallPreparer`, :class:`~plugin.memory.protocol.Retriever`); the bootstrap
picks the concrete classes.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import anyio
import anyio.lowlevel
import attrs

from plugin.control import (
    BoundedRecallNotice,
    BudgetRefusal,
    PermitHolder,
    RecallAllowance,
    bind_permits,
    validate,
    validate_run_id,
)
from plugin.control.ledger import IdentityCache, check_identity
from plugin.control.logs import log_event
from plugin.control.shield import loop_token
from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError
from plugin.memory.enforce import stop_unwrapped
from plugin.memory.preparation import PreparationBound, RecallPreparer, WithheldReason
from plugin.memory.protocol import ContextCaps, Retriever, check_retriever
from plugin.memory.state import WorkingState
from plugin.memory.turn import (
    PREPARATION_BUDGET_S,
    CorrectionsShare,
    plan_with_corrections,
    prepare_turn,
)

from .calls import MAX_ARGUMENT_CHARS as MAX_ARGUMENT_CHARS
from .calls import MAX_ARGUMENT_DEPTH as MAX_ARGUMENT_DEPTH
from .calls import MAX_CALL_ID_BYTES as MAX_CALL_ID_BYTES
from .calls import MAX_QUERY_BYTES as MAX_QUERY_BYTES
from .calls import InvalidSearchCallError as InvalidSearchCallError
from .calls import SearchCall as SearchCall
from .calls import ToolCall as ToolCall
from .calls import arguments_digest, is_one_off
from .deliberate import Turn, replay_recorded, run_calls, run_once
from .deliberate import call_records as call_records
from .results import NOTHING_FOUND as NOTHING_FOUND
from .results import PARTLY_FOUND as PARTLY_FOUND
from .results import PreparedContext as PreparedContext
from .results import ToolResult as ToolResult
from .results import Validation as Validation
from .results import preparation_bounded, rejected_call
from .retained import revalidate_retained

_log = logging.getLogger("recallbound.hooks")


def _trusted(name: str, value: object) -> str:
    """A trusted runtime argument (scope, principal): never taken from the model or the text.

    Checked by the rule the ledger binds a run's identity with (a non-blank str, valid Unicode,
    no NUL, at most :data:`~plugin.control.validate.MAX_ID_BYTES` UTF-8 bytes), so every hook
    refuses the same values, the ones that bind nothing (``refused_context``) too."""
    return validate.bounded_text(value, field=name, max_bytes=validate.MAX_ID_BYTES)


def _positive_seconds(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentTypeError(
            f"RecallHooks.{attribute.name} must be a number, got {type(value).__name__}"
        )
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgumentError(
            f"RecallHooks.{attribute.name} must be finite and > 0, got {value!r}"
        )


def _retriever(instance: object, attribute: attrs.Attribute[Retriever], value: object) -> None:
    check_retriever(value)


def _check_state(state: object) -> None:
    if not isinstance(state, WorkingState):
        raise InvalidArgumentTypeError(f"state must be a WorkingState, got {type(state).__name__}")


def _log_corrections(run_id: str, share: CorrectionsShare) -> None:
    """Log a failed read of the current corrections (the turn goes on without them)."""
    if share.failure is not None:
        log_event(_log, logging.WARNING, "corrections.retriever_failed", run_id=run_id,
                  reason=share.failure)


@attrs.define(eq=False)
class RecallHooks:
    """The plugin's two hooks for an agent loop; see the module docstring.

    ``retriever`` is checked at construction (:class:`~plugin.errors.RetrieverProtocolError`,
    a ``TypeError`` naming the method, when a method is missing or is not ``async def``).
    """

    allowance: RecallAllowance
    preparer: RecallPreparer
    retriever: Retriever = attrs.field(validator=_retriever, on_setattr=attrs.setters.validate)
    caps: ContextCaps = attrs.field(factory=ContextCaps)
    validation_limit: int = 8
    """Re-checks of retained deliberate evidence allowed per run (kept in the ledger)."""
    max_retained: int = 64
    """Evidence items retained per run from deliberate searches (kept in the ledger)."""
    preparation_budget_s: float = attrs.field(default=PREPARATION_BUDGET_S, kw_only=True,
                                              validator=_positive_seconds)
    """How long one hook call may spend preparing queries (planning, embedding, the People
    lookup) before the round; what is left unprepared runs without its semantic arm."""
    loop: anyio.lowlevel.EventLoopToken | None = attrs.field(factory=loop_token, kw_only=True,
                                                             repr=False)
    """The event loop the hooks were built on (None when built outside one): the ledger's and
    the store's locks, connections and pools belong to it. The adapters run a run's recall on
    it when the framework runs the agent on another loop (``run_sync``, ``asyncio.run`` in a
    request thread), so it must keep running while they do (a blocking portal, or async code
    that awaits the other threads); the hooks' own methods run on the loop that awaits them."""
    _running: dict[tuple[str, str, str], anyio.Event] = attrs.field(factory=dict, init=False,
                                                                    repr=False)
    """The calls (run, call id, digest) these hooks are running now: the same call sent again
    meanwhile waits for their outcome instead of searching."""
    _bound: IdentityCache = attrs.field(factory=IdentityCache, init=False, repr=False)
    """The runs these hooks bound, with their (principal, scope)."""

    @property
    def legacy(self) -> bool:
        """Whether these hooks run the explicit legacy (unenforced) path."""
        return self.allowance.is_legacy

    @contextmanager
    def bind_run(self) -> Iterator[PermitHolder]:
        """Bind the run-scoped permit holder; use it around the framework's run call."""
        with bind_permits() as holder:
            yield holder

    def _check(self, run_id: str, scope: str, principal: str) -> tuple[str, str]:
        validate_run_id(run_id)
        return _trusted("scope", scope), _trusted("principal", principal)

    async def _bind(self, run_id: str, scope: str, principal: str) -> None:
        """Bind the run to its checked principal and scope in the ledger (first use wins;
        another principal or scope raises :class:`~plugin.errors.RunIdentityError`)."""
        await self.allowance.ledger.bind_identity(run_id, principal=principal, scope=scope)
        self._bound.put(run_id, (principal, scope))

    # -- preparation ------------------------------------------------------------------------

    @stop_unwrapped
    async def prepare(
        self, state: WorkingState, *, run_id: str, scope: str, principal: str
    ) -> PreparedContext:
        """The automatic round for this turn; see the module docstring.

        Raises :class:`~plugin.errors.InvalidArgumentTypeError` /
        :class:`~plugin.errors.InvalidArgumentError` (also ``TypeError`` / ``ValueError``)
        for a malformed state or trusted arguments, :class:`~plugin.errors.LedgerError` when
        the round cannot be committed (fail closed: nothing is searched). A failing retriever
        is said in the context (``failure``), never raised.
        """
        scope, principal = self._check(run_id, scope, principal)
        _check_state(state)
        await self._bind(run_id, scope, principal)
        turn = await prepare_turn(
            self.allowance, self.preparer, self.retriever, state, run_id=run_id, scope=scope,
            principal=principal, caps=self.caps, budget_s=self.preparation_budget_s,
            on_corrections=lambda share: _log_corrections(run_id, share),
        )
        prepared, corrections, recall = turn.prepared, turn.corrections, turn.recall
        if recall.refusal is not None:
            log_event(_log, logging.INFO, "automatic.bounded", run_id=run_id,
                      reason=recall.refusal.reason.value)
        if recall.failure is not None:
            log_event(_log, logging.WARNING, "automatic.retriever_failed", run_id=run_id,
                      reason=recall.failure)
        bounded = recall.bounded
        if recall.slots:  # the search ran without what preparation withheld
            bounded = (*preparation_bounded(prepared), *bounded)
        return PreparedContext(
            run_id=run_id,
            query=prepared.query,
            evidence=recall.evidence,
            rendered=recall.rendered.text if recall.rendered is not None else "",
            corrections=corrections.shown,
            corrections_omitted=corrections.omitted,
            notice=(
                BoundedRecallNotice.from_refusal(recall.refusal)
                if recall.refusal is not None
                else None
            ),
            slots=recall.slots,
            notes=(*corrections.notes, *recall.notes),
            bounded=bounded,
            failure=recall.failure,
            dropped=recall.dropped + corrections.dropped,
        )

    @stop_unwrapped
    async def refused_context(
        self, state: WorkingState, refusal: BudgetRefusal, *, scope: str, principal: str
    ) -> PreparedContext:
        """The context of a turn refused before its round (``refusal``; the caller may open
        no more runs, say): the current corrections, which take no slot, then the bounded
        notice, as :meth:`prepare` gives them for a refused round. The query is planned
        without its semantic arm; nothing is bound, reserved or searched."""
        if not isinstance(refusal, BudgetRefusal):
            raise InvalidArgumentTypeError(
                f"refusal must be a BudgetRefusal, got {type(refusal).__name__}")
        run_id = refusal.run_id
        scope, principal = self._check(run_id, scope, principal)
        _check_state(state)

        prepared, corrections = await plan_with_corrections(
            self.preparer, self.retriever, state,
            bound=PreparationBound(self.preparation_budget_s, self.allowance.clock),
            run_id=run_id, scope=scope, principal=principal, caps=self.caps,
            withhold=WithheldReason.NO_SLOT)
        _log_corrections(run_id, corrections)
        return PreparedContext(
            run_id=run_id, query=prepared.query, corrections=corrections.shown,
            corrections_omitted=corrections.omitted,
            notice=BoundedRecallNotice.from_refusal(refusal), notes=corrections.notes)

    # -- tool dispatch ----------------------------------------------------------------------

    @stop_unwrapped
    async def dispatch(
        self, calls: Sequence[ToolCall], *, run_id: str, scope: str, principal: str
    ) -> list[ToolResult]:
        """The deliberate round for one turn's search calls; one result per call, in order.

        A call that is malformed, too large or too deep, out of scope, or repeats an id
        already seen in this turn gets an ``invalid`` result and no slot; the others go on.
        A call whose retriever failed gets a ``failed`` result (typed ``failure``).
        """
        scope, principal = self._check(run_id, scope, principal)
        _check_calls(calls)
        results: list[ToolResult | None] = [None] * len(calls)
        valid: list[tuple[int, SearchCall]] = []
        seen: set[str] = set()
        for index, call in enumerate(calls):
            try:
                checked = SearchCall.validate(call, scope=scope)
                if checked.call_id in seen:
                    raise InvalidSearchCallError("duplicate call id in this turn")
            except InvalidSearchCallError as exc:
                log_event(_log, logging.INFO, "search_call.invalid", run_id=run_id,
                          call_id=call.call_id, error=str(exc))
                results[index] = rejected_call(call.call_id, exc)
                continue
            seen.add(checked.call_id)
            valid.append((index, checked))
        known = None if valid else self._bound.get(run_id)
        if known is not None:  # junk calls naming a run these hooks bound: whose is it?
            check_identity(run_id, known, principal, scope)
        if valid:  # an invalid call binds no identity and writes nothing
            await self._bind(run_id, scope, principal)
            digests = {index: arguments_digest(calls[index].arguments) for index, _ in valid}
            turn = Turn(self, run_id, scope, principal, digests, results)
            if self.legacy:
                await run_calls(turn, valid)
            else:
                await run_once(turn, valid, {i for i, _ in valid if is_one_off(calls[i])})
        assert all(result is not None for result in results)
        return [result for result in results if result is not None]

    async def replay(
        self, calls: Sequence[ToolCall], *, run_id: str, scope: str, principal: str
    ) -> list[ToolResult | None]:
        """Answer each call the ledger recorded (same run, id and canonical arguments, in any
        process) with its recorded outcome; None for a call never dispatched (or invalid).

        Never searches and never reserves: what a tool that finds no stored result asks
        before it concludes that its call was never dispatched. Legacy hooks read no record
        (they write none): None for every call.
        """
        scope, principal = self._check(run_id, scope, principal)
        _check_calls(calls)
        results: list[ToolResult | None] = [None] * len(calls)
        valid: list[tuple[int, SearchCall]] = []
        for index, call in enumerate(calls):
            with contextlib.suppress(InvalidSearchCallError):
                valid.append((index, SearchCall.validate(call, scope=scope)))
        if valid and not self.legacy:
            await self._bind(run_id, scope, principal)
            digests = {index: arguments_digest(calls[index].arguments) for index, _ in valid}
            await replay_recorded(Turn(self, run_id, scope, principal, digests, results), valid)
        return results

    # -- retained evidence -----------------------------------------------------------------

    async def validate_retained(
        self, evidence_ids: Sequence[str], *, run_id: str, scope: str, principal: str
    ) -> list[Validation]:
        """Re-check evidence this run retained from deliberate searches.

        This is not a search and takes no slot, so it stays available when the allowance is
        spent; it has its own bound (``validation_limit`` ids per run), kept with the run in
        the ledger, so a resume or another hooks object cannot reset it. An id the run never
        retained is ``not_retained``; one no longer visible is ``gone``; when the retriever
        fails the re-read, or it outlives the policy's ``deadline_s``, ``failed``.
        """
        scope, principal = self._check(run_id, scope, principal)
        given: object = evidence_ids
        if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
            raise InvalidArgumentTypeError(
                f"evidence_ids must be a sequence of str, got {type(evidence_ids).__name__}"
            )
        if not all(isinstance(i, str) for i in evidence_ids):
            raise InvalidArgumentTypeError("evidence_ids must all be str")
        await self._bind(run_id, scope, principal)
        return await revalidate_retained(
            self.allowance.ledger, self.retriever, evidence_ids, run_id=run_id, scope=scope,
            principal=principal, limit=self.validation_limit,
            within_s=self.allowance.policy.deadline_s, caps=self.caps,
        )


def _check_calls(calls: object) -> None:
    """``calls`` must be a sequence (not a string) of :class:`ToolCall`, or a typed error."""
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
        raise InvalidArgumentTypeError(
            f"calls must be a sequence of ToolCall, got {type(calls).__name__}"
        )
    for position, call in enumerate(calls):
        if not isinstance(call, ToolCall):
            raise InvalidArgumentTypeError(
                f"calls[{position}] must be a ToolCall, got {type(call).__name__}"
            )
