"""The MCP server: ``search_memory`` and ``recall_context`` over the hooks.

:class:`RecallServer` wraps :class:`~runtime_hooks.hooks.RecallHooks` in the SDK's low-level
``Server`` (it gives each handler the request's ``_meta`` and runs on asyncio and trio). Each
tool call is resolved to a trusted caller (:mod:`.trust`) and checked (its arguments, its run
and call ids: a call the server will not run writes nothing durable), then given a run
(:mod:`.identity`); a run the server has not used yet is admitted once (bound to its caller
and counted against the caller's runs per hour, in the ledger) before any of its calls joins a
batch, so a burst of a new run's calls reaches the batch window together. Then the call goes
through the hooks: a search joins its run's batch (:mod:`.window`); ``recall_context`` runs
the automatic round. Whatever goes wrong in one call is that call's typed error result
(:mod:`.tools`); the server keeps serving.

The SDK's lifespan is entered once per connection on stdio and in process (one client
session) and once per application over HTTP; each entry gets its own batch window and, on
stdio and in process, the session's current run. Every transport's tool calls reach one
method, :meth:`RecallServer.call_tool`: through the SDK's request path, or on stdio through
the short path of :mod:`.lane`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, nullcontext
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import anyio
import attrs
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.runner import serve_dual_era_loop
from mcp.shared.message import SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from plugin.control.ledger import RunOpening
from plugin.control.logs import log_event
from plugin.control.refusal import BudgetRefusal, RefusalReason
from plugin.memory.store import MemoryStore
from plugin.memory.store.values import MAX_MEMORY_TEXT_BYTES
from runtime_hooks.hooks import InvalidSearchCallError, RecallHooks, SearchCall, ToolCall
from runtime_hooks.results import rejected_call

from . import tools
from .errors import McpAuthError
from .identity import CELL, CurrentRun, client_call, client_run_id, ledger_run_id
from .lane import FastLane
from .session import Session, ToolRequest
from .trust import Caller, caller_of_token
from .window import DEFAULT_WINDOW_S, BatchWindow, check_window
from .wire import LineWriter, stdio_streams

_log = logging.getLogger("recallbound.mcp")

SERVER_NAME = "recallbound"

DEFAULT_MAX_RUNS_PER_HOUR = 60
"""How many runs a (principal, scope) may open in an hour unless configured otherwise."""
DEFAULT_MAX_MEMORY_BYTES = 8 * 1024
"""The longest memory text ``remember`` stores (UTF-8 bytes) unless configured otherwise."""

K = TypeVar("K")
V = TypeVar("V")


MAX_TRACKED = 10_000
"""How many runs and callers the server remembers it has admitted (least recently used go)."""


class _Recent(Generic[K, V]):
    """A bounded map that forgets its least recently used entries."""

    def __init__(self, size: int = MAX_TRACKED) -> None:
        self._items: OrderedDict[K, V] = OrderedDict()
        self._size = size

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> V:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)
        return value


@runtime_checkable
class MemoryWriter(Protocol):
    """What ``remember`` and ``forget`` write to (:class:`~plugin.memory.MemoryStore` is one)."""

    async def remember(
        self, text: str, *, principal: str, scope: str, id: str | None = None
    ) -> str: ...

    async def forget(self, id: str, *, principal: str, scope: str) -> bool: ...


@attrs.define(eq=False)
class _Admission:
    """One run's first use in this server, shared by the calls that arrive during it."""

    done: anyio.Event = attrs.field(factory=anyio.Event)
    opened: bool = False
    error: Exception | None = None


def _check_positive(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value}")


@attrs.define(eq=False)
class RecallServer:
    """The recallbound MCP server over ``hooks``.

    ``caller`` is the trusted identity of every call on stdio and in process; over HTTP the
    identity comes from each request's bearer token instead (and ``caller`` is ignored).
    ``window_s`` is the batch window (see :mod:`.window`); ``max_runs_per_hour`` the runs a
    (principal, scope) may open in an hour, counted in the ledger.
    """

    hooks: RecallHooks
    caller: Caller | None = None
    window_s: float = attrs.field(default=DEFAULT_WINDOW_S, converter=check_window)
    max_runs_per_hour: int = attrs.field(default=DEFAULT_MAX_RUNS_PER_HOUR,
                                         validator=_check_positive)
    store: MemoryWriter | None = attrs.field(default=None)
    """Where ``remember`` and ``forget`` write (default: the hooks' reference store, if any;
    without a store the server offers no write tools)."""
    max_memory_bytes: int = attrs.field(default=DEFAULT_MAX_MEMORY_BYTES,
                                        validator=_check_positive)
    server: Server[Session] = attrs.field(init=False)
    _admitted: _Recent[str, bool] = attrs.field(factory=_Recent, init=False, repr=False)
    _admitting: dict[str, _Admission] = attrs.field(factory=dict, init=False, repr=False)
    _current_runs: _Recent[tuple[str, ...], CurrentRun] = attrs.field(
        factory=_Recent, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.store is None:  # the reference store behind the hooks' retriever, if any
            found = getattr(self.hooks.retriever, "store", None)
            if isinstance(found, MemoryWriter):
                self.store = found
        if isinstance(self.store, MemoryStore) and self.max_memory_bytes > MAX_MEMORY_TEXT_BYTES:
            raise ValueError(f"max_memory_bytes must be at most {MAX_MEMORY_TEXT_BYTES} (the "
                             f"longest text the memory store holds), got {self.max_memory_bytes}")
        self.server = Server(
            SERVER_NAME,
            instructions=tools.INSTRUCTIONS,
            lifespan=self._lifespan,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    async def serve_stdio(self) -> None:
        """Serve one client over this process's standard input and output until it leaves.

        Every line gets an answer (:mod:`.wire`); on a connection that opens in the 2026-07-28
        era, tool calls take the short path of :mod:`.lane`.
        """
        lane = FastLane(self)
        async with stdio_streams(intercept=lane.take) as (read, write):
            await self.serve(read, write, lane=lane)

    async def serve(self, read: MemoryObjectReceiveStream[SessionMessage | Exception],
                    write: LineWriter, *,
                    lane: FastLane | None = None) -> None:
        """Serve one connection over ``read`` and ``write`` until ``read`` ends; ``lane``
        answers the tool calls it takes from the reader (see :mod:`.lane`)."""
        async with self.server.lifespan(self.server) as session, \
                (lane.running(session, write) if lane is not None else nullcontext()):
            await serve_dual_era_loop(self.server, read, write, lifespan_state=session,
                                      init_options=self.server.create_initialization_options())

    @asynccontextmanager
    async def _lifespan(self, _server: Server[Session]) -> AsyncIterator[Session]:
        window = BatchWindow(self.hooks, self.window_s)
        async with window.running():
            yield Session(window=window, current=CurrentRun("session"))

    async def _list_tools(
        self, ctx: ServerRequestContext[Session], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self._tools())

    def _tool_names(self) -> list[str]:
        """The names :meth:`_tools` lists (without building the tools: checked on each call)."""
        names = [tools.SEARCH_MEMORY, tools.RECALL_CONTEXT]
        return [*names, tools.REMEMBER, tools.FORGET] if self.store is not None else names

    def _tools(self) -> list[types.Tool]:
        offered = tools.tools(self.hooks.allowance.policy)
        if self.store is not None:
            offered += tools.write_tools(self.max_memory_bytes)
        return offered

    async def _write(self, name: str, arguments: Mapping[str, Any],
                     caller: Caller) -> types.CallToolResult:
        """``remember`` or ``forget`` in the caller's own principal and scope (no recall slot)."""
        assert self.store is not None
        if name == tools.REMEMBER:
            text, memory_id = tools.remember_arguments(arguments, self.max_memory_bytes)
            stored = await self.store.remember(text, principal=caller.principal,
                                               scope=caller.scope, id=memory_id)
            return tools.remembered_result(stored)
        memory_id = tools.forget_argument(arguments)
        forgotten = await self.store.forget(memory_id, principal=caller.principal,
                                            scope=caller.scope)
        return tools.forgot_result(memory_id, forgotten)

    def _trusted(self, call: ToolRequest) -> tuple[Caller, CurrentRun]:
        """The caller of a request (HTTP: from its token) and its current run."""
        request: Any = call.request
        if request is None:  # stdio, in process: one user per server, one session
            if self.caller is None:
                raise McpAuthError("this server has no principal and scope configured")
            return self.caller, call.session.current
        user = request.scope.get("user")
        if not isinstance(user, AuthenticatedUser):
            raise McpAuthError("the request carries no valid bearer token")
        caller = caller_of_token(user.access_token)
        session_id = request.headers.get("mcp-session-id")
        # A session id is a session only where the SDK checked it: on the handshake protocol,
        # where an unknown id, or one opened with another token, is answered 404 before any
        # tool runs. Elsewhere (stateless HTTP) the header is ignored: the caller's current
        # run is its (principal, scope)'s.
        if session_id and call.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
            key: tuple[str, ...] = ("session", session_id, caller.principal, caller.scope)
            kind = "http-session"
        else:
            key, kind = ("cell", caller.principal, caller.scope), CELL
        current = self._current_runs.get(key)
        if current is None:
            current = self._current_runs.put(key, CurrentRun(kind))
        return caller, current

    async def _current_run_id(self, current: CurrentRun, caller: Caller) -> str:
        """The current run's id; the next run's once its deadline has passed. A (principal,
        scope)'s current run (stateless HTTP) is the ledger's: every server that shares the
        ledger gives the caller the same one."""
        allowance = self.hooks.allowance
        async with current.lock:
            if current.kind == CELL and not allowance.is_legacy:
                # Asked on every call, judged by the ledger's clock: a run opened (or refused)
                # by any server, and its end, are the same for all of them.
                last = current.run_id  # its time as this process watched it pass is a floor
                current.expire()  # a fresh candidate: opened only if the pair has no live run
                current.run_id = await allowance.ledger.current_run(
                    current.run_id, prefix=current.prefix, principal=caller.principal,
                    scope=caller.scope, now=allowance.checked_clock.wall(),
                    floor=allowance.now_for(last),
                    live_s=allowance.policy.deadline_s, per_hour=self.max_runs_per_hour)
                return current.run_id
            if current.touched and current.deadline is None:
                current.touched = False
                known = allowance.known_room(current.run_id)  # this process's own rounds
                current.deadline = (known.deadline_wall if known is not None
                                    and known.deadline_wall is not None
                                    else (await allowance.usage(current.run_id)).deadline_wall)
            if current.deadline is not None and (
                allowance.now_for(current.run_id) >= current.deadline
            ):
                current.expire()
            return current.run_id

    async def _admit(self, run_id: str, caller: Caller) -> bool:
        """Bind a run to its caller and count it as opened, once per run in this server.

        False when the caller already opened its runs for the hour (nothing was stored).
        Calls of the run that arrive meanwhile wait for that one admission, then go on
        together.
        """
        if self._admitted.get(run_id):
            return True
        admission = self._admitting.get(run_id)
        if admission is None:
            admission = self._admitting[run_id] = _Admission()
            allowance = self.hooks.allowance
            try:
                with anyio.CancelScope(shield=True):  # bounded by the ledger's own timeout
                    if allowance.is_legacy:
                        await allowance.ledger.bind_identity(
                            run_id, principal=caller.principal, scope=caller.scope)
                        admission.opened = True
                    else:  # binds the identity too, in the same transaction
                        opening = await allowance.ledger.open_run(
                            run_id, principal=caller.principal, scope=caller.scope,
                            now=allowance.checked_clock.wall(),
                            per_hour=self.max_runs_per_hour)
                        admission.opened = bool(opening)
                        if opening is RunOpening.OPENED:
                            allowance.learn_opened(run_id)  # nothing to read before it reserves
                        if opening is RunOpening.KNOWN and allowance.known_room(run_id) is None:
                            # Used elsewhere first: learn what it has left now, once, before
                            # any of its calls joins a batch (a new run has all of it).
                            await allowance.room(run_id)
            except Exception as exc:
                admission.error = exc
            finally:
                del self._admitting[run_id]
                admission.done.set()
            if admission.opened:
                self._admitted.put(run_id, True)
        else:
            await admission.done.wait()
        if admission.error is not None:
            raise admission.error
        return admission.opened

    async def _call_tool(
        self, ctx: ServerRequestContext[Session], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await self.call_tool(ToolRequest(
            name=params.name, arguments=params.arguments or {}, meta=ctx.meta,
            session=ctx.lifespan_context, protocol_version=ctx.protocol_version,
            request=ctx.request))

    async def call_tool(self, call: ToolRequest) -> types.CallToolResult:
        """Answer one ``tools/call``; whatever goes wrong is the call's own error result."""
        name = call.name
        if name not in self._tool_names():
            return tools.unknown_tool(name, self._tool_names())
        arguments = call.arguments
        try:
            caller, current = self._trusted(call)
            if name in (tools.REMEMBER, tools.FORGET):
                return await self._write(name, arguments, caller)
            # Everything the request says is checked before anything durable happens: a call
            # the server will not run binds no run and opens none.
            named = client_run_id(call.meta)
            search: ToolCall | None = None
            state = None
            if name == tools.RECALL_CONTEXT:
                state = tools.working_state(arguments)
            else:
                search = client_call(call.meta, dict(arguments))
                try:
                    SearchCall.validate(search, scope=caller.scope)
                except InvalidSearchCallError as exc:
                    return tools.search_result(rejected_call(search.call_id, exc))
            if named is not None:
                run_id = ledger_run_id(named, principal=caller.principal, scope=caller.scope)
            else:
                run_id = await self._current_run_id(current, caller)
            if not await self._admit(run_id, caller):
                refusal = BudgetRefusal(reason=RefusalReason.RUN_RATE, run_id=run_id,
                                        reserved=0, executed=0)
                if state is None:
                    return tools.refused_result(refusal)
                # the current corrections take no slot: shown before the bounded notice
                return tools.context_result(await self.hooks.refused_context(
                    state, refusal, scope=caller.scope, principal=caller.principal))
            window = call.session.window
            try:
                if search is not None:
                    result = await window.search(
                        search, run_id=run_id, principal=caller.principal, scope=caller.scope
                    )
                    return tools.search_result(result)
                assert state is not None
                async with window.exclusive(run_id):
                    context = await self.hooks.prepare(
                        state, run_id=run_id, scope=caller.scope, principal=caller.principal
                    )
                return tools.context_result(context)
            finally:
                if named is None and current.run_id == run_id:
                    current.touched = True  # the run may have opened: read its deadline next
        except Exception as exc:  # each call's failure is its own typed result
            log_event(_log, logging.WARNING, "mcp.call_failed", tool=name,
                      error=type(exc).__name__)
            return tools.error_result(exc)
