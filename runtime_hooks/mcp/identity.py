"""Which run an MCP request belongs to, and who may use that run.

A run is what the client's runtime says it is: the request's ``_meta`` key
``recallbound/run_id``. Without one, the client session is the run: the server gives each
session a run id of its own when the session opens. A transport with no session (stateless
HTTP at protocol 2026-07-28) and no run id in ``_meta`` gets :class:`McpSessionError`: a fresh
run per request would hand every request a fresh allowance.

A run id is bound to the principal and scope of its first use; using it with another raises
:class:`~plugin.errors.RunIdentityError`. The map below enforces that within this process;
the ledger's durable binding, where the ledger keeps one, enforces it across processes.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Mapping

import attrs

from plugin.control import validate_run_id
from plugin.errors import InvalidRunIdError, McpSessionError, RunIdentityError

RUN_ID_META_KEY = "recallbound/run_id"
"""The ``_meta`` key a client's runtime sets to name the run a tool call belongs to."""


def new_session_run_id() -> str:
    """A run id for one client session that named none (unique across processes)."""
    return f"mcp-session-{uuid.uuid4().hex}"


def run_id_of(meta: Mapping[str, object] | None, session_run_id: str | None) -> str:
    """The request's run: ``_meta["recallbound/run_id"]``, else the session's run.

    Raises :class:`~plugin.errors.InvalidRunIdError` for a run id that is not a storable
    string, :class:`~plugin.errors.McpSessionError` when there is neither.
    """
    given = None if meta is None else meta.get(RUN_ID_META_KEY)
    if given is not None:
        if not isinstance(given, str):
            raise InvalidRunIdError(
                f"_meta[{RUN_ID_META_KEY!r}] must be a string, got {type(given).__name__}"
            )
        return validate_run_id(given)
    if session_run_id is None:
        raise McpSessionError(
            f"this transport has no client session: send the run id in "
            f"_meta[{RUN_ID_META_KEY!r}]"
        )
    return session_run_id


@attrs.define(eq=False)
class RunIdentities:
    """Run id -> (principal, scope) of its first use in this process.

    The most recent ``max_runs`` runs are kept; a run forgotten here is still bound by the
    ledger where the ledger binds run ids durably.
    """

    max_runs: int = 65_536
    _bound: collections.OrderedDict[str, tuple[str, str]] = attrs.field(
        factory=collections.OrderedDict, init=False, repr=False
    )

    def check(self, run_id: str, *, principal: str, scope: str) -> None:
        """Bind ``run_id`` on first use; raise :class:`RunIdentityError` on another identity."""
        bound = self._bound.get(run_id)
        if bound is None:
            self._bound[run_id] = (principal, scope)
            while len(self._bound) > self.max_runs:
                self._bound.popitem(last=False)
        elif bound != (principal, scope):
            raise RunIdentityError(
                f"run {run_id!r} is bound to another principal or scope"
            )
        else:
            self._bound.move_to_end(run_id)
