"""One run's deliberate rounds, batched per model response, and its automatic round per invocation.

Frameworks call each tool separately (pydantic-ai, the Agents SDK, LangChain's ``Send``). One
``dispatch([call])`` per tool call would open one round per call and lose calls to the
``rounds`` limit while slots are still unreserved. An adapter therefore hands the *whole*
batch of a model response to :meth:`RunRecall.dispatch_batch` from the one hook that sees it
before any tool runs; each tool call then returns its stored result
(:meth:`RunRecall.result`). A batch seen again (a resume, a re-run hook) never reserves twice:
calls that already have a result are skipped.

A call's identity is its id AND its arguments: a stored result answers only the call with the
same id and the same arguments (a genuine replay). A reused id with other arguments is a new
call, which the allowance decides like any other; it never gets another call's evidence.

A run's recall runs on the hooks' event loop, whichever loop the framework runs the agent on
(:mod:`runtime_hooks.adapters.hooks_loop`). The automatic round belongs to the invocation
(:mod:`runtime_hooks.adapters.invocation`).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Literal, cast

import anyio
import attrs

from plugin.control import BudgetRefusal, RefusalReason
from plugin.control.ledger import CallRecord, Usage
from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError, RunIdentityError
from plugin.memory.state import WorkingState
from runtime_hooks.calls import canonical_arguments
from runtime_hooks.hooks import (
    PreparedContext,
    RecallHooks,
    ToolCall,
    ToolResult,
)
from runtime_hooks.replay import replay_call
from runtime_hooks.results import IN_FLIGHT

from .hooks_loop import on_hooks_loop

_Status = Literal["ok", "refused", "invalid", "failed"]

AutomaticMode = Literal["per_invocation", "per_request", "off"]
"""When the automatic round runs: once per invocation (the default), before every model
request (the older behaviour, ``automatic="per_request"``), or never (``automatic=False``)."""

def automatic_mode(value: object) -> AutomaticMode:
    """An adapter's ``automatic=`` argument as a mode.

    ``True`` or ``"per_invocation"``: once per invocation; ``"per_request"``: before every
    model request; ``False``: never. Anything else raises
    :class:`~plugin.errors.InvalidArgumentTypeError` (a wrong type) or
    :class:`~plugin.errors.InvalidArgumentError` (an unknown word).
    """
    if value is True or value == "per_invocation":
        return "per_invocation"
    if value is False:
        return "off"
    if value == "per_request":
        return "per_request"
    if not isinstance(value, (bool, str)):
        raise InvalidArgumentTypeError(
            f"automatic must be True, False, 'per_invocation' or 'per_request', "
            f"got {type(value).__name__}"
        )
    raise InvalidArgumentError(
        f"automatic must be True, False, 'per_invocation' or 'per_request', got {value!r}"
    )


CallKey = tuple[str, str]


def call_key(call_id: str, arguments: Mapping[str, object] | str | None) -> CallKey:
    """A tool call's identity: its id and its (canonical) arguments."""
    return call_id, canonical_arguments(arguments)


@attrs.define(eq=False)
class RunRecall:
    """The recall of one agent run: trusted identity, and the results of its search calls.

    ``run_id``, ``scope`` and ``principal`` come from the host (the framework's deps or
    context), never from the model or from task text. ``bound`` says whether the ledger has
    accepted that identity for the run through this object (a round, a search or a replay
    answered); until then it is only what the host asked for. ``on_bound`` is told once, when
    it becomes bound. Its coroutines run on the hooks' event loop, whichever loop awaits them
    (:mod:`runtime_hooks.adapters.hooks_loop`).
    """

    hooks: RecallHooks
    run_id: str
    scope: str
    principal: str
    _results: dict[CallKey, ToolResult] = attrs.field(factory=dict, init=False, repr=False)
    _latest: dict[str, ToolResult] = attrs.field(factory=dict, init=False, repr=False)
    _busy: dict[CallKey, anyio.Event] = attrs.field(factory=dict, init=False, repr=False)
    on_bound: Callable[[RunRecall], None] | None = attrs.field(default=None, kw_only=True,
                                                                repr=False)
    _bound: bool = attrs.field(default=False, init=False, repr=False)

    @property
    def bound(self) -> bool:
        """Whether the ledger accepted this run's identity through this object."""
        return self._bound

    def _accepted(self) -> None:
        if not self._bound:
            self._bound = True
            if self.on_bound is not None:
                self.on_bound(self)

    @contextlib.asynccontextmanager
    async def _holding(self, keys: Iterable[CallKey]) -> AsyncIterator[None]:
        """Hold these calls for the block, once no other block holds any of them.

        Only blocks that share a call wait for each other: a batch seen twice then reserves
        once, while a turn's batch is never held up by another turn's batch of other calls
        (one a framework left running after its consumer was cancelled, say)."""
        wanted = set(keys)
        while (busy := next((self._busy[k] for k in wanted if k in self._busy), None)) \
                is not None:
            await busy.wait()
        done = anyio.Event()
        for key in wanted:
            self._busy[key] = done
        try:
            yield
        finally:
            for key in wanted:
                del self._busy[key]
            done.set()

    @on_hooks_loop
    async def prepare(self, state: WorkingState) -> PreparedContext:
        """The automatic round, now (an adapter calls it through its :class:`Invocation`)."""
        context = await self.hooks.prepare(
            state, run_id=self.run_id, scope=self.scope, principal=self.principal
        )
        self._accepted()  # a round is only prepared for the identity the ledger bound
        return context

    @on_hooks_loop
    async def dispatch_batch(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One deliberate round for the calls of one model response that have no result yet.

        Returns the results of every call in ``calls`` (stored ones included), in order.
        Batches that share a call are serialized, so a batch seen twice reserves once; batches
        of other calls run side by side, each its own round. A stored result answers only a
        call with the same id and the same arguments.
        """
        keys = [call_key(call.call_id, call.arguments) for call in calls]
        answered: dict[CallKey, ToolResult] = {}
        async with self._holding(keys):
            pending: dict[CallKey, ToolCall] = {}
            for key, call in zip(keys, calls, strict=True):
                if key not in self._results:
                    pending.setdefault(key, call)
            if pending:
                results = await self.hooks.dispatch(
                    list(pending.values()), run_id=self.run_id, scope=self.scope,
                    principal=self.principal,
                )
                # An invalid call binds nothing; any other answer came after the ledger
                # accepted the identity.
                if any(result.status != "invalid" for result in results):
                    self._accepted()
                for key, result in zip(pending, results, strict=True):
                    self._latest[key[0]] = result
                    if result.failure != IN_FLIGHT:  # no outcome yet: asked again, it may have
                        self._results[key] = result
                answered = dict(zip(pending, results, strict=True))
        return [self._results.get(key) or answered[key] for key in keys]

    @on_hooks_loop
    async def recorded(
        self, call_id: str, arguments: Mapping[str, object] | str
    ) -> ToolResult | None:
        """The stored result of this call, or the outcome the ledger recorded for it in any
        process (replayed: never searched again); None for a call never dispatched."""
        key = call_key(call_id, arguments)
        async with self._holding([key]):
            if key not in self._results:
                (result,) = await self.hooks.replay(
                    [ToolCall(call_id=call_id, arguments=arguments)], run_id=self.run_id,
                    scope=self.scope, principal=self.principal)
                if result is None:
                    return None
                self._accepted()  # the ledger answered from this identity's record
                if result.failure == IN_FLIGHT:
                    return result  # a claim with no outcome yet: asked again, it may have one
                self._results[key] = result
                self._latest[call_id] = result
            return self._results[key]

    @on_hooks_loop
    async def usage(self) -> Usage:
        """The run's totals from the ledger."""
        return await self.hooks.allowance.usage(self.run_id)

    def result(
        self, call_id: str, arguments: Mapping[str, object] | str | None = None
    ) -> ToolResult | None:
        """The stored result of the call with this id and these ``arguments``, or None.

        Without ``arguments``: the latest result stored under ``call_id`` (for inspection; a
        tool answering the model always passes the call's arguments).
        """
        if arguments is None:
            return self._latest.get(call_id)
        return self._results.get(call_key(call_id, arguments))

    def answered(self, call_id: str, arguments: Mapping[str, object] | str | None = None) -> bool:
        return self.result(call_id, arguments) is not None

    @staticmethod
    def record(call: ToolCall, result: ToolResult) -> dict[str, object]:
        """A call's result as plain data a host can keep durably (its checkpoint)."""
        return {"call_id": call.call_id, "arguments": call_key(call.call_id, call.arguments)[1],
                **result.as_dict()}

    @on_hooks_loop
    async def replay(self, records: Sequence[Mapping[str, object]]) -> None:
        """Store the results of a batch that ran before a restart, from the records
        (:meth:`record`) the host kept, without dispatching anything.

        Each call is answered from the ledger's record of it when there is one (as any replay
        is); the host's record answers the rest. A search that ran is never run again nor
        reported as refused: its evidence is re-read
        under the run's validation bound (:meth:`RecallHooks.validate_retained`, kept in the
        ledger); what is gone is left out, what the bound no longer lets be re-checked is said
        in the bounded wording. A call that was refused or invalid then keeps that answer.
        Records already stored in this process are left alone.
        """
        async with self._holding((str(r["call_id"]), str(r["arguments"])) for r in records):
            for record in records:
                key = (str(record["call_id"]), str(record["arguments"]))
                if key in self._results:
                    continue
                result = await self._replayed(record)
                self._results[key] = result
                self._latest[key[0]] = result

    def _refusal(self, given: object) -> BudgetRefusal | None:
        """The typed refusal a record kept (:meth:`BudgetRefusal.as_tool_result`), rebuilt."""
        if not isinstance(given, Mapping):
            return None
        reason, reserved, executed = (given.get("reason"), given.get("reserved"),
                                      given.get("executed"))
        if not (isinstance(reason, str) and isinstance(reserved, int)
                and isinstance(executed, int)):
            return None
        try:
            kind = RefusalReason(reason)
        except ValueError:
            return None
        return BudgetRefusal(reason=kind, run_id=self.run_id, reserved=reserved,
                             executed=executed)

    async def _replayed(self, record: Mapping[str, object]) -> ToolResult:
        call_id, status, content = (str(record["call_id"]), str(record["status"]),
                                    str(record["content"]))
        if status in ("ok", "refused", "failed"):
            # The ledger's record of the call is the source of truth (the one replay path);
            # the host's checkpoint answers only what the ledger never recorded.
            (answer,) = await self.hooks.replay(
                [ToolCall(call_id=call_id, arguments=str(record["arguments"]))],
                run_id=self.run_id, scope=self.scope, principal=self.principal)
            if answer is not None:
                self._accepted()
                return answer
        found = record.get("evidence_ids")
        ids = [str(i) for i in found] if isinstance(found, list) else []
        if status != "ok" or not ids:
            kept = status if status in ("ok", "refused", "invalid", "failed") else "failed"
            return ToolResult(call_id=call_id, status=cast(_Status, kept), content=content,
                              refusal=self._refusal(record.get("refusal")))
        ran = CallRecord(run_id=self.run_id, call_id=call_id, digest="", status="ok",
                         evidence_ids=tuple(ids))
        result = await replay_call(self.hooks, ran, scope=self.scope, principal=self.principal)
        self._accepted()  # its evidence was re-checked for this identity
        return result


@attrs.define(eq=False)
class RunRecalls:
    """One :class:`RunRecall` per host run id, so a run's stored results outlive one hook call.

    A run continued, resumed or re-run in this process finds the answers its batches stored.
    The most recent ``max_runs`` runs are kept (oldest forgotten first).

    The ledger decides whose run it is: it binds every run to its first principal and scope
    durably, and refuses any other (:class:`~plugin.errors.RunIdentityError`), in every
    process and after this registry forgot the run. The registry only caches that: a run id
    asked for again with another scope or principal raises ``mismatch`` here once the ledger
    has accepted the kept identity (:attr:`RunRecall.bound`). An entry the ledger never
    accepted (its first request was refused, or named a blank scope) is replaced, so one bad
    first request cannot lock the run's owner out; and a run the ledger accepts takes the
    place of such an entry again (two first requests at once).
    """

    hooks: RecallHooks
    mismatch: Callable[[str], Exception] = RunIdentityError
    max_runs: int = 1024
    _runs: collections.OrderedDict[str, RunRecall] = attrs.field(
        factory=collections.OrderedDict, init=False, repr=False
    )

    def get(self, run_id: str, *, scope: str, principal: str) -> RunRecall:
        """The run's recall; created on first use, checked against its bound identity after."""
        run = self._runs.get(run_id)
        if run is not None and (run.scope, run.principal) != (scope, principal):
            if run.bound:
                raise self.mismatch(
                    f"run {run_id!r} was opened for another scope or principal")
            run = None  # never accepted by the ledger: the ledger judges the new identity
        if run is None:
            run = self._runs[run_id] = RunRecall(self.hooks, run_id, scope, principal,
                                                 on_bound=self._keep)
            self._runs.move_to_end(run_id)
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(run_id)
        return run

    def _keep(self, run: RunRecall) -> None:
        """``run`` is bound: it replaces an entry for its id that the ledger never bound."""
        current = self._runs.get(run.run_id)
        if current is not None and current is not run and not current.bound:
            self._runs[run.run_id] = run
