"""The MCP server's own errors (the package's root is :class:`plugin.errors.RecallboundError`)."""

from __future__ import annotations

from plugin.errors import RecallboundError

__all__ = ["McpAuthError", "McpSessionError"]


class McpAuthError(RecallboundError, ValueError):
    """The MCP server's caller cannot be trusted: no valid token, or a bad token table."""


class McpSessionError(RecallboundError, ValueError):
    """An MCP request names no run and comes over a transport with no client session."""
