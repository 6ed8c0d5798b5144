"""recallbound: a bounded, durable recall allowance and task-context query planning.

The public surface is what this module lists in ``__all__``: what a user writes against.
Everything else is reachable from its own module (``plugin.control``, ``plugin.memory``) and
may move. The memory layer (and numpy with it) is imported on first use of one of its names,
so ``import plugin.control`` loads neither.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from .control.allowance import RecallAllowance as RecallAllowance
from .control.clock import Clock as Clock
from .control.clock import ManualClock as ManualClock
from .control.clock import SystemClock as SystemClock
from .control.ledger import AttemptOutcome as AttemptOutcome
from .control.ledger import Ledger as Ledger
from .control.ledger import Usage as Usage
from .control.permit import Permit as Permit
from .control.permit import bind_permits as bind_permits
from .control.permit import current_permit as current_permit
from .control.policy import AllowancePolicy as AllowancePolicy
from .control.policy import AttemptKind as AttemptKind
from .control.policy import RoundKind as RoundKind
from .control.refusal import BoundedRecallNotice as BoundedRecallNotice
from .control.refusal import BudgetRefusal as BudgetRefusal
from .control.refusal import RecallBudgetExceeded as RecallBudgetExceeded
from .control.refusal import RefusalReason as RefusalReason
from .control.sqlite_ledger import SqliteLedger as SqliteLedger
from .errors import ConfigError as ConfigError
from .errors import InvalidArgumentError as InvalidArgumentError
from .errors import InvalidArgumentTypeError as InvalidArgumentTypeError
from .errors import LedgerClosedError as LedgerClosedError
from .errors import LedgerConfigError as LedgerConfigError
from .errors import LedgerCorruptError as LedgerCorruptError
from .errors import LedgerError as LedgerError
from .errors import LedgerFullError as LedgerFullError
from .errors import LedgerLockedError as LedgerLockedError
from .errors import LedgerPathError as LedgerPathError
from .errors import LedgerUnavailableError as LedgerUnavailableError
from .errors import MemoryStoreError as MemoryStoreError
from .errors import RecallboundError as RecallboundError
from .errors import RetrieverFailedError as RetrieverFailedError
from .errors import RetrieverProtocolError as RetrieverProtocolError
from .errors import RunIdentityError as RunIdentityError

if TYPE_CHECKING:
    from .control.postgres_ledger import PostgresLedger as PostgresLedger
    from .memory.compose import compose_baseline as compose_baseline
    from .memory.compose import compose_task_context as compose_task_context
    from .memory.embedding import EmbeddingAdapter as EmbeddingAdapter
    from .memory.planning import QueryPlanner as QueryPlanner
    from .memory.preparation import PreparedRecall as PreparedRecall
    from .memory.preparation import QueryPreparation as QueryPreparation
    from .memory.process import ProcessRetriever as ProcessRetriever
    from .memory.protocol import AttemptHandle as AttemptHandle
    from .memory.protocol import ContextCaps as ContextCaps
    from .memory.protocol import Found as Found
    from .memory.protocol import Retriever as Retriever
    from .memory.query import QueryStrategy as QueryStrategy
    from .memory.query import RecallQuery as RecallQuery
    from .memory.simple import SearchRequest as SearchRequest
    from .memory.simple import SimpleRetriever as SimpleRetriever
    from .memory.state import Fact as Fact
    from .memory.state import Task as Task
    from .memory.state import WorkingState as WorkingState
    from .memory.store import Evidence as Evidence

__all__ = [
    "AllowancePolicy", "AttemptHandle", "AttemptKind", "AttemptOutcome", "BoundedRecallNotice",
    "BudgetRefusal", "Clock", "ConfigError", "ContextCaps", "EmbeddingAdapter", "Evidence",
    "Fact", "Found", "InvalidArgumentError", "InvalidArgumentTypeError", "Ledger",
    "LedgerClosedError", "LedgerConfigError", "LedgerCorruptError", "LedgerError",
    "LedgerFullError", "LedgerLockedError", "LedgerPathError", "LedgerUnavailableError",
    "ManualClock", "MemoryStoreError", "Permit", "PostgresLedger", "PreparedRecall",
    "ProcessRetriever", "QueryPlanner", "QueryPreparation", "QueryStrategy", "RecallAllowance",
    "RecallBudgetExceeded", "RecallQuery", "RecallboundError", "RefusalReason", "Retriever",
    "RetrieverFailedError", "RetrieverProtocolError", "RoundKind", "RunIdentityError",
    "SearchRequest", "SimpleRetriever", "SqliteLedger", "SystemClock", "Task", "Usage",
    "WorkingState", "bind_permits", "compose_baseline", "compose_task_context", "current_permit",
]

_LAZY = {
    "EmbeddingAdapter": "plugin.memory.embedding",
    "QueryPlanner": "plugin.memory.planning",
    "QueryStrategy": "plugin.memory.query",
    "RecallQuery": "plugin.memory.query",
    "compose_baseline": "plugin.memory.compose",
    "compose_task_context": "plugin.memory.compose",
    "PreparedRecall": "plugin.memory.preparation",
    "QueryPreparation": "plugin.memory.preparation",
    "ProcessRetriever": "plugin.memory.process",
    "AttemptHandle": "plugin.memory.protocol",
    "ContextCaps": "plugin.memory.protocol",
    "Found": "plugin.memory.protocol",
    "Retriever": "plugin.memory.protocol",
    "SearchRequest": "plugin.memory.simple",
    "SimpleRetriever": "plugin.memory.simple",
    "Fact": "plugin.memory.state",
    "Task": "plugin.memory.state",
    "WorkingState": "plugin.memory.state",
    "Evidence": "plugin.memory.store",
}
"""Public names of the memory layer, imported on first use."""

_MOVED = {
    "AttemptTrace": "plugin.control",
    "Reservation": "plugin.control",
    "BaselineReason": "plugin.memory",
    "compose_search_call": "plugin.memory",
    "PreparationBound": "plugin.memory",
    "RecallPreparer": "plugin.memory",
    "SemanticPreparation": "plugin.memory",
    "WithheldReason": "plugin.memory",
}
"""Names that left the top-level surface: still importable here for one release, with a
DeprecationWarning naming the module to import them from."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups are plain attribute reads
        return value
    if name == "PostgresLedger":
        # Needs the `postgres` extra (psycopg): plugin.control loads it on first use (and says
        # which extra is missing), so importing this package never imports psycopg.
        from . import control

        return control.PostgresLedger
    home = _MOVED.get(name)
    if home is not None:
        warnings.warn(f"plugin.{name} is deprecated: import it from {home}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(home), name)
    from . import errors

    if name in errors.DEPRECATED:
        return getattr(errors, name)  # warns, naming the class to use instead
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
