"""``recallbound mcp``: bounded, durable recall as an MCP server (the ``mcp`` extra).

Importing :mod:`runtime_hooks` never imports this package. Importing this package does not
import the SDK either (the ``recallbound`` command registers ``mcp`` without it); the names
that need the SDK (:class:`RecallServer`, :class:`Caller`, :class:`TokenTable`,
:class:`TableTokenVerifier`) load it on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .identity import CALL_ID_META_KEY as CALL_ID_META_KEY
from .identity import RUN_ID_META_KEY as RUN_ID_META_KEY
from .window import DEFAULT_WINDOW_S as DEFAULT_WINDOW_S
from .window import BatchWindow as BatchWindow

if TYPE_CHECKING:
    from .server import RecallServer as RecallServer
    from .trust import Caller as Caller
    from .trust import TableTokenVerifier as TableTokenVerifier
    from .trust import TokenTable as TokenTable

_WITH_SDK = {"RecallServer": ".server", "Caller": ".trust", "TableTokenVerifier": ".trust",
             "TokenTable": ".trust"}

__all__ = [
    "CALL_ID_META_KEY", "DEFAULT_WINDOW_S", "RUN_ID_META_KEY", "BatchWindow", "Caller",
    "RecallServer", "TableTokenVerifier", "TokenTable",
]


def __getattr__(name: str) -> Any:
    module = _WITH_SDK.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
