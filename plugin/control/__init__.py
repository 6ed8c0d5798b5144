"""The control primitive: clock, policy, permit, refusals, ledger, allowance.

Imports only the standard library, attrs, anyio (and the SQLite drivers); never memory, hooks,
a framework, or an ambient clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .allowance import Checkpoint as Checkpoint
from .allowance import RecallAllowance as RecallAllowance
from .allowance import validate_run_id as validate_run_id
from .attempt import Attempt as Attempt
from .attempt import SyncAttempt as SyncAttempt
from .clock import Clock as Clock
from .clock import ManualClock as ManualClock
from .clock import SystemClock as SystemClock
from .ledger import AttemptOutcome as AttemptOutcome
from .ledger import AttemptTrace as AttemptTrace
from .ledger import Ledger as Ledger
from .ledger import RefusalRecord as RefusalRecord
from .ledger import Reservation as Reservation
from .ledger import Usage as Usage
from .ledger import Validity as Validity
from .ledger import WallTime as WallTime
from .permit import Permit as Permit
from .permit import PermitHolder as PermitHolder
from .permit import bind_permits as bind_permits
from .permit import current_permit as current_permit
from .permit import hide_permit as hide_permit
from .policy import AllowancePolicy as AllowancePolicy
from .policy import AttemptKind as AttemptKind
from .policy import RoundKind as RoundKind
from .refusal import BoundedRecallNotice as BoundedRecallNotice
from .refusal import BudgetRefusal as BudgetRefusal
from .refusal import RecallBudgetExceeded as RecallBudgetExceeded
from .refusal import RefusalReason as RefusalReason
from .rounds import Round as Round
from .sqlite_ledger import SqliteLedger as SqliteLedger

if TYPE_CHECKING:
    from .postgres_ledger import PostgresLedger as PostgresLedger

__all__ = [
    "AllowancePolicy", "Attempt", "AttemptKind", "AttemptOutcome", "AttemptTrace",
    "BoundedRecallNotice", "BudgetRefusal", "Checkpoint", "Clock", "Ledger", "ManualClock",
    "Permit", "PermitHolder", "PostgresLedger", "RecallAllowance", "RecallBudgetExceeded",
    "RefusalReason", "RefusalRecord", "Reservation", "Round", "RoundKind", "SqliteLedger",
    "SyncAttempt", "SystemClock", "Usage", "Validity", "WallTime", "bind_permits", "current_permit",
    "hide_permit",
    "validate_run_id",
]


def __getattr__(name: str) -> Any:
    # PostgresLedger needs the `postgres` extra (psycopg): imported on first use only, so that
    # importing this package never imports psycopg.
    if name == "PostgresLedger":
        try:
            from .postgres_ledger import PostgresLedger
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] not in ("psycopg", "psycopg_pool"):
                raise
            raise ImportError(
                "PostgresLedger needs the 'postgres' extra: pip install 'recallbound[postgres]'"
            ) from exc
        return PostgresLedger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
