"""recallbound: a bounded, durable recall allowance and task-context query planning.

The public surface is what this module re-exports; everything else may move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .control.allowance import RecallAllowance as RecallAllowance
from .control.clock import Clock as Clock
from .control.clock import ManualClock as ManualClock
from .control.clock import SystemClock as SystemClock
from .control.ledger import AttemptOutcome as AttemptOutcome
from .control.ledger import AttemptTrace as AttemptTrace
from .control.ledger import Ledger as Ledger
from .control.ledger import Reservation as Reservation
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
from .errors import InvalidArgumentError as InvalidArgumentError
from .errors import InvalidArgumentTypeError as InvalidArgumentTypeError
from .errors import InvalidPolicyError as InvalidPolicyError
from .errors import InvalidRunIdError as InvalidRunIdError
from .errors import InvalidWorkingStateError as InvalidWorkingStateError
from .errors import InvalidWorkingStateTypeError as InvalidWorkingStateTypeError
from .errors import LedgerClosedError as LedgerClosedError
from .errors import LedgerConfigError as LedgerConfigError
from .errors import LedgerCorruptError as LedgerCorruptError
from .errors import LedgerError as LedgerError
from .errors import LedgerLockedError as LedgerLockedError
from .errors import LedgerPathError as LedgerPathError
from .errors import LedgerUnavailableError as LedgerUnavailableError
from .errors import MemoryStoreError as MemoryStoreError
from .errors import RecallboundError as RecallboundError
from .errors import RetrieverFailedError as RetrieverFailedError
from .errors import RetrieverProtocolError as RetrieverProtocolError
from .errors import RunIdentityError as RunIdentityError
from .memory.embedding import EmbeddingAdapter as EmbeddingAdapter
from .memory.planning import BaselineReason as BaselineReason
from .memory.planning import QueryPlanner as QueryPlanner
from .memory.planning import QueryStrategy as QueryStrategy
from .memory.planning import RecallQuery as RecallQuery
from .memory.planning import compose_baseline as compose_baseline
from .memory.planning import compose_search_call as compose_search_call
from .memory.planning import compose_task_context as compose_task_context
from .memory.preparation import PreparationBound as PreparationBound
from .memory.preparation import PreparedRecall as PreparedRecall
from .memory.preparation import QueryPreparation as QueryPreparation
from .memory.preparation import RecallPreparer as RecallPreparer
from .memory.preparation import SemanticPreparation as SemanticPreparation
from .memory.preparation import WithheldReason as WithheldReason
from .memory.process import ProcessRetriever as ProcessRetriever
from .memory.protocol import AttemptHandle as AttemptHandle
from .memory.protocol import ContextCaps as ContextCaps
from .memory.protocol import Found as Found
from .memory.protocol import Retriever as Retriever
from .memory.simple import SearchRequest as SearchRequest
from .memory.simple import SimpleRetriever as SimpleRetriever
from .memory.state import Fact as Fact
from .memory.state import Task as Task
from .memory.state import WorkingState as WorkingState
from .memory.store import Evidence as Evidence

if TYPE_CHECKING:
    from .control.postgres_ledger import PostgresLedger as PostgresLedger

__all__ = [
    "AllowancePolicy", "AttemptHandle", "AttemptKind", "AttemptOutcome", "AttemptTrace",
    "BaselineReason", "BoundedRecallNotice", "BudgetRefusal", "Clock", "ContextCaps",
    "EmbeddingAdapter", "Evidence", "Fact", "Found", "InvalidArgumentError",
    "InvalidArgumentTypeError", "InvalidPolicyError", "InvalidRunIdError",
    "InvalidWorkingStateError", "InvalidWorkingStateTypeError", "Ledger", "LedgerClosedError",
    "LedgerConfigError", "LedgerCorruptError", "LedgerError", "LedgerLockedError",
    "LedgerPathError", "LedgerUnavailableError", "ManualClock", "MemoryStoreError", "Permit",
    "PostgresLedger", "PreparationBound", "PreparedRecall", "ProcessRetriever", "QueryPlanner",
    "QueryPreparation", "QueryStrategy", "RecallAllowance", "RecallBudgetExceeded",
    "RecallPreparer", "RecallQuery", "RecallboundError", "RefusalReason", "Reservation",
    "Retriever", "RetrieverFailedError", "RetrieverProtocolError", "RoundKind",
    "RunIdentityError", "SearchRequest", "SemanticPreparation", "SimpleRetriever",
    "SqliteLedger", "SystemClock", "Task", "Usage", "WithheldReason", "WorkingState",
    "bind_permits", "compose_baseline", "compose_search_call", "compose_task_context",
    "current_permit",
]


def __getattr__(name: str) -> Any:
    # PostgresLedger needs the `postgres` extra (psycopg): plugin.control loads it on first use
    # (and says which extra is missing), so importing this package never imports psycopg.
    if name == "PostgresLedger":
        from . import control

        return control.PostgresLedger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
