"""``recallbound mcp``: bounded, durable recall as an MCP server (the ``mcp`` extra).

Importing :mod:`runtime_hooks` never imports this package or the SDK.
"""

from .identity import RUN_ID_META_KEY as RUN_ID_META_KEY
from .identity import RunIdentities as RunIdentities
from .server import RecallServer as RecallServer
from .trust import Caller as Caller
from .trust import TableTokenVerifier as TableTokenVerifier
from .trust import TokenTable as TokenTable
from .window import DEFAULT_WINDOW_S as DEFAULT_WINDOW_S
from .window import BatchWindow as BatchWindow

__all__ = [
    "DEFAULT_WINDOW_S", "RUN_ID_META_KEY", "BatchWindow", "Caller", "RecallServer",
    "RunIdentities", "TableTokenVerifier", "TokenTable",
]
