"""RecallHooks: recall in an agent loop's two phases, under the allowance.

* **Preparation** (:meth:`RecallHooks.prepare`, before the model is called): the automatic
  round. The query is planned once; the round reserves ``automatic_slots``; the base search
  runs, and a delta (a People-to-belief read) only when the base discovered people whose
  beliefs it did not read. The model gets rendered evidence, or a
  :class:`~plugin.BoundedRecallNotice` when the round is refused or runs out. Current
  correction notices are always included.
* **Tool dispatch** (:meth:`RecallHooks.dispatch`, the model's search calls of one turn): the
  deliberate round. Each call is validated (well-formed, in scope); the round reserves one slot
  per valid call; the calls run in parallel, each on a distinct slot; a call without a slot,
  and every call once the allowance is spent, gets a typed :class:`~plugin.BudgetRefusal` as
  its result.

Bind the run at the run boundary with :meth:`RecallHooks.bind_run` (frameworks run their
before-model hooks in copied contexts). The hooks reach the memory layer only through its
protocols (:class:`~plugin.RecallPreparer`, :class:`~plugin.memory.pipeline.Retriever`); the
bootstrap picks the concrete classes.
"""

from __future__ import annotations

import collections
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
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
    bind_permits,
    validate_run_id,
)
from plugin.control.logs import log_event
from plugin.errors import MemoryStoreError, RecallboundError
from plugin.memory.pipeline import ContextCaps, Retriever, query_terms
from plugin.memory.planning import RecallQuery
from plugin.memory.preparation import PreparedRecall, RecallPreparer
from plugin.memory.recall import automatic_round
from plugin.memory.state import WorkingState
from plugin.memory.store import Evidence

_log = logging.getLogger("recallbound.hooks")

MAX_QUERY_BYTES = 4096
"""The longest search-call query accepted (UTF-8 bytes); longer calls are invalid."""


class InvalidSearchCallError(RecallboundError, ValueError):
    """A model's search call is malformed or out of scope (it gets no slot)."""


def _trusted(name: str, value: object) -> str:
    """A trusted runtime argument (scope, principal): never taken from the model or the text."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str from the trusted runtime, got {type(value)!r}")
    if not value.strip():
        raise ValueError(f"{name} must not be empty")
    return value


@attrs.frozen(kw_only=True)
class ToolCall:
    """A tool call as the model emitted it: an id and its raw arguments."""

    call_id: str
    arguments: Mapping[str, object] | str
    """The arguments as a mapping, or as the JSON text many model APIs deliver."""


@attrs.frozen(kw_only=True)
class SearchCall:
    """A validated search call."""

    call_id: str
    query: str

    @classmethod
    def validate(cls, call: ToolCall, *, scope: str) -> SearchCall:
        """Check a raw call: a ``query`` string with searchable words, an optional ``scope``
        equal to the run's trusted scope, nothing else. Raises :class:`InvalidSearchCallError`.
        """
        args: object = call.arguments
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise InvalidSearchCallError("arguments are not valid JSON") from None
        if not isinstance(args, Mapping):
            raise InvalidSearchCallError("arguments must be an object with a 'query'")
        unknown = sorted(str(key) for key in args if key not in ("query", "scope"))
        if unknown:
            raise InvalidSearchCallError(f"unknown argument(s): {', '.join(unknown)}")
        query = args.get("query")
        if not isinstance(query, str):
            raise InvalidSearchCallError("'query' must be a string")
        try:
            size = len(query.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidSearchCallError("'query' is not valid Unicode text") from None
        if size > MAX_QUERY_BYTES:
            raise InvalidSearchCallError(f"'query' is longer than {MAX_QUERY_BYTES} bytes")
        if not query_terms(query):
            raise InvalidSearchCallError("'query' has no searchable words")
        asked = args.get("scope")
        if asked is not None and asked != scope:
            raise InvalidSearchCallError("'scope' is outside this run's scope")
        return cls(call_id=call.call_id, query=query)


Status = Literal["ok", "refused", "invalid", "failed"]


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

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready form for a tool-result message."""
        result: dict[str, object] = {"status": self.status, "content": self.content}
        if self.refusal is not None:
            result["refusal"] = self.refusal.as_tool_result()
        if self.evidence:
            result["evidence_ids"] = [item.id for item in self.evidence]
        return result


@attrs.frozen(kw_only=True)
class PreparedContext:
    """What preparation adds to the model's context for this turn."""

    run_id: str
    query: RecallQuery
    evidence: tuple[Evidence, ...] = ()
    rendered: str = ""
    corrections: tuple[Evidence, ...] = ()
    notice: BoundedRecallNotice | None = None
    slots: tuple[int, ...] = ()
    """Slots the round's attempts took (base, delta)."""
    notes: tuple[str, ...] = ()

    def render(self) -> str:
        """The context block: corrections first, then evidence, then the bounded notice."""
        parts: list[str] = []
        if self.corrections:
            lines = "\n".join(f"- [correction {c.id}] {c.text}" for c in self.corrections)
            parts.append(f"Current corrections:\n{lines}")
        if self.rendered:
            parts.append(f"Recalled memory:\n{self.rendered}")
        if self.notice is not None:
            parts.append(f"Note: {self.notice.message}")
        return "\n\n".join(parts)


@attrs.frozen(kw_only=True)
class Validation:
    """The re-check of one piece of retained deliberate evidence."""

    evidence_id: str
    status: Literal["valid", "gone", "not_retained", "bounded"]
    evidence: Evidence | None = None


@attrs.define
class _RunMemory:
    retained: dict[str, Evidence] = attrs.Factory(dict)
    validations: int = 0


@attrs.define(eq=False)
class RecallHooks:
    """The plugin's two hooks for an agent loop; see the module docstring."""

    allowance: RecallAllowance
    preparer: RecallPreparer
    retriever: Retriever
    caps: ContextCaps = attrs.field(factory=ContextCaps)
    validation_limit: int = 8
    """Re-checks of retained deliberate evidence allowed per run (a bound of its own)."""
    max_retained: int = 64
    """Evidence items retained per run from deliberate searches."""
    _runs: collections.OrderedDict[str, _RunMemory] = attrs.field(
        factory=collections.OrderedDict, init=False, repr=False
    )
    max_runs: int = attrs.field(default=4096, kw_only=True)

    @property
    def legacy(self) -> bool:
        """Whether these hooks run the explicit legacy (unenforced) path."""
        return self.allowance.is_legacy

    @contextmanager
    def bind_run(self) -> Iterator[PermitHolder]:
        """Bind the run-scoped permit holder; use it around the framework's run call."""
        with bind_permits() as holder:
            yield holder

    def _memory(self, run_id: str) -> _RunMemory:
        memory = self._runs.get(run_id)
        if memory is None:
            memory = self._runs[run_id] = _RunMemory()
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(run_id)
        return memory

    # -- preparation ------------------------------------------------------------------------

    async def prepare(
        self, state: WorkingState, *, run_id: str, scope: str, principal: str
    ) -> PreparedContext:
        """The automatic round for this turn; see the module docstring.

        Raises ``TypeError``/``ValueError`` for a malformed state or trusted arguments,
        :class:`~plugin.errors.LedgerError` when the round cannot be committed (fail closed:
        nothing is searched), :class:`~plugin.errors.MemoryStoreError` when the store fails.
        """
        validate_run_id(run_id)
        scope, principal = _trusted("scope", scope), _trusted("principal", principal)
        if not isinstance(state, WorkingState):
            raise TypeError(f"state must be a WorkingState, got {type(state).__name__}")
        prepared = await self.preparer.prepare(state, scope=scope, principal=principal)
        corrections = await self.retriever.corrections(principal=principal, scope=scope)
        recall = await automatic_round(
            self.allowance, self.retriever, prepared, run_id=run_id, caps=self.caps
        )
        if recall.refusal is not None:
            log_event(_log, logging.INFO, "automatic.bounded", run_id=run_id,
                      reason=recall.refusal.reason.value)
        return PreparedContext(
            run_id=run_id,
            query=prepared.query,
            evidence=recall.evidence,
            rendered=recall.rendered.text if recall.rendered is not None else "",
            corrections=corrections,
            notice=(
                BoundedRecallNotice.from_refusal(recall.refusal)
                if recall.refusal is not None
                else None
            ),
            slots=recall.slots,
            notes=recall.notes,
        )

    # -- tool dispatch ----------------------------------------------------------------------

    async def dispatch(
        self, calls: Sequence[ToolCall], *, run_id: str, scope: str, principal: str
    ) -> list[ToolResult]:
        """The deliberate round for one turn's search calls; one result per call, in order."""
        validate_run_id(run_id)
        scope, principal = _trusted("scope", scope), _trusted("principal", principal)
        results: list[ToolResult | None] = [None] * len(calls)
        valid: list[tuple[int, SearchCall]] = []
        for index, call in enumerate(calls):
            try:
                valid.append((index, SearchCall.validate(call, scope=scope)))
            except InvalidSearchCallError as exc:
                log_event(_log, logging.INFO, "search_call.invalid", run_id=run_id,
                          call_id=call.call_id, error=str(exc))
                results[index] = ToolResult(
                    call_id=call.call_id, status="invalid",
                    content=f"Search call rejected: {exc}. No search was run.",
                )
        if valid:
            await self._run_calls(valid, results, run_id, scope, principal)
        assert all(result is not None for result in results)
        return [result for result in results if result is not None]

    async def _run_calls(
        self,
        valid: list[tuple[int, SearchCall]],
        results: list[ToolResult | None],
        run_id: str,
        scope: str,
        principal: str,
    ) -> None:
        memory = self._memory(run_id)
        # Form every call's query before the round: the permit's time is for searching, and
        # each search then takes its slot at once, before any call's nested read can.
        prepared: dict[int, PreparedRecall] = {}

        async def prepare_one(index: int, call: SearchCall) -> None:
            prepared[index] = await self.preparer.prepare_search(
                call.query, scope=scope, principal=principal
            )

        async with anyio.create_task_group() as tg:
            for index, call in valid:
                tg.start_soon(prepare_one, index, call)

        def refused(call: SearchCall, refusal: BudgetRefusal) -> ToolResult:
            return ToolResult(call_id=call.call_id, status="refused", content=refusal.message,
                              refusal=refusal)

        try:
            async with self.allowance.round(
                run_id, RoundKind.DELIBERATE, slots=len(valid)
            ) as permit:

                async def search_one(index: int, call: SearchCall) -> None:
                    try:
                        outcome = await self.retriever.search(
                            prepared[index], permit, kind=AttemptKind.DELIBERATE,
                            caps=self.caps, nested_beliefs=True,
                        )
                    except RecallBudgetExceeded as exc:
                        results[index] = refused(call, exc.refusal)
                    except MemoryStoreError as exc:
                        log_event(_log, logging.WARNING, "search.failed", run_id=run_id,
                                  call_id=call.call_id, error=repr(exc))
                        results[index] = ToolResult(
                            call_id=call.call_id, status="failed",
                            content=f"Memory search failed: {exc}",
                        )
                    else:
                        for item in outcome.evidence:
                            if len(memory.retained) < self.max_retained:
                                memory.retained.setdefault(item.id, item)
                        results[index] = ToolResult(
                            call_id=call.call_id, status="ok",
                            content=outcome.rendered.text or "No matching memory was found.",
                            slot=outcome.slot, evidence=outcome.evidence, notes=outcome.notes,
                        )

                async with anyio.create_task_group() as tg:
                    for index, call in valid:
                        tg.start_soon(search_one, index, call)
        except RecallBudgetExceeded as exc:
            log_event(_log, logging.INFO, "deliberate.refused", run_id=run_id,
                      calls=len(valid), reason=exc.refusal.reason.value)
            for index, call in valid:
                results[index] = refused(call, exc.refusal)

    # -- retained evidence -----------------------------------------------------------------

    async def validate_retained(
        self, evidence_ids: Sequence[str], *, run_id: str, scope: str, principal: str
    ) -> list[Validation]:
        """Re-check evidence this run retained from deliberate searches.

        This is not a search and takes no slot, so it stays available when the allowance is
        spent; it has its own bound (``validation_limit`` ids per run). An id the run never
        retained is ``not_retained``; one no longer visible is ``gone``.
        """
        validate_run_id(run_id)
        scope, principal = _trusted("scope", scope), _trusted("principal", principal)
        memory = self._memory(run_id)
        answers: dict[str, Validation] = {}
        to_read: list[str] = []
        for evidence_id in evidence_ids:
            if evidence_id in answers or evidence_id in to_read:
                continue
            if evidence_id not in memory.retained:
                answers[evidence_id] = Validation(evidence_id=evidence_id,
                                                  status="not_retained")
            elif memory.validations >= self.validation_limit:
                answers[evidence_id] = Validation(evidence_id=evidence_id, status="bounded")
            else:
                memory.validations += 1
                to_read.append(evidence_id)
        if to_read:
            found = {
                item.id: item
                for item in await self.retriever.revalidate(
                    to_read, principal=principal, scope=scope
                )
            }
            for evidence_id in to_read:
                item = found.get(evidence_id)
                answers[evidence_id] = Validation(
                    evidence_id=evidence_id, status="valid" if item else "gone", evidence=item
                )
        return [answers[i] for i in dict.fromkeys(evidence_ids)]

