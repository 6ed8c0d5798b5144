"""The package's exception tree: one root, a few classes named by cause.

Refusals are data (:class:`~plugin.control.refusal.BudgetRefusal`); the exceptions here are
failures. Shaped as trio and anyio shape theirs::

    RecallboundError
    ├── ConfigError (ValueError)                 a setting is missing, unknown or bad
    │   ├── InvalidConfigTypeError (TypeError)   a RecallConfig field of the wrong type
    │   └── LedgerConfigError (+ LedgerError)    a ledger option (DSN schema, pool size)
    ├── StorageError                             the ledger or the memory store failed
    │   ├── StorageUnavailableError              cannot be opened or reached (a path, a server)
    │   ├── StorageLockedError                   locked by another connection too long
    │   ├── StorageFullError                     the disk (or page limit) is full
    │   ├── StorageCorruptError                  not a recallbound database, or damaged
    │   └── StorageClosedError (RuntimeError)    used outside its ``async with`` block
    ├── InvalidArgumentError (ValueError)        programming misuse: a value out of range
    │   └── ClockReadingError                    an injected clock read inf, nan or a non-number
    ├── InvalidArgumentTypeError (TypeError)     programming misuse: a value of the wrong type
    ├── RoundReusedError (RuntimeError)          a round entered twice
    └── AttemptHandleError (RuntimeError)        a retriever misused its attempt handle

Elsewhere, by the code that raises them: ``RecallBudgetExceeded`` (budget exceeded, carrying
its refusal; :mod:`plugin.control.refusal`), ``InvalidSearchCallError`` (an invalid search
call; :mod:`runtime_hooks.hooks`), ``InvalidScenarioError`` (a scenario file;
:mod:`plugin.evaluation.scenarios`).

Which store failed is a subclass of the cause: ``LedgerLockedError`` is a
:class:`StorageLockedError` and a :class:`LedgerError`, ``MemoryStoreLockedError`` a
:class:`StorageLockedError` and a :class:`MemoryStoreError`. Catch the cause to handle both,
the family to handle one store. Every older name keeps working: the classes that were split by
the function that received the bad value are aliases of the two misuse classes.
"""

from __future__ import annotations


class RecallboundError(Exception):
    """Root of every error raised by recallbound."""


# -- configuration -------------------------------------------------------------------------------


class ConfigError(RecallboundError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range.

    The message names the setting and where its value came from (a file and key, an
    environment variable, an argument, or ``RecallConfig.<field>`` in code).
    """


InvalidConfigError = ConfigError
"""The same class: a :class:`~runtime_hooks.bootstrap.RecallConfig` field has a bad value."""


class InvalidConfigTypeError(ConfigError, TypeError):
    """A :class:`~runtime_hooks.bootstrap.RecallConfig` field has a wrong type (named)."""


# -- programming misuse ----------------------------------------------------------------------------


class InvalidArgumentError(RecallboundError, ValueError):
    """An argument's value is out of range (the message names the argument)."""


class InvalidArgumentTypeError(RecallboundError, TypeError):
    """An argument has the wrong type (the message names the argument)."""


class ClockReadingError(InvalidArgumentError):
    """An injected clock returned a reading that is not a finite number of seconds."""


InvalidPolicyError = InvalidArgumentError
"""An :class:`~plugin.control.policy.AllowancePolicy` value is out of range."""
InvalidRunIdError = InvalidArgumentError
"""A run id is empty, not a string, or too long to store."""
InvalidLedgerOptionError = InvalidArgumentError
"""A ledger was configured with an invalid option (a timeout, say)."""
InvalidRoundError = InvalidArgumentError
"""A round was asked for with invalid arguments (slots, kind)."""
InvalidWorkingStateError = InvalidArgumentError
"""Working state handed to the planner is malformed (the message names the field)."""
InvalidHookArgumentError = InvalidArgumentError
"""A trusted argument handed to the hooks (scope, principal, ...) has a bad value."""

InvalidRoundTypeError = InvalidArgumentTypeError
"""A round or allowance argument has the wrong type."""
InvalidWorkingStateTypeError = InvalidArgumentTypeError
"""Working state handed to the planner has a field of the wrong type."""
InvalidHookArgumentTypeError = InvalidArgumentTypeError
"""A trusted argument handed to the hooks (scope, principal, state, ...) has a wrong type."""
InvalidToolCallError = InvalidArgumentTypeError
"""A :class:`~runtime_hooks.hooks.ToolCall` was built with a field of the wrong type."""


class PermitMisuseError(InvalidArgumentTypeError):
    """A permit was copied, pickled, rebuilt or modified: it is one object, issued once."""


class RoundReusedError(RecallboundError, RuntimeError):
    """A round (``allowance.round(...)``) was entered a second time, or by a second task."""


class AttemptHandleError(RecallboundError, RuntimeError):
    """A retriever used its attempt handle for something the attempt does not offer."""


# -- storage: by cause, then by store --------------------------------------------------------------


class StorageError(RecallboundError):
    """The ledger or the memory store failed; nothing was issued for the work that needed it."""


class StorageUnavailableError(StorageError):
    """The database cannot be opened or reached, or was lost mid-operation."""


class StorageLockedError(StorageError):
    """The database stayed locked by another connection beyond the busy timeout."""


class StorageFullError(StorageError):
    """The disk (or the page limit) is full: nothing was committed."""


class StorageCorruptError(StorageError):
    """The file is not a recallbound database, or its pages (or its schema) are damaged."""


class StorageClosedError(StorageError, RuntimeError):
    """The ledger or the store was used outside its ``async with`` block."""


class LedgerError(StorageError):
    """The durable ledger failed; no permit was issued for the work that needed it."""


class LedgerPathError(LedgerError, StorageUnavailableError, FileNotFoundError):
    """The ledger's folder does not exist or the file cannot be opened (or, opened for an
    operator's tool, the file or the PostgreSQL schema does not exist yet)."""


class LedgerUnavailableError(LedgerError, StorageUnavailableError):
    """The ledger's database could not be reached, or was lost mid-operation (a restart).

    Raised instead of a result: a reservation that fails this way issues no permit, and may or
    may not have been committed (slots are never refunded, so a retry only costs a round).
    """


class LedgerLockedError(LedgerError, StorageLockedError):
    """The ledger stayed locked by another connection beyond the busy timeout."""


class LedgerFullError(LedgerError, StorageFullError):
    """The ledger's disk (or its page limit) is full: nothing was committed."""


class LedgerCorruptError(LedgerError, StorageCorruptError):
    """The ledger file is not a recallbound ledger, or its pages are damaged."""


class LedgerClosedError(LedgerError, StorageClosedError):
    """The ledger was used outside its ``async with`` block."""


class LedgerConfigError(LedgerError, ConfigError):
    """A ledger was configured with an invalid value (schema name, time source, pool size)."""


class MemoryStoreError(StorageError):
    """The reference memory store failed."""


# The memory store's cause classes live in plugin.memory.store.errors, beside its translator.


# --- retriever


class RetrieverProtocolError(RecallboundError, TypeError):
    """An object given as a retriever does not implement the protocol: a method is missing,
    or one the hooks await is not ``async def`` (the method is named)."""


class RetrieverFailedError(RecallboundError):
    """A retriever call failed; ``reason`` says how, and nothing of the retriever's own text
    is kept (its exception may be hostile). Never a budget refusal.

    ``reason``: ``raised`` (it raised, whatever it raised), ``bad_result`` (its return value is
    not what the protocol asks), ``bad_evidence`` (an item is not a well-formed Evidence).
    """

    REASONS = ("raised", "bad_result", "bad_evidence")

    def __init__(self, reason: str) -> None:
        if reason not in self.REASONS:
            reason = "raised"
        super().__init__(f"the retriever failed ({reason})")
        self.reason = reason

    def __reduce__(self) -> tuple[type[RetrieverFailedError], tuple[str]]:
        return (type(self), (self.reason,))


# --- mcp
class McpAuthError(RecallboundError, ValueError):
    """The MCP server's caller cannot be trusted: no valid token, or a bad token table."""


class McpSessionError(RecallboundError, ValueError):
    """An MCP request names no run and comes over a transport with no client session."""


# --- ranking


class EvaluationError(RecallboundError):
    """``recallbound evaluate`` cannot run as asked: its semantic model is not installed, or
    the rankings differ between two processes (the determinism check)."""


# --- turns: the one RunIdentityError


class RunIdentityError(RecallboundError, ValueError):
    """A run id was used with another principal or scope than the ones it is bound to.

    A run is bound durably, in the ledger, to the principal and scope of its first use; every
    worker and process sees that binding, so the mismatch is raised wherever it happens.
    """


class RunIdentityTypeError(RunIdentityError, TypeError):
    """A run's identity was handed over as the wrong type (not the adapter's identity value)."""
