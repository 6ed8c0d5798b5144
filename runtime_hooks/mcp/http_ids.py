"""Streamable HTTP: a request whose id MCP does not allow, or whose ``params`` is null, is
answered, never run.

On a connection that opened with the ``initialize`` handshake, the SDK parses a POST body with
a parser that drops an id it does not accept (``{"id": true, "method": ...}``) and takes the
rest for a notification: it answers ``202`` and runs the method. :class:`RequestIdCheck` sits
in front of the SDK's application and answers such a body itself, as the stdio reader does
(:func:`~runtime_hooks.mcp.request_id.invalid_request_id`): ``400`` with a JSON-RPC Invalid Request
error whose id is null. It reads only the body of a request the SDK would read (Host, Origin
and content type allowed, a valid bearer token), checked before a byte of it is read: a
request the transport's security refuses is answered here with the SDK's own answer (``421``,
``403``, ``400``), since the SDK would read the body first; one without a valid token goes to
the SDK, which refuses it before its body (``401``). A request whose ``params`` is null (the
SDK reads it as absent and runs the method) is answered the same way, with an Invalid Params
error under its own id, and a body with ``NaN`` or ``Infinity`` (not JSON, though the SDK's
parser takes them) with a Parse error, as on stdio. A body is read at most up to the
transport's size cap before it is looked at; a larger one goes to the SDK, which refuses it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import attrs
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from mcp.server.auth.provider import TokenVerifier
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .request_id import BAD_ID_MESSAGE, PARAMS_NOT_AN_OBJECT, invalid_request_id, null_params_in
from .wire import INVALID_PARAMS, INVALID_REQUEST, MAX_LINE_BYTES, PARSE_ERROR, error_line

Admitted = Callable[[Request], Awaitable["bool | Response"]]
"""Whether the SDK would read a request's body (its Host, Origin, content type and token are
accepted), or the SDK's answer to a request its transport security refuses."""


class _NotJson(ValueError):
    """A JSON text with ``NaN`` or ``Infinity``, which JSON does not have."""


def _not_json(constant: str) -> object:
    raise _NotJson(constant)

@attrs.frozen
class RequestIdCheck:
    """An ASGI application: ``app``, with POSTs to ``path`` checked for an invalid id first."""

    app: ASGIApp
    admitted: Admitted
    path: str = "/mcp"
    max_body_bytes: int = MAX_LINE_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" \
                or scope["path"].rstrip("/") != self.path.rstrip("/"):
            await self.app(scope, receive, send)
            return
        # Checked before a byte of the body is read: a request the SDK refuses (Host, Origin,
        # content type, token) holds no memory here, however large or slow a body it declares.
        admitted = await self.admitted(Request(scope))
        if isinstance(admitted, Response):
            await admitted(scope, receive, send)
            return
        if not admitted:
            await self.app(scope, receive, send)  # refused before its body (401)
            return
        read: list[Message] = []
        size, whole = 0, False
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                whole = True
                break
            if size > self.max_body_bytes:
                break
        if whole and size <= self.max_body_bytes:
            body = b"".join(message.get("body", b"") for message in read)
            try:
                document = json.loads(body, parse_constant=_not_json)
            except _NotJson:
                document = _NOT_JSON
            except (ValueError, RecursionError):
                document = None  # the SDK answers it
            refusal = _refusal(document)
            if refusal is not None:
                answer = Response(refusal, status_code=400, media_type="application/json")
                await answer(scope, receive, send)
                return

        async def replay() -> Message:
            return read.pop(0) if read else await receive()

        await self.app(scope, replay, send)


_NOT_JSON = object()
"""A body that is JSON but for ``NaN`` or ``Infinity``."""


def _refusal(document: object) -> bytes | None:
    """The error line for a body the SDK would run wrongly: one with ``NaN`` or ``Infinity``,
    an id MCP does not allow (id null), or a request whose ``params`` is null (the SDK reads
    it as absent), else None."""
    if document is _NOT_JSON:
        return error_line(None, PARSE_ERROR, "Parse error: not JSON")
    if invalid_request_id(document):
        return error_line(None, INVALID_REQUEST, BAD_ID_MESSAGE)
    if null_params_in(document):
        return error_line(document["id"], INVALID_PARAMS, PARAMS_NOT_AN_OBJECT)
    return None


def admitted_by(security: TransportSecuritySettings, verifier: TokenVerifier) -> Admitted:
    """The SDK's own checks, as the request would meet them: ``verifier`` for the bearer
    token, then ``security`` for Host, Origin and content type."""
    guard = TransportSecurityMiddleware(security)
    backend = BearerAuthBackend(verifier)

    async def admitted(request: Request) -> bool | Response:
        if await backend.authenticate(HTTPConnection(request.scope)) is None:
            return False  # the SDK refuses it first (401), before its body
        refused = await guard.validate_request(request, is_post=True)
        return True if refused is None else refused

    return admitted
