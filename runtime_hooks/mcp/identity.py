"""Which run an MCP request belongs to, and who may use that run.

A run is what the client's runtime says it is: the request's ``_meta`` key
``recallbound/run_id``. Without one, the client session is the run: the server gives each
session a run id of its own when the session opens. A transport with no session (stateless
HTTP at protocol 2026-07-28) and no run id in ``_meta`` gets :class:`McpSessionError`: a fresh
run per request would hand every request a fresh allowance.

A run id is bound to the principal and scope of its first use, durably, in the ledger (the
server asks it before a call joins a batch); using it with another raises
:class:`~plugin.errors.RunIdentityError` on every server that shares the ledger.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from plugin.control import validate_run_id
from plugin.errors import InvalidArgumentError

from .errors import McpSessionError

RUN_ID_META_KEY = "recallbound/run_id"
"""The ``_meta`` key a client's runtime sets to name the run a tool call belongs to."""


def new_session_run_id() -> str:
    """A run id for one client session that named none (unique across processes)."""
    return f"mcp-session-{uuid.uuid4().hex}"


def run_id_of(meta: Mapping[str, object] | None, session_run_id: str | None) -> str:
    """The request's run: ``_meta["recallbound/run_id"]``, else the session's run.

    Raises :class:`~plugin.errors.InvalidArgumentError` for a run id that is not a storable
    string, :class:`~runtime_hooks.mcp.errors.McpSessionError` when there is neither.
    """
    given = None if meta is None else meta.get(RUN_ID_META_KEY)
    if given is not None:
        if not isinstance(given, str):
            raise InvalidArgumentError(
                f"_meta[{RUN_ID_META_KEY!r}] must be a string, got {type(given).__name__}"
            )
        return validate_run_id(given)
    if session_run_id is None:
        raise McpSessionError(
            f"this transport has no client session: send the run id in "
            f"_meta[{RUN_ID_META_KEY!r}]"
        )
    return session_run_id
