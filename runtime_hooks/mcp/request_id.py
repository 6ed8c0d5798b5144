"""Which request ids MCP allows, and what ``params`` may be: the rules the stdio reader and the
HTTP check share."""

from __future__ import annotations

from typing import TypeGuard

import mcp_types as types

BAD_ID_MESSAGE = "Invalid request: the id must be a string or an integer"
"""The error message of a request whose id MCP does not allow."""
PARAMS_NOT_AN_OBJECT = "Invalid params: must be an object"
"""The error message of a request whose ``params`` is not an object."""


def invalid_request_id(document: object) -> bool:
    """Whether ``document`` is a request (it has a ``method``) with an ``id`` member that MCP
    does not allow.

    MCP narrows JSON-RPC 2.0: a request's id is a string or an integer, and never null. So
    null, booleans, numbers with a fraction or an exponent (``1.5``, ``1.0``, ``1e3``),
    objects and arrays are invalid. Such a request is not a notification (a notification has
    no ``id`` member at all), so it is answered with an Invalid Request error whose id is null
    (the id could not be read) and its method is never run. The SDK's message parser instead
    drops an id it does not accept and reads the rest as a notification, which would run the
    method and answer nothing; every reader checks with this first.
    """
    if not isinstance(document, dict) or "id" not in document or "method" not in document:
        return False
    request_id = document["id"]
    return isinstance(request_id, bool) or not isinstance(request_id, (str, int))


def null_params(message: object) -> TypeGuard[types.JSONRPCRequest]:
    """Whether ``message`` (parsed) is a request whose ``params`` is JSON null. The SDK's model
    reads null as absent, but JSON-RPC allows an object, an array or no member at all: a wrong
    ``params`` shape, answered with Invalid Params, and the method is not run. (The stdio
    reader's one-pass parse sees only the model; :func:`null_params_in` is the same rule on a
    decoded document.)"""
    return isinstance(message, types.JSONRPCRequest) and message.params is None \
        and "params" in message.model_fields_set


def null_params_in(document: object) -> TypeGuard[dict[str, object]]:
    """:func:`null_params` on a decoded document: a request (a ``method`` and an ``id``) whose
    ``params`` member is null."""
    return isinstance(document, dict) and "method" in document and "id" in document \
        and "params" in document and document["params"] is None
