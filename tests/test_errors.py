"""One error tree: one root, a few classes by cause, builtins for misuse, old names kept."""

from __future__ import annotations

import sqlite3

import pytest

import plugin
import plugin.errors as errors
from plugin.memory.store import errors as store_errors
from runtime_hooks import config

CAUSES = {
    "LedgerPathError": errors.StorageUnavailableError,
    "LedgerUnavailableError": errors.StorageUnavailableError,
    "LedgerLockedError": errors.StorageLockedError,
    "LedgerFullError": errors.StorageFullError,
    "LedgerCorruptError": errors.StorageCorruptError,
    "LedgerClosedError": errors.StorageClosedError,
}
STORE_CAUSES = {
    "MemoryStorePathError": errors.StorageUnavailableError,
    "MemoryStoreLockedError": errors.StorageLockedError,
    "MemoryStoreFullError": errors.StorageFullError,
    "MemoryStoreCorruptError": errors.StorageCorruptError,
    "MemoryStoreClosedError": errors.StorageClosedError,
}
VALUE_ALIASES = ("InvalidPolicyError", "InvalidRunIdError", "InvalidLedgerOptionError",
                 "InvalidRoundError", "InvalidWorkingStateError", "InvalidHookArgumentError")
TYPE_ALIASES = ("InvalidRoundTypeError", "InvalidWorkingStateTypeError",
                "InvalidHookArgumentTypeError", "InvalidToolCallError")

# SQLite's result codes (the sqlite3 module names them from Python 3.11 on).
SQLITE_BUSY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB = 5, 10, 13, 14, 26


def test_one_root() -> None:
    for name in dir(errors):
        value = getattr(errors, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, errors.RecallboundError), name


@pytest.mark.parametrize(("module", "family", "other", "name", "cause"), [
    *((errors, errors.LedgerError, errors.MemoryStoreError, name, cause)
      for name, cause in CAUSES.items()),
    *((store_errors, errors.MemoryStoreError, errors.LedgerError, name, cause)
      for name, cause in STORE_CAUSES.items()),
])
def test_storage_errors_are_by_cause_then_by_store(
    module: object, family: type[Exception], other: type[Exception], name: str,
    cause: type[Exception],
) -> None:
    cls = getattr(module, name)
    assert issubclass(cls, cause) and issubclass(cls, family) and not issubclass(cls, other)
    assert getattr(plugin, name, cls) is cls  # the same class where plugin exports it


def test_path_errors_stay_file_not_found_errors() -> None:
    assert issubclass(errors.LedgerPathError, FileNotFoundError)
    assert issubclass(store_errors.MemoryStorePathError, FileNotFoundError)


@pytest.mark.parametrize(("message", "cause"), [
    ("database is locked", errors.StorageLockedError),
    ("database or disk is full", errors.StorageFullError),
    ("file is not a database", errors.StorageCorruptError),
])
def test_the_store_translates_a_full_disk_by_cause(message: str,
                                                   cause: type[Exception]) -> None:
    code = {"database is locked": SQLITE_BUSY, "database or disk is full":
            SQLITE_FULL, "file is not a database": SQLITE_NOTADB}[message]
    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    translated = store_errors.translate(exc, path="m.db", timeout=1.0)
    assert isinstance(translated, cause) and isinstance(translated, errors.MemoryStoreError)


@pytest.mark.parametrize(("code", "message", "cause"), [
    (SQLITE_BUSY, "database is locked", errors.StorageLockedError),
    (SQLITE_FULL, "database or disk is full", errors.StorageFullError),
    (SQLITE_NOTADB, "file is not a database", errors.StorageCorruptError),
    (SQLITE_CANTOPEN, "unable to open database file", errors.StorageUnavailableError),
    (SQLITE_IOERR, "disk I/O error", errors.StorageError),
])
def test_the_ledger_and_the_store_translate_a_driver_error_alike(
    code: int, message: str, cause: type[Exception]
) -> None:
    from plugin.control.sqlite_ledger import _translate as ledger_translate

    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    ledger = ledger_translate(exc, "l.db")
    store = store_errors.translate(exc, path="m.db", timeout=1.0)
    assert isinstance(ledger, cause) and isinstance(ledger, errors.LedgerError)
    assert isinstance(store, cause) and isinstance(store, errors.MemoryStoreError)
    assert str(ledger).replace("ledger 'l.db'", "X") == str(store).replace(
        "memory store 'm.db'", "X").replace("1.0s", "its busy timeout")


def test_config_error_is_one_class() -> None:
    assert errors.InvalidConfigError is errors.ConfigError is config.ConfigError
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.InvalidConfigTypeError, errors.ConfigError)
    assert issubclass(errors.InvalidConfigTypeError, TypeError)
    assert issubclass(errors.LedgerConfigError, errors.ConfigError)
    assert issubclass(errors.LedgerConfigError, errors.LedgerError)  # as before


@pytest.mark.parametrize("name", VALUE_ALIASES)
def test_value_misuse_classes_are_one(name: str) -> None:
    assert getattr(errors, name) is errors.InvalidArgumentError
    assert issubclass(errors.InvalidArgumentError, ValueError)


@pytest.mark.parametrize("name", TYPE_ALIASES)
def test_type_misuse_classes_are_one(name: str) -> None:
    assert getattr(errors, name) is errors.InvalidArgumentTypeError
    assert issubclass(errors.InvalidArgumentTypeError, TypeError)


def test_the_clock_error_is_a_value_misuse() -> None:
    assert issubclass(errors.ClockReadingError, errors.InvalidArgumentError)


def test_every_name_plugin_exported_still_imports() -> None:
    for name in plugin.__all__:
        assert getattr(plugin, name) is not None, name
