"""Which run an MCP request belongs to.

A run is what the client's runtime says it is: the request's ``_meta`` key
``recallbound/run_id``. That id is the client's name for the run, not the ledger's: the ledger
run id is derived from the trusted principal and scope and the client's id
(:func:`ledger_run_id`), so the same id sent by two callers names two runs, and no caller can
take over, block or probe another caller's run by guessing its id.

Without a run id in ``_meta``, a call belongs to the caller's *current run*
(:class:`CurrentRun`): the client session's (stdio, in process, stateful HTTP) or, on stateless
HTTP, the (principal, scope)'s in this server. The current run ends when its deadline passes;
the next call then opens the next run. A run id the server makes up is never derived from
anything the client sends (a made-up ``Mcp-Session-Id`` names no run).

A run is still bound to the principal and scope of its first use, durably, in the ledger, and
each new run counts against the caller's runs per hour there (see
:meth:`~plugin.control.ledger.Ledger.open_run`).

A call is named by the client too: ``_meta`` key ``recallbound/call_id``
(:func:`client_call`). A call's identity is (run, call id, canonical arguments), so a client
that sends the same call again (after a reconnect, or to another server process over the same
ledger) gets the outcome the ledger recorded, and nothing is searched or reserved again.
Without a call id, each request is a new call with a fresh, server-made id (a JSON-RPC request
id is only unique within one session, so it never names a call).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping

import anyio
import attrs

from plugin.control import validate
from plugin.control.allowance import MAX_RUN_ID_BYTES
from plugin.control.validate import identifier
from plugin.errors import InvalidArgumentError
from runtime_hooks.calls import MAX_CALL_ID_BYTES, ToolCall, one_off

RUN_ID_META_KEY = "recallbound/run_id"
"""The ``_meta`` key a client's runtime sets to name the run a tool call belongs to."""
CALL_ID_META_KEY = "recallbound/call_id"
"""The ``_meta`` key a client's runtime sets to name a tool call (so that re-sending it
answers from the ledger instead of searching again)."""

_CELL_HEX = 24


def _cell(principal: str, scope: str) -> str:
    text = json.dumps([principal, scope], ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:_CELL_HEX]


def ledger_run_id(client_run_id: str, *, principal: str, scope: str) -> str:
    """The ledger's run id for the run a caller names ``client_run_id``.

    ``mcp:<cell>:<client id>``, where ``<cell>`` is a digest of the principal and scope (a long
    client id is replaced by its digest, so every result is a storable run id).
    """
    prefix = f"mcp:{_cell(principal, scope)}:"
    if len(prefix.encode("utf-8")) + len(client_run_id.encode("utf-8")) > MAX_RUN_ID_BYTES:
        digest = hashlib.sha256(client_run_id.encode("utf-8")).hexdigest()
        return f"{prefix}#{digest}"
    return prefix + client_run_id


def client_run_id(meta: Mapping[str, object] | None) -> str | None:
    """The run id the request names in ``_meta``, or None.

    Raises :class:`~plugin.errors.InvalidArgumentError` for a run id that is not a storable string.
    """
    given = None if meta is None else meta.get(RUN_ID_META_KEY)
    if given is None:
        return None
    if not isinstance(given, str):
        raise InvalidArgumentError(
            f"_meta[{RUN_ID_META_KEY!r}] must be a string, got {type(given).__name__}"
        )
    # named as the client sent it: the tools take no run_id argument
    return validate.run_id(given, field=f"_meta[{RUN_ID_META_KEY!r}]")


def client_call(meta: Mapping[str, object] | None, arguments: Mapping[str, object]) -> ToolCall:
    """The request's call: under the call id it names in ``_meta``, or, for a request that
    names none, under a fresh id the server makes up (:func:`~runtime_hooks.calls.one_off`:
    no one can send it again, so no claim is written for it).

    Raises :class:`~plugin.errors.InvalidArgumentError` (or its type-error sibling) for a call
    id that is not a usable id: blank, longer than
    :data:`~runtime_hooks.calls.MAX_CALL_ID_BYTES`, or with a control character.
    """
    given = None if meta is None else meta.get(CALL_ID_META_KEY)
    if given is None:
        return one_off(arguments, prefix="mcp-")
    call_id = identifier(given, field=f"_meta[{CALL_ID_META_KEY!r}]",
                         max_bytes=MAX_CALL_ID_BYTES)
    return ToolCall(call_id=call_id, arguments=arguments)


CELL = "cell"
"""The kind of a (principal, scope)'s current run (stateless HTTP), shared through the ledger."""


@attrs.define(eq=False)
class CurrentRun:
    """The run of a caller's calls that name none, until its deadline passes.

    ``run_id`` changes to a fresh, server-made id when :meth:`expire` is called. ``deadline``
    is the run's deadline once the server has read it from the ledger; ``touched`` says that a
    call may have opened the run since the last read (so a burst of calls on a run that has
    not opened yet reads nothing).
    """

    kind: str
    run_id: str = attrs.field(init=False)
    deadline: float | None = None
    touched: bool = False
    lock: anyio.Lock = attrs.field(factory=anyio.Lock)

    def __attrs_post_init__(self) -> None:
        self.run_id = self._fresh()

    def _fresh(self) -> str:
        return f"{self.prefix}{uuid.uuid4().hex}"

    def expire(self) -> None:
        """Start the next run: a fresh id, nothing read yet."""
        self.run_id = self._fresh()
        self.deadline = None
        self.touched = False

    @property
    def prefix(self) -> str:
        """What every run id of this kind starts with."""
        return f"mcp-{self.kind}-"
