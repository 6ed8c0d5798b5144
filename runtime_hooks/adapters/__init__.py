"""Adapters for real agent frameworks (optional extras; asyncio only).

``runtime_hooks.adapters`` itself imports no framework: the search tool's definition
(:data:`SEARCH_TOOL`), the per-run batch (:class:`RunRecall`) and the per-invocation automatic
round (:class:`Invocation`, :func:`automatic_mode`) are shared by every adapter.
Each framework's adapter lives in its own module and imports its framework there (without
it, importing the module raises :class:`MissingExtraError` naming the extra to install):
``runtime_hooks.adapters.pydantic_ai`` (extra ``pydantic-ai``),
``runtime_hooks.adapters.langchain`` (extra ``langchain``) and
``runtime_hooks.adapters.openai_agents`` (extra ``openai-agents``).

None of these frameworks runs under trio, so the adapters are asyncio-only; the core (the
allowance, the ledger, the hooks) stays on both loops.
"""

from runtime_hooks._extras import MissingExtraError as MissingExtraError

from .batch import RunRecall as RunRecall
from .batch import RunRecalls as RunRecalls
from .batch import automatic_mode as automatic_mode
from .hooks_loop import HooksLoopStoppedError as HooksLoopStoppedError
from .invocation import Invocation as Invocation
from .tool import SEARCH_TOOL as SEARCH_TOOL
from .tool import SearchTool as SearchTool

__all__ = [
    "SEARCH_TOOL",
    "HooksLoopStoppedError",
    "Invocation",
    "MissingExtraError",
    "RunRecall",
    "RunRecalls",
    "SearchTool",
    "automatic_mode",
]
