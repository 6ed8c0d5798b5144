"""What one client session holds, and one tool call as the server answers it on any
transport (the SDK's request path and the stdio short path both build one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .identity import CurrentRun
from .window import BatchWindow


@attrs.frozen
class Session:
    """What one lifespan entry (a client session, or an HTTP application) holds."""

    window: BatchWindow
    current: CurrentRun


@attrs.frozen
class ToolRequest:
    """One ``tools/call``, as the server answers it on any transport."""

    name: str
    arguments: Mapping[str, Any]
    meta: Mapping[str, Any] | None
    """The request's ``_meta`` (run and call ids)."""
    session: Session
    protocol_version: str | None = None
    request: Any = None
    """The HTTP request (its bearer token, its session id); None on stdio and in process."""
