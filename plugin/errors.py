"""The package's exception tree: one root, each class named by its cause.

Refusals are data (:class:`~plugin.control.refusal.BudgetRefusal`); the exceptions here are
failures. Shaped as trio and anyio shape theirs: one misuse pair for every programming error,
and a class for each way the world can fail::

    RecallboundError
    ├── InvalidArgumentError (ValueError)        misuse: a value out of range (named), an
    │                                            injected clock's bad reading, a retriever
    │                                            misusing its handle
    ├── InvalidArgumentTypeError (TypeError)     misuse: a value of the wrong type (named), a
    │                                            permit or handle copied or pickled
    ├── RoundReusedError (RuntimeError)          a round entered twice
    ├── ConfigError (ValueError)                 a setting is missing, unknown or bad
    │   └── InvalidConfigTypeError (TypeError)   a RecallConfig field of the wrong type
    ├── RunIdentityError (ValueError)            a run id used with another principal or scope
    │   └── RunIdentityTypeError (TypeError)     the host handed no usable run identity
    ├── LedgerError                              the durable ledger failed: no permit issued
    │   ├── LedgerUnavailableError               cannot be reached, or lost mid-operation
    │   │   └── LedgerPathError (FileNotFoundError)  its folder or file does not exist
    │   ├── LedgerLockedError                    locked by another connection too long
    │   ├── LedgerFullError                      the disk (or page limit) is full
    │   ├── LedgerCorruptError                   not a recallbound ledger, or damaged
    │   ├── LedgerClosedError (RuntimeError)     used outside its ``async with`` block
    │   └── LedgerConfigError (+ ConfigError)    a ledger option (DSN, schema, pool size)
    ├── MemoryStoreError                         the reference memory store failed (its
    │                                            causes: :mod:`plugin.memory.store.errors`)
    ├── RetrieverProtocolError (TypeError)       an object is not a retriever (method named)
    └── RetrieverFailedError                     a retriever call failed (``reason``)

Elsewhere, by the code that raises them: ``RecallBudgetExceeded`` (budget exceeded, carrying
its refusal; :mod:`plugin.control.refusal`), ``InvalidSearchCallError`` (an invalid search
call; :mod:`runtime_hooks.calls`), the MCP server's errors (:mod:`runtime_hooks.mcp.errors`),
the evaluator's (:mod:`plugin.evaluation.errors`, ``InvalidScenarioError``).

The names this tree had before (the per-function aliases of the misuse pair, the ``Storage*``
cause classes, ``ClockReadingError``, ``PermitMisuseError``, ``AttemptHandleError``, the MCP
and evaluation errors) still import from here for one release, with a
:class:`DeprecationWarning` naming what to use instead; each still matches (``except``,
``isinstance``) what is raised in its place.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


class RecallboundError(Exception):
    """Root of every error raised by recallbound."""


# -- programming misuse ----------------------------------------------------------------------------


class InvalidArgumentError(RecallboundError, ValueError):
    """An argument's value is out of range, or an object is used in a way it does not allow
    (the message names the argument or the object)."""


class InvalidArgumentTypeError(RecallboundError, TypeError):
    """An argument has the wrong type, or an object that must stay one was copied or pickled
    (the message names it)."""


class RoundReusedError(RecallboundError, RuntimeError):
    """A round (``allowance.round(...)``) or an attempt (``permit.attempt()``) was entered a
    second time, or by a second task."""


# -- configuration -------------------------------------------------------------------------------


class ConfigError(RecallboundError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range.

    The message names the setting and where its value came from (a file and key, an
    environment variable, an argument, or ``RecallConfig.<field>`` in code).
    """


class InvalidConfigTypeError(ConfigError, TypeError):
    """A :class:`~runtime_hooks.bootstrap.RecallConfig` field has a wrong type (named)."""


# -- runs ------------------------------------------------------------------------------------------


class RunIdentityError(RecallboundError, ValueError):
    """A run id was used with another principal or scope than the ones it is bound to.

    A run is bound durably, in the ledger, to the principal and scope of its first use; every
    worker and process sees that binding, so the mismatch is raised wherever it happens.
    """


class RunIdentityTypeError(RunIdentityError, TypeError):
    """A run's identity was handed over as the wrong type (not the adapter's identity value)."""


# -- the ledger ------------------------------------------------------------------------------------


class LedgerError(RecallboundError):
    """The durable ledger failed; no permit was issued for the work that needed it."""


class LedgerUnavailableError(LedgerError):
    """The ledger's database could not be reached, or was lost mid-operation (a restart).

    Raised instead of a result: a reservation that fails this way issues no permit, and may or
    may not have been committed (slots are never refunded, so a retry only costs a round).
    """


class LedgerPathError(LedgerUnavailableError, FileNotFoundError):
    """The ledger's folder does not exist or the file cannot be opened (or, opened for an
    operator's tool, the file or the PostgreSQL schema does not exist yet)."""


class LedgerLockedError(LedgerError):
    """The ledger stayed locked by another connection beyond the busy timeout."""


class LedgerFullError(LedgerError):
    """The ledger's disk (or its page limit) is full: nothing was committed."""


class LedgerCorruptError(LedgerError):
    """The ledger file is not a recallbound ledger, or its pages are damaged."""


class LedgerClosedError(LedgerError, RuntimeError):
    """The ledger was used outside its ``async with`` block."""


class LedgerConfigError(LedgerError, ConfigError):
    """A ledger was configured with an invalid value (schema name, time source, pool size)."""


# -- the memory store ------------------------------------------------------------------------------


class MemoryStoreError(RecallboundError):
    """The reference memory store failed (:mod:`plugin.memory.store.errors` says how)."""


# -- retrievers ------------------------------------------------------------------------------------


class RetrieverProtocolError(RecallboundError, TypeError):
    """An object given as a retriever does not implement the protocol: a method is missing,
    or one the hooks await is not ``async def`` (the method is named)."""


class RetrieverFailedError(RecallboundError):
    """A retriever call failed; ``reason`` says how, and nothing of the retriever's own text
    is kept (its exception may be hostile). Never a budget refusal.

    ``reason``: ``raised`` (it raised, whatever it raised), ``bad_result`` (its return value is
    not what the protocol asks), ``bad_evidence`` (an item is not a well-formed Evidence),
    ``cannot_reread`` (a re-read of retained evidence by a retriever that has no way to read an
    item by id, such as a :class:`~plugin.SimpleRetriever` without ``get``), ``deadline`` (a
    read with a time bound of its own, corrections or a re-read, ran out of time).
    """

    REASONS = ("raised", "bad_result", "bad_evidence", "cannot_reread", "deadline")

    def __init__(self, reason: str) -> None:
        if reason not in self.REASONS:
            reason = "raised"
        super().__init__(f"the retriever failed ({reason})")
        self.reason = reason

    def __reduce__(self) -> tuple[type[RetrieverFailedError], tuple[str]]:
        return (type(self), (self.reason,))


# -- names kept for one release --------------------------------------------------------------------

_VALUE = "InvalidArgumentError"
_TYPE = "InvalidArgumentTypeError"
_STORE = "plugin.memory.store.errors"

DEPRECATED: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {
    # old name: ((module, class) it now is, or the classes it matches), what to use instead
    "InvalidConfigError": ((("plugin.errors", "ConfigError"),), "ConfigError"),
    **dict.fromkeys(
        ("InvalidPolicyError", "InvalidRunIdError", "InvalidLedgerOptionError",
         "InvalidRoundError", "InvalidWorkingStateError", "InvalidHookArgumentError",
         "ClockReadingError"),
        ((("plugin.errors", _VALUE),), _VALUE),
    ),
    **dict.fromkeys(
        ("InvalidRoundTypeError", "InvalidWorkingStateTypeError", "InvalidHookArgumentTypeError",
         "InvalidToolCallError", "PermitMisuseError"),
        ((("plugin.errors", _TYPE),), _TYPE),
    ),
    "AttemptHandleError": ((("plugin.errors", _VALUE), ("plugin.errors", _TYPE)),
                           f"{_VALUE} (or {_TYPE} for a copy)"),
    "StorageError": ((("plugin.errors", "LedgerError"), (_STORE, "MemoryStoreError")),
                     "LedgerError or MemoryStoreError"),
    "StorageUnavailableError": ((("plugin.errors", "LedgerUnavailableError"),
                                 (_STORE, "MemoryStorePathError")),
                                "LedgerUnavailableError or MemoryStorePathError"),
    "StorageLockedError": ((("plugin.errors", "LedgerLockedError"),
                            (_STORE, "MemoryStoreLockedError")),
                           "LedgerLockedError or MemoryStoreLockedError"),
    "StorageFullError": ((("plugin.errors", "LedgerFullError"), (_STORE, "MemoryStoreFullError")),
                         "LedgerFullError or MemoryStoreFullError"),
    "StorageCorruptError": ((("plugin.errors", "LedgerCorruptError"),
                             (_STORE, "MemoryStoreCorruptError")),
                            "LedgerCorruptError or MemoryStoreCorruptError"),
    "StorageClosedError": ((("plugin.errors", "LedgerClosedError"),
                            (_STORE, "MemoryStoreClosedError")),
                           "LedgerClosedError or MemoryStoreClosedError"),
    "McpAuthError": ((("runtime_hooks.mcp.errors", "McpAuthError"),),
                     "runtime_hooks.mcp.errors.McpAuthError"),
    "McpSessionError": ((("runtime_hooks.mcp.errors", "McpSessionError"),),
                        "runtime_hooks.mcp.errors.McpSessionError"),
    "EvaluationError": ((("plugin.evaluation.errors", "EvaluationError"),),
                        "plugin.evaluation.errors.EvaluationError"),
}
"""Old names: what each is now (one class, or a tuple of the classes raised in its place,
which ``except`` and ``isinstance`` accept), and what to write instead."""


def __getattr__(name: str) -> Any:
    entry = DEPRECATED.get(name)
    if entry is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    targets, instead = entry
    warnings.warn(f"plugin.errors.{name} is deprecated: use {instead}", DeprecationWarning,
                  stacklevel=2)
    found = tuple(getattr(importlib.import_module(module), cls) for module, cls in targets)
    return found[0] if len(found) == 1 else found
