"""RecallHooks: recall in an agent loop's two phases, under the allowance.

* **Preparation** (:meth:`RecallHooks.prepare`, before the model is called): the automatic
  round. The query is planned once; the round reserves ``automatic_slots``; the base search
  runs, and a delta (a People-to-belief read) only when the base discovered people whose
  beliefs it did not read. The model gets rendered evidence, or a
  :class:`~plugin.BoundedRecallNotice` when the round is refused or runs out. Current
  correction notices are always included, under the context caps.
* **Tool dispatch** (:meth:`RecallHooks.dispatch`, the model's search calls of one turn): the
  deliberate round. Each call is validated (well-formed, in scope, bounded in size and depth);
  the round reserves one slot per valid call plus one per call whose query names known People
  (its nested belief read); the calls take their slots in order, before any nested read; a
  call without a slot, and every call once the allowance is spent, gets a typed
  :class:`~plugin.BudgetRefusal` as its result.

**Enforcement lives here, not in the retriever.** The hooks open every attempt (its slot, its
deadline, its trace) and call the :class:`~plugin.memory.pipeline.Retriever` inside it with a
narrow handle (:mod:`plugin.memory.enforce`); the retriever never sees the permit.

**Preparation comes first, under its own bound.** A turn's queries are formed and embedded
*before* the round is reserved, so the permit's time is spent on searching, not on embedding;
the preparation has a bound of its own (``preparation_budget_s`` on the injected clock, and a
real cancel scope around each embedding). Only the calls that can still get a slot (the run's
usage says how many are left) are embedded; the rest are not worth the time.

Whatever the allowance cut short is said in what the model reads, in the bounded wording, as
a typed field (``ToolResult.bounded``, ``PreparedContext.bounded``), never as "nothing found".

Bind the run at the run boundary with :meth:`RecallHooks.bind_run` (frameworks run their
before-model hooks in copied contexts). The hooks reach the memory layer only through its
protocols (:class:`~plugin.RecallPreparer`, :class:`~plugin.memory.pipeline.Retriever`); the
bootstrap picks the concrete classes.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Literal

import anyio
import attrs

from plugin.control import (
    AttemptKind,
    BoundedRecallNotice,
    BudgetRefusal,
    PermitHolder,
    RecallAllowance,
    RecallBudgetExceeded,
    RoundKind,
    Validity,
    bind_permits,
    validate_run_id,
)
from plugin.control.logs import log_event
from plugin.control.policy import MAX_COUNT
from plugin.errors import (
    InvalidHookArgumentError,
    InvalidHookArgumentTypeError,
    InvalidToolCallError,
    MemoryStoreError,
    RecallboundError,
)
from plugin.memory.enforce import Bounded, search_attempt
from plugin.memory.pipeline import ContextCaps, Retriever, query_terms, render
from plugin.memory.planning import RecallQuery
from plugin.memory.preparation import PreparedRecall, RecallPreparer, WithheldReason
from plugin.memory.recall import automatic_round
from plugin.memory.safe_text import one_line
from plugin.memory.state import WorkingState
from plugin.memory.store import Evidence

_log = logging.getLogger("recallbound.hooks")

MAX_QUERY_BYTES = 4096
"""The longest search-call query accepted (UTF-8 bytes); longer calls are invalid."""

MAX_ARGUMENT_CHARS = 8 * MAX_QUERY_BYTES
"""The longest arguments JSON text read (characters; a query escaped as \\u escapes fits)."""

MAX_ARGUMENT_DEPTH = 4
"""The deepest nesting of arguments JSON text read; a valid call has depth 1."""

MAX_CALL_ID_BYTES = 256
"""The longest call id accepted (UTF-8 bytes)."""

NOTHING_FOUND = "No matching memory was found."
PARTLY_FOUND = "No memory was found by the parts of this search that ran."


class InvalidSearchCallError(RecallboundError, ValueError):
    """A model's search call is malformed or out of scope (it gets no slot)."""


def _trusted(name: str, value: object) -> str:
    """A trusted runtime argument (scope, principal): never taken from the model or the text."""
    if not isinstance(value, str):
        raise InvalidHookArgumentTypeError(
            f"{name} must be a str from the trusted runtime, got {type(value).__name__}"
        )
    if not value.strip():
        raise InvalidHookArgumentError(f"{name} must not be empty")
    return value


def _call_id(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    # The adapter builds the ToolCall (trusted code); what the model chose for the id is
    # checked per call by dispatch, so one bad id never costs the turn.
    if not isinstance(value, str):
        raise InvalidToolCallError(f"ToolCall.call_id must be a str, got {type(value).__name__}")


@attrs.frozen(kw_only=True)
class ToolCall:
    """A tool call as the model emitted it: an id and its raw arguments.

    ``call_id`` must be a ``str`` (:class:`~plugin.errors.InvalidToolCallError`); an empty,
    over-long or non-UTF-8 id, and anything in ``arguments``, get an ``invalid`` result.
    """

    call_id: str = attrs.field(validator=_call_id)
    arguments: Mapping[str, object] | str
    """The arguments as a mapping, or as the JSON text many model APIs deliver."""


def _json_depth(text: str, limit: int) -> int:
    """The nesting depth of JSON ``text`` (brackets outside strings), counted up to ``limit``+1.

    Read before ``json.loads``, whose C scanner recurses once per level and raises
    ``RecursionError`` on deep input.
    """
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif char in "]}":
            depth -= 1
    return deepest


def _check_call_id(call_id: str) -> None:
    if not call_id.strip():
        raise InvalidSearchCallError("the call id is empty")
    try:
        size = len(call_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidSearchCallError("the call id is not valid Unicode text") from None
    if size > MAX_CALL_ID_BYTES:
        raise InvalidSearchCallError(f"the call id is longer than {MAX_CALL_ID_BYTES} bytes")


def _arguments(raw: object) -> Mapping[object, object]:
    """The arguments as a mapping, read within the size and depth bounds."""
    if isinstance(raw, str):
        if len(raw) > MAX_ARGUMENT_CHARS:
            raise InvalidSearchCallError(
                f"arguments are longer than {MAX_ARGUMENT_CHARS} characters"
            )
        if _json_depth(raw, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
            raise InvalidSearchCallError(f"arguments nest deeper than {MAX_ARGUMENT_DEPTH}")
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            raise InvalidSearchCallError("arguments are not valid JSON") from None
    if not isinstance(raw, Mapping):
        raise InvalidSearchCallError("arguments must be an object with a 'query'")
    if len(raw) > 8:
        raise InvalidSearchCallError("arguments have too many fields")
    return raw


@attrs.frozen(kw_only=True)
class SearchCall:
    """A validated search call."""

    call_id: str
    query: str

    @classmethod
    def validate(cls, call: ToolCall, *, scope: str) -> SearchCall:
        """Check a raw call: a usable id, a ``query`` string with searchable words, an optional
        ``scope`` equal to the run's trusted scope, nothing else, within the size and depth
        bounds. Raises :class:`InvalidSearchCallError`; never anything else.
        """
        try:
            return cls._validate(call, scope)
        except InvalidSearchCallError:
            raise
        except Exception as exc:  # a hostile mapping (raising __iter__, deep __eq__, ...)
            raise InvalidSearchCallError(
                f"arguments could not be read ({type(exc).__name__})"
            ) from None

    @classmethod
    def _validate(cls, call: ToolCall, scope: str) -> SearchCall:
        _check_call_id(call.call_id)
        args = _arguments(call.arguments)
        unknown = [key for key in args if key not in ("query", "scope")]
        if unknown:
            shown = ", ".join(
                repr(one_line(key, limit=40)) if isinstance(key, str) else type(key).__name__
                for key in unknown[:3]
            )
            raise InvalidSearchCallError(f"unknown argument(s): {shown}")
        query = args.get("query")
        if not isinstance(query, str):
            raise InvalidSearchCallError("'query' must be a string")
        if len(query) > MAX_QUERY_BYTES:
            raise InvalidSearchCallError(f"'query' is longer than {MAX_QUERY_BYTES} bytes")
        try:
            size = len(query.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidSearchCallError("'query' is not valid Unicode text") from None
        if size > MAX_QUERY_BYTES:
            raise InvalidSearchCallError(f"'query' is longer than {MAX_QUERY_BYTES} bytes")
        if not query_terms(query):
            raise InvalidSearchCallError("'query' has no searchable words")
        asked = args.get("scope")
        if asked is not None and not (isinstance(asked, str) and asked == scope):
            raise InvalidSearchCallError("'scope' is outside this run's scope")
        return cls(call_id=call.call_id, query=query)


Status = Literal["ok", "refused", "invalid", "failed"]


def _content(rendered: str, bounded: Sequence[Bounded]) -> str:
    """What the model reads for a search that ran: evidence, then what was cut short."""
    notes = [f"Note: {part.message}" for part in bounded]
    if rendered:
        return "\n".join([rendered, *notes])
    if notes:  # never "nothing found" when part of the search did not run
        return "\n".join([PARTLY_FOUND, *notes])
    return NOTHING_FOUND


@attrs.frozen(kw_only=True)
class ToolResult:
    """The result of one search call, as the model reads it."""

    call_id: str
    status: Status
    content: str
    slot: int | None = None
    evidence: tuple[Evidence, ...] = ()
    refusal: BudgetRefusal | None = None
    notes: tuple[str, ...] = ()
    """Degradations for traces and logs (not shown to the model; ``bounded`` is)."""
    bounded: tuple[Bounded, ...] = ()
    """Parts of the search the allowance cut short, in the bounded wording (also in
    ``content``): a refused nested read, sources left unread, an arm not run."""
    omitted: int = 0
    """Evidence items found but left out by the context caps (said in ``content``)."""

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready form for a tool-result message."""
        result: dict[str, object] = {"status": self.status, "content": self.content}
        if self.refusal is not None:
            result["refusal"] = self.refusal.as_tool_result()
        if self.evidence:
            result["evidence_ids"] = [item.id for item in self.evidence]
        if self.bounded:
            result["bounded"] = [part.as_dict() for part in self.bounded]
        if self.omitted:
            result["omitted"] = self.omitted
        return result


def _corrections_block(corrections: Sequence[Evidence], omitted: int) -> str:
    lines = [
        f"- [correction {one_line(c.id, limit=128)}] {one_line(c.text)}" for c in corrections
    ]
    if omitted:
        lines.append(
            f"({omitted} more correction{'s' if omitted != 1 else ''} left out by the context "
            f"cap; recall was bounded: not evidence that they are absent)"
        )
    return "Current corrections:\n" + "\n".join(lines)


@attrs.frozen(kw_only=True)
class PreparedContext:
    """What preparation adds to the model's context for this turn."""

    run_id: str
    query: RecallQuery
    evidence: tuple[Evidence, ...] = ()
    rendered: str = ""
    corrections: tuple[Evidence, ...] = ()
    """Current corrections shown, newest first, within the context caps."""
    notice: BoundedRecallNotice | None = None
    slots: tuple[int, ...] = ()
    """Slots the round's attempts took (base, delta)."""
    notes: tuple[str, ...] = ()
    corrections_omitted: int = 0
    """Current corrections left out by the context caps (said in :meth:`render`)."""
    bounded: tuple[Bounded, ...] = ()
    """Parts of the round the allowance or the preparation bound cut short (bounded wording)."""

    def render(self) -> str:
        """The context block: corrections first, then evidence, then what was bounded.

        Every stored string is rendered as one inert line (no newline, no control
        character), so stored text cannot open a section of its own.
        """
        parts: list[str] = []
        if self.corrections or self.corrections_omitted:
            parts.append(_corrections_block(self.corrections, self.corrections_omitted))
        if self.rendered:
            parts.append(f"Recalled memory:\n{self.rendered}")
        if self.notice is not None:
            parts.append(f"Note: {self.notice.message}")
        parts.extend(f"Note: {part.message}" for part in self.bounded)
        return "\n\n".join(parts)


@attrs.frozen(kw_only=True)
class Validation:
    """The re-check of one piece of retained deliberate evidence."""

    evidence_id: str
    status: Literal["valid", "gone", "not_retained", "bounded"]
    evidence: Evidence | None = None


_PREPARATION_WORDS = {
    WithheldReason.PREPARATION_BOUND: "query preparation ran out of its time bound",
    WithheldReason.NO_SLOT: "no slot was expected to be left for it when it was prepared",
}


def _preparation_bounded(prepared: PreparedRecall) -> tuple[Bounded, ...]:
    reason = prepared.semantic.withheld_reason
    if reason in _PREPARATION_WORDS:
        assert reason is not None
        return (Bounded.of("semantic_arm", reason.value, _PREPARATION_WORDS[reason]),)
    return ()


def _positive_seconds(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidHookArgumentTypeError(
            f"RecallHooks.{attribute.name} must be a number, got {type(value).__name__}"
        )
    if not (math.isfinite(value) and value > 0):
        raise InvalidHookArgumentError(
            f"RecallHooks.{attribute.name} must be finite and > 0, got {value!r}"
        )


@attrs.define(eq=False)
class RecallHooks:
    """The plugin's two hooks for an agent loop; see the module docstring."""

    allowance: RecallAllowance
    preparer: RecallPreparer
    retriever: Retriever
    caps: ContextCaps = attrs.field(factory=ContextCaps)
    validation_limit: int = 8
    """Re-checks of retained deliberate evidence allowed per run (kept in the ledger)."""
    max_retained: int = 64
    """Evidence items retained per run from deliberate searches (kept in the ledger)."""
    preparation_budget_s: float = attrs.field(default=2.0, kw_only=True,
                                              validator=_positive_seconds)
    """How long one hook call may spend preparing queries (planning, embedding, the People
    lookup) before the round; what is left unprepared runs without its semantic arm."""

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

    # -- preparation under its own bound ------------------------------------------------------

    async def _slots_left(self, run_id: str) -> int:
        """How many slots a round of this run could still get (an estimate: it only decides
        what is worth embedding; the ledger alone decides what is granted)."""
        if self.allowance.is_legacy:
            return sys.maxsize
        usage = await self.allowance.ledger.usage(run_id)
        policy = self.allowance.policy
        if usage.rounds >= policy.max_rounds:
            return 0
        if usage.deadline_wall is not None and self.allowance.clock.wall() >= usage.deadline_wall:
            return 0
        return max(0, policy.max_searches - usage.reserved)

    def _budget_left(self, started: float) -> float:
        return self.preparation_budget_s - (self.allowance.clock.monotonic() - started)

    async def _bounded_prepare(
        self,
        prepare: Callable[[WithheldReason | None], Awaitable[PreparedRecall]],
        withhold: WithheldReason | None,
        started: float,
    ) -> PreparedRecall:
        """Prepare one query within what is left of the preparation bound.

        The bound is read on the injected clock before each query; a real cancel scope cuts
        an embedding that hangs (its worker thread is abandoned). Either way the query is
        then prepared without its vector, and the result says the semantic arm was bounded.
        """
        left = self._budget_left(started)
        if withhold is None and left <= 0:
            withhold = WithheldReason.PREPARATION_BOUND
        if withhold is None:
            with anyio.move_on_after(left):
                return await prepare(None)
            withhold = WithheldReason.PREPARATION_BOUND
        return await prepare(withhold)

    # -- preparation ------------------------------------------------------------------------

    async def prepare(
        self, state: WorkingState, *, run_id: str, scope: str, principal: str
    ) -> PreparedContext:
        """The automatic round for this turn; see the module docstring.

        Raises :class:`~plugin.errors.InvalidHookArgumentTypeError` /
        :class:`~plugin.errors.InvalidHookArgumentError` (also ``TypeError`` / ``ValueError``)
        for a malformed state or trusted arguments, :class:`~plugin.errors.LedgerError` when
        the round cannot be committed (fail closed: nothing is searched),
        :class:`~plugin.errors.MemoryStoreError` when the store fails.
        """
        scope, principal = self._check(run_id, scope, principal)
        if not isinstance(state, WorkingState):
            raise InvalidHookArgumentTypeError(
                f"state must be a WorkingState, got {type(state).__name__}"
            )
        await self._bind(run_id, scope, principal)
        started = self.allowance.clock.monotonic()
        withhold = None if await self._slots_left(run_id) > 0 else WithheldReason.NO_SLOT

        async def plan(reason: WithheldReason | None) -> PreparedRecall:
            return await self.preparer.prepare(state, scope=scope, principal=principal,
                                               withhold=reason)

        prepared = await self._bounded_prepare(plan, withhold, started)
        shown, omitted, caps = await self._corrections(principal, scope)
        recall = await automatic_round(
            self.allowance, self.retriever, prepared, run_id=run_id, caps=caps
        )
        if recall.refusal is not None:
            log_event(_log, logging.INFO, "automatic.bounded", run_id=run_id,
                      reason=recall.refusal.reason.value)
        bounded = recall.bounded
        if recall.slots:  # the search ran without what preparation withheld
            bounded = (*_preparation_bounded(prepared), *bounded)
        return PreparedContext(
            run_id=run_id,
            query=prepared.query,
            evidence=recall.evidence,
            rendered=recall.rendered.text if recall.rendered is not None else "",
            corrections=shown,
            corrections_omitted=omitted,
            notice=(
                BoundedRecallNotice.from_refusal(recall.refusal)
                if recall.refusal is not None
                else None
            ),
            slots=recall.slots,
            notes=recall.notes,
            bounded=bounded,
        )

    async def _corrections(
        self, principal: str, scope: str
    ) -> tuple[tuple[Evidence, ...], int, ContextCaps]:
        """Current corrections within at most half the context caps, newest first, and the
        caps left for the round's evidence (corrections and evidence share one cap)."""
        found = await self.retriever.corrections(principal=principal, scope=scope)
        newest = sorted(found, key=lambda c: (-c.created_at, c.id))
        caps = self.caps
        share = ContextCaps(max_items=max(1, caps.max_items // 2),
                            max_bytes=max(1, caps.max_bytes // 2))
        kept = render(newest, share).items
        used = sum(
            len(f"- [correction {one_line(c.id, limit=128)}] {one_line(c.text)}"
                .encode("utf-8", "surrogatepass")) + 1
            for c in kept
        )
        left = attrs.evolve(
            caps,
            max_items=max(1, caps.max_items - len(kept)),
            max_bytes=max(1, caps.max_bytes - used - 1),
        )
        return tuple(kept), len(newest) - len(kept), left

    # -- tool dispatch ----------------------------------------------------------------------

    async def dispatch(
        self, calls: Sequence[ToolCall], *, run_id: str, scope: str, principal: str
    ) -> list[ToolResult]:
        """The deliberate round for one turn's search calls; one result per call, in order.

        A call that is malformed, too large or too deep, out of scope, or repeats an id
        already seen in this turn gets an ``invalid`` result and no slot; the others go on.
        """
        scope, principal = self._check(run_id, scope, principal)
        given: object = calls
        if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
            raise InvalidHookArgumentTypeError(
                f"calls must be a sequence of ToolCall, got {type(calls).__name__}"
            )
        for position, call in enumerate(calls):
            if not isinstance(call, ToolCall):
                raise InvalidHookArgumentTypeError(
                    f"calls[{position}] must be a ToolCall, got {type(call).__name__}"
                )
        await self._bind(run_id, scope, principal)
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
                results[index] = ToolResult(
                    call_id=call.call_id, status="invalid",
                    content=f"Search call rejected: {one_line(str(exc), limit=200)}. "
                            f"No search was run.",
                )
                continue
            seen.add(checked.call_id)
            valid.append((index, checked))
        if valid:
            await self._run_calls(valid, results, run_id, scope, principal)
        assert all(result is not None for result in results)
        return [result for result in results if result is not None]

    async def _prepare_calls(
        self, valid: list[tuple[int, SearchCall]], run_id: str, scope: str, principal: str
    ) -> tuple[dict[int, PreparedRecall], int]:
        """Form every call's query before the round (the permit's time is for searching):
        embed only the calls that can still get a slot, within the preparation bound, and
        count the calls that name People (each gets a slot for its nested read)."""
        started = self.allowance.clock.monotonic()
        left = await self._slots_left(run_id)
        prepared: dict[int, PreparedRecall] = {}
        naming = 0
        for position, (index, call) in enumerate(valid):

            async def prepare_one(
                reason: WithheldReason | None, text: str = call.query
            ) -> PreparedRecall:
                return await self.preparer.prepare_search(
                    text, scope=scope, principal=principal, withhold=reason
                )

            withhold = None if position < left else WithheldReason.NO_SLOT
            prepared[index] = await self._bounded_prepare(prepare_one, withhold, started)
            if position < left and self._budget_left(started) > 0:
                with anyio.move_on_after(self._budget_left(started)):
                    try:
                        if await self.retriever.named_people(prepared[index]):
                            naming += 1
                    except MemoryStoreError:
                        pass  # the search itself reports the store's failure
        return prepared, naming

    async def _run_calls(
        self,
        valid: list[tuple[int, SearchCall]],
        results: list[ToolResult | None],
        run_id: str,
        scope: str,
        principal: str,
    ) -> None:
        prepared, naming = await self._prepare_calls(valid, run_id, scope, principal)
        retained: list[str] = []

        def refused(call: SearchCall, refusal: BudgetRefusal) -> ToolResult:
            return ToolResult(call_id=call.call_id, status="refused", content=refusal.message,
                              refusal=refusal)

        try:
            async with self.allowance.round(
                run_id, RoundKind.DELIBERATE, slots=min(len(valid) + naming, MAX_COUNT)
            ) as permit:
                # Calls take their slots one after another, in order, and every nested read
                # waits until all calls have theirs: a nested read never takes a call's slot,
                # and the calls that get a slot are the same on every event loop.
                turns = [anyio.Event() for _ in valid]
                placed = turns[-1]

                async def search_one(position: int, index: int, call: SearchCall) -> None:
                    if position:
                        await turns[position - 1].wait()
                    try:
                        attempted = await search_attempt(
                            permit, self.retriever, prepared[index],
                            kind=AttemptKind.DELIBERATE, caps=self.caps, nested_beliefs=True,
                            on_slot=turns[position].set, nested_after=placed,
                        )
                    except RecallBudgetExceeded as exc:
                        results[index] = refused(call, exc.refusal)
                    except MemoryStoreError as exc:
                        log_event(_log, logging.WARNING, "search.failed", run_id=run_id,
                                  call_id=call.call_id, error=repr(exc))
                        results[index] = ToolResult(
                            call_id=call.call_id, status="failed",
                            content=f"Memory search failed: {one_line(str(exc), limit=200)}",
                        )
                    else:
                        rendered = render(attempted.found.evidence, self.caps)
                        bounded = (*_preparation_bounded(prepared[index]), *attempted.bounded)
                        retained.extend(item.id for item in rendered.items)
                        results[index] = ToolResult(
                            call_id=call.call_id, status="ok",
                            content=_content(rendered.text, bounded), slot=attempted.slot,
                            evidence=rendered.items, notes=attempted.found.notes,
                            bounded=bounded, omitted=rendered.omitted,
                        )
                    finally:
                        turns[position].set()

                async with anyio.create_task_group() as tg:
                    for position, (index, call) in enumerate(valid):
                        tg.start_soon(search_one, position, index, call)
        except RecallBudgetExceeded as exc:
            log_event(_log, logging.INFO, "deliberate.refused", run_id=run_id,
                      calls=len(valid), reason=exc.refusal.reason.value)
            for index, call in valid:
                if results[index] is None:
                    results[index] = refused(call, exc.refusal)
        if retained:
            await self.allowance.ledger.retain(run_id, retained, limit=self.max_retained)

    # -- retained evidence -----------------------------------------------------------------

    async def validate_retained(
        self, evidence_ids: Sequence[str], *, run_id: str, scope: str, principal: str
    ) -> list[Validation]:
        """Re-check evidence this run retained from deliberate searches.

        This is not a search and takes no slot, so it stays available when the allowance is
        spent; it has its own bound (``validation_limit`` ids per run), kept with the run in
        the ledger, so a resume or another hooks object cannot reset it. An id the run never
        retained is ``not_retained``; one no longer visible is ``gone``.
        """
        scope, principal = self._check(run_id, scope, principal)
        given: object = evidence_ids
        if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
            raise InvalidHookArgumentTypeError(
                f"evidence_ids must be a sequence of str, got {type(evidence_ids).__name__}"
            )
        if not all(isinstance(i, str) for i in evidence_ids):
            raise InvalidHookArgumentTypeError("evidence_ids must all be str")
        await self._bind(run_id, scope, principal)
        ids = list(dict.fromkeys(evidence_ids))
        verdicts = await self.allowance.ledger.take_validations(
            run_id, ids, limit=self.validation_limit
        )
        to_read = [i for i in ids if verdicts.get(i) is Validity.GRANTED]
        found: dict[str, Evidence] = {}
        if to_read:
            found = {
                item.id: item
                for item in await self.retriever.revalidate(
                    to_read, principal=principal, scope=scope
                )
            }
        answers: list[Validation] = []
        for evidence_id in ids:
            verdict = verdicts.get(evidence_id, Validity.NOT_RETAINED)
            if verdict is Validity.GRANTED:
                item = found.get(evidence_id)
                answers.append(Validation(evidence_id=evidence_id,
                                          status="valid" if item else "gone", evidence=item))
            elif verdict is Validity.BOUNDED:
                answers.append(Validation(evidence_id=evidence_id, status="bounded"))
            else:
                answers.append(Validation(evidence_id=evidence_id, status="not_retained"))
        return answers
