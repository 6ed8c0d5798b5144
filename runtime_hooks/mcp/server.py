"""The MCP server: ``search_memory`` and ``recall_context`` over the hooks.

:class:`RecallServer` wraps :class:`~runtime_hooks.hooks.RecallHooks` in the SDK's low-level
``Server`` (it gives each handler the request's ``_meta`` and runs on asyncio and trio). Each
tool call is resolved to a trusted caller (:mod:`.trust`), a run (:mod:`.identity`), and then
goes through the hooks: a search joins its run's batch (:mod:`.window`); ``recall_context``
runs the automatic round. Whatever goes wrong in one call is that call's typed error result
(:mod:`.tools`); the server keeps serving.

The SDK's lifespan is entered once per connection on stdio and in process (one client
session) and once per application over HTTP; each entry gets its own session run id and its
own batch window. The run-identity map is the server's, shared by every connection.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server

from plugin.control.logs import log_event
from runtime_hooks.hooks import RecallHooks, ToolCall

from . import tools
from .errors import McpAuthError
from .identity import new_session_run_id, run_id_of
from .trust import Caller, caller_of_token
from .window import DEFAULT_WINDOW_S, BatchWindow, check_window

_log = logging.getLogger("recallbound.mcp")

SERVER_NAME = "recallbound"


@attrs.frozen
class Session:
    """What one lifespan entry (a client session, or an HTTP application) holds."""

    run_id: str
    window: BatchWindow


@attrs.define(eq=False)
class RecallServer:
    """The recallbound MCP server over ``hooks``.

    ``caller`` is the trusted identity of every call on stdio and in process; over HTTP the
    identity comes from each request's bearer token instead (and ``caller`` is ignored).
    ``window_s`` is the batch window (see :mod:`.window`).
    """

    hooks: RecallHooks
    caller: Caller | None = None
    window_s: float = attrs.field(default=DEFAULT_WINDOW_S, converter=check_window)
    server: Server[Session] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.server = Server(
            SERVER_NAME,
            instructions=(
                "Long-term memory with a bounded recall allowance per run. A refusal that "
                "says recall was bounded is not evidence that no memory exists."
            ),
            lifespan=self._lifespan,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    @asynccontextmanager
    async def _lifespan(self, _server: Server[Session]) -> AsyncIterator[Session]:
        window = BatchWindow(self.hooks, self.window_s)
        async with window.running():
            yield Session(run_id=new_session_run_id(), window=window)

    async def _list_tools(
        self, ctx: ServerRequestContext[Session], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools.tools())

    def _trusted(self, ctx: ServerRequestContext[Session]) -> tuple[Caller, str | None]:
        """The caller and the session run id of a request (HTTP: from its token)."""
        request: Any = ctx.request
        if request is None:  # stdio, in process: one user per server
            if self.caller is None:
                raise McpAuthError("this server has no principal and scope configured")
            return self.caller, ctx.lifespan_context.run_id
        user = request.scope.get("user")
        if not isinstance(user, AuthenticatedUser):
            raise McpAuthError("the request carries no valid bearer token")
        session_id = request.headers.get("mcp-session-id")
        return caller_of_token(user.access_token), (
            f"mcp-http-{session_id}" if session_id else None
        )

    async def _call_tool(
        self, ctx: ServerRequestContext[Session], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        name = params.name
        if name not in (tools.SEARCH_MEMORY, tools.RECALL_CONTEXT):
            return tools.unknown_tool(name)
        arguments: Mapping[str, Any] = params.arguments or {}
        try:
            caller, session_run_id = self._trusted(ctx)
            meta: Mapping[str, object] | None = ctx.meta
            run_id = run_id_of(meta, session_run_id)
            # Before the call joins a batch: a batch runs under one principal and scope.
            await self.hooks.allowance.ledger.bind_identity(
                run_id, principal=caller.principal, scope=caller.scope)
            window = ctx.lifespan_context.window
            if name == tools.SEARCH_MEMORY:
                call = ToolCall(call_id=f"mcp-{uuid.uuid4().hex}", arguments=dict(arguments))
                result = await window.search(
                    call, run_id=run_id, principal=caller.principal, scope=caller.scope
                )
                return tools.search_result(result)
            state = tools.working_state(arguments)
            async with window.exclusive(run_id):
                context = await self.hooks.prepare(
                    state, run_id=run_id, scope=caller.scope, principal=caller.principal
                )
            return tools.context_result(context)
        except Exception as exc:  # each call's failure is its own typed result
            log_event(_log, logging.WARNING, "mcp.call_failed", tool=name,
                      error=type(exc).__name__)
            return tools.error_result(exc)
