"""``tools/call`` on stdio, answered without the SDK's per-request dispatch.

Between a line read and the tool's handler, the SDK passes each request through the relay that
picks the connection's protocol era, a dispatcher task and its middleware chain, and the answer
back through them: about 0.4 ms a call, a third of what stdio adds to a search. A connection
that opens in the 2026-07-28 era carries everything needed to answer a request in the request
itself (its envelope), so on such a connection a well-formed ``tools/call`` is answered here
instead, by the same handler (:meth:`RecallServer.call_tool
<runtime_hooks.mcp.server.RecallServer.call_tool>`), after the same checks (the SDK's envelope
ladder and its ``tools/call`` params surface), shaped by the SDK's own result sieve and written
as the same line (tests compare the two byte for byte).

Everything else goes to the SDK unchanged: a connection's first request (from which the SDK
picks the connection's era), a connection that opens with the ``initialize`` handshake, any
other method, a ``tools/call`` the SDK would answer with an error, a request
whose id is still in flight here, and every request while the SDK has something to add to it
(an OpenTelemetry tracer provider is set, so its span would be recorded, or a middleware was
added to the server). A ``notifications/cancelled`` naming a call in flight here cancels it,
unanswered, as the SDK does (its search round runs on for the others); at shutdown a call still
in flight is answered "Connection closed", as the SDK answers its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import mcp_types as types
from anyio.abc import TaskGroup
from mcp.server.lowlevel.server import Server
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from mcp.shared.message import SessionMessage
from mcp_types import methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry import trace

from .session import Session, ToolRequest
from .wire import LineWriter, encode

if TYPE_CHECKING:
    from .server import RecallServer

TOOLS_CALL = "tools/call"
PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SHUTDOWN_WRITE_S = 2.0
"""How long an answer to a call cut short by shutdown may take to write."""


def _opens_modern(request: types.JSONRPCRequest) -> bool:
    """Whether a connection's first request opens the 2026-07-28 era (the SDK's own rule: not
    ``initialize``, and ``_meta`` names a protocol version)."""
    meta = (request.params or {}).get("_meta")
    return request.method != "initialize" and isinstance(meta, Mapping) \
        and PROTOCOL_VERSION_KEY in meta


def _sdk_adds_nothing(server: Server[Any]) -> bool:
    """Whether the SDK's request path would do nothing the lane does not: no middleware but
    its own OpenTelemetry one, and no tracer provider set (so that span records nothing)."""
    return all(type(middleware).__name__ == "OpenTelemetryMiddleware"
               for middleware in server.middleware) \
        and isinstance(trace.get_tracer_provider(),
                       (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


@attrs.define(eq=False)
class _Serving:
    session: Session
    writer: LineWriter
    tasks: TaskGroup


@attrs.define(eq=False)
class FastLane:
    """Takes the ``tools/call`` requests of a 2026-07-28 stdio connection off the SDK's path.

    :meth:`take` sees every message before the SDK does (the wire reader calls it); it answers
    only while :meth:`running`.
    """

    server: RecallServer
    _modern: bool | None = attrs.field(default=None, init=False)
    _serving: _Serving | None = attrs.field(default=None, init=False, repr=False)
    _in_flight: dict[object, anyio.CancelScope] = attrs.field(factory=dict, init=False,
                                                             repr=False)

    @asynccontextmanager
    async def running(self, session: Session, writer: LineWriter) -> AsyncIterator[None]:
        """Answer calls with ``session``'s window and current run, on ``writer``."""
        async with anyio.create_task_group() as tasks:
            self._serving = _Serving(session, writer, tasks)
            try:
                yield
            finally:
                self._serving = None
                tasks.cancel_scope.cancel()

    def take(self, message: SessionMessage) -> bool:
        """Whether this lane answers ``message`` (the SDK then never sees it)."""
        sent = message.message
        if isinstance(sent, types.JSONRPCNotification):
            if sent.method == "notifications/cancelled":
                self._cancel(sent.params)
            return False  # the SDK sees every notification too
        if not isinstance(sent, types.JSONRPCRequest):
            return False
        if self._modern is None:
            # The connection's first request goes to the SDK whatever it is: the SDK picks the
            # connection's era from the first request it sees, so it must see this one.
            self._modern = _opens_modern(sent)
            return False
        serving = self._serving
        if not self._modern or serving is None or sent.method != TOOLS_CALL \
                or not _sdk_adds_nothing(self.server.server):
            return False
        key = coerce_request_id(sent.id)
        if key in self._in_flight:
            return False
        checked = self._checked(sent.params)
        if checked is None:
            return False
        version, params = checked
        call = ToolRequest(name=params.name, arguments=params.arguments or {}, meta=params.meta,
                           session=serving.session, protocol_version=version)
        scope = self._in_flight[key] = anyio.CancelScope()
        serving.tasks.start_soon(self._answer, sent.id, key, call, version, scope,
                                 serving.writer)
        return True

    @staticmethod
    def _checked(
        params: Mapping[str, Any] | None,
    ) -> tuple[str, types.CallToolRequestParams] | None:
        """The request's protocol version and typed params, or None where the SDK would answer
        with an error (it answers them then)."""
        route = classify_inbound_request({"method": TOOLS_CALL, "params": params})
        if isinstance(route, InboundLadderRejection) \
                or route.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return None
        try:
            methods.validate_client_request(TOOLS_CALL, route.protocol_version, params)
            typed = types.CallToolRequestParams.model_validate(params or {}, by_name=False)
        except (ValueError, KeyError):  # a pydantic ValidationError is a ValueError
            return None
        return route.protocol_version, typed

    def _cancel(self, params: Mapping[str, Any] | None) -> None:
        named = cancelled_request_id_from_params(params)
        if named is not None:
            scope = self._in_flight.get(coerce_request_id(named))
            if scope is not None:
                scope.cancel()

    async def _answer(self, request_id: types.RequestId, key: object, call: ToolRequest,
                      version: str, scope: anyio.CancelScope, writer: LineWriter) -> None:
        answering = False  # once an answer is begun, it is the only one
        try:
            with scope:
                result = await self.server.call_tool(call)
            if scope.cancel_called:  # the peer cancelled it: never answered
                return
            answer = self._result(version, result)
            answering = True
            # Written while the output is open, even after the SDK has closed its side.
            await writer.answer(encode(SessionMessage(
                types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=answer))))
        except anyio.get_cancelled_exc_class():
            if answering:
                raise
            with anyio.move_on_after(SHUTDOWN_WRITE_S, shield=True):
                error = types.ErrorData(code=types.CONNECTION_CLOSED, message="Connection closed")
                await writer.answer(encode(SessionMessage(
                    types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))))
            raise
        finally:
            self._in_flight.pop(key, None)

    def _result(self, version: str, result: types.CallToolResult) -> dict[str, Any]:
        """``result`` on the wire, as the SDK shapes a ``tools/call`` result at ``version``."""
        dumped = methods.serialize_server_result(
            TOOLS_CALL, version, result.model_dump(by_alias=True, mode="json", exclude_none=True))
        if dumped.get("resultType") is None:
            dumped["resultType"] = "complete"
        meta = dumped.get("_meta")
        if meta is None:
            dumped["_meta"] = {SERVER_INFO_KEY: self.server.server.server_info_stamp}
        elif isinstance(meta, dict) and meta.get(SERVER_INFO_KEY) is None:
            dumped["_meta"] = {**meta, SERVER_INFO_KEY: self.server.server.server_info_stamp}
        return dumped
