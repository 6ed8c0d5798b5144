"""The package's exception hierarchy: one root, one subclass per cause.

Refusals are data (:class:`~plugin.control.refusal.BudgetRefusal`); the exceptions here are
failures. ``RecallBudgetExceeded`` carries a refusal so that code which cannot return a value
(a permit's ``attempt``) still hands the caller the typed reason.
"""

from __future__ import annotations


class RecallboundError(Exception):
    """Root of every error raised by recallbound."""


class InvalidArgumentError(RecallboundError, ValueError):
    """An argument's value is out of range (the message names the argument)."""


class InvalidArgumentTypeError(RecallboundError, TypeError):
    """An argument has the wrong type (the message names the argument)."""


class InvalidPolicyError(InvalidArgumentError):
    """An :class:`~plugin.control.policy.AllowancePolicy` value is out of range."""


class InvalidRunIdError(InvalidArgumentError):
    """A run id is empty, not a string, or too long to store."""


class LedgerError(RecallboundError):
    """The durable ledger failed; no permit was issued for the work that needed it."""


class LedgerPathError(LedgerError, FileNotFoundError):
    """The ledger's folder does not exist or the file cannot be opened (or, opened for an
    operator's tool, the file or the PostgreSQL schema does not exist yet)."""


class LedgerLockedError(LedgerError):
    """The ledger stayed locked by another connection beyond the busy timeout."""


class LedgerCorruptError(LedgerError):
    """The ledger file is not a recallbound ledger, or its pages are damaged."""


class LedgerFullError(LedgerError):
    """The ledger's disk (or its page limit) is full: nothing was committed."""


class InvalidLedgerOptionError(InvalidArgumentError):
    """A ledger was configured with an invalid option (a timeout, say)."""


class InvalidRoundError(InvalidArgumentError):
    """A round was asked for with invalid arguments (slots, kind)."""


class InvalidRoundTypeError(InvalidArgumentTypeError):
    """A round or allowance argument has the wrong type."""


class LedgerClosedError(LedgerError):
    """The ledger was used outside its ``async with`` block."""


class LedgerUnavailableError(LedgerError):
    """The ledger's database could not be reached, or was lost mid-operation (a restart).

    Raised instead of a result: a reservation that fails this way issues no permit, and may or
    may not have been committed (slots are never refunded, so a retry only costs a round).
    """


class LedgerConfigError(LedgerError, ValueError):
    """A ledger was configured with an invalid value (schema name, time source, pool size)."""


class InvalidWorkingStateError(RecallboundError, ValueError):
    """Working state handed to the planner is malformed (the message names the field)."""


class InvalidWorkingStateTypeError(RecallboundError, TypeError):
    """Working state handed to the planner has a field of the wrong type."""


class MemoryStoreError(RecallboundError):
    """The reference memory store failed."""


class RoundReusedError(RecallboundError, RuntimeError):
    """A round (``allowance.round(...)``) was entered a second time, or by a second task."""


class PermitMisuseError(InvalidArgumentTypeError):
    """A permit was copied, pickled, rebuilt or modified: it is one object, issued once."""


class InvalidHookArgumentError(RecallboundError, ValueError):
    """A trusted argument handed to the hooks (scope, principal, ...) has a bad value."""


class InvalidHookArgumentTypeError(RecallboundError, TypeError):
    """A trusted argument handed to the hooks (scope, principal, state, ...) has a wrong type."""


class InvalidToolCallError(RecallboundError, TypeError):
    """A :class:`~runtime_hooks.hooks.ToolCall` was built with a field of the wrong type."""


class InvalidConfigError(RecallboundError, ValueError):
    """A :class:`~runtime_hooks.bootstrap.RecallConfig` field has a bad value (named)."""


class InvalidConfigTypeError(RecallboundError, TypeError):
    """A :class:`~runtime_hooks.bootstrap.RecallConfig` field has a wrong type (named)."""


class AttemptHandleError(RecallboundError, RuntimeError):
    """A retriever used its attempt handle for something the attempt does not offer."""


# --- turns


class RunIdentityError(RecallboundError, ValueError):
    """A run id was used with another principal or scope than the ones it is bound to.

    A run is bound durably, in the ledger, to the principal and scope of its first use; every
    worker and process sees that binding, so the mismatch is raised wherever it happens.
    """


class RunIdentityTypeError(RunIdentityError, TypeError):
    """A run's identity was handed over as the wrong type (not the adapter's identity value)."""
