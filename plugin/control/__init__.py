"""The control primitive: clock, policy, permit, refusals, ledger, allowance.

Imports only the standard library, attrs, anyio (and the SQLite drivers); never memory, hooks,
a framework, or an ambient clock.
"""

from .allowance import Checkpoint as Checkpoint
from .allowance import RecallAllowance as RecallAllowance
from .allowance import Round as Round
from .allowance import validate_run_id as validate_run_id
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
from .permit import Attempt as Attempt
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
from .sqlite_ledger import SqliteLedger as SqliteLedger

__all__ = [
    "AllowancePolicy", "Attempt", "AttemptKind", "AttemptOutcome", "AttemptTrace",
    "BoundedRecallNotice", "BudgetRefusal", "Checkpoint", "Clock", "Ledger", "ManualClock",
    "Permit", "PermitHolder", "RecallAllowance", "RecallBudgetExceeded", "RefusalReason",
    "RefusalRecord", "Reservation", "Round", "RoundKind", "SqliteLedger", "SystemClock",
    "Usage", "Validity", "WallTime", "bind_permits", "current_permit", "hide_permit",
    "validate_run_id",
]
