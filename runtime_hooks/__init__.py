"""The edge: installs recallbound into agent loops.

Importing this package imports no agent framework; adapters are optional extras.
"""

from .bootstrap import RecallConfig as RecallConfig
from .bootstrap import open_hooks as open_hooks
from .hooks import InvalidSearchCallError as InvalidSearchCallError
from .hooks import PreparedContext as PreparedContext
from .hooks import RecallHooks as RecallHooks
from .hooks import SearchCall as SearchCall
from .hooks import ToolCall as ToolCall
from .hooks import ToolResult as ToolResult
from .hooks import Validation as Validation

__all__ = [
    "InvalidSearchCallError", "PreparedContext", "RecallConfig", "RecallHooks", "SearchCall",
    "ToolCall", "ToolResult", "Validation", "open_hooks",
]
