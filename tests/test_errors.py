"""One error tree: one root, each class named by its cause, one misuse pair; old names kept
for one release with a DeprecationWarning, each still matching what is raised in its place."""

from __future__ import annotations

import copy
import sqlite3
import warnings
from pathlib import Path

import pytest

import plugin
import plugin.errors as errors
from plugin import AllowancePolicy, ManualClock, RecallAllowance, RoundKind
from plugin.memory.store import errors as store_errors

from ._fakes import MemoryLedger

pytestmark = pytest.mark.anyio

LEDGER_CAUSES = ("LedgerUnavailableError", "LedgerPathError", "LedgerLockedError",
                 "LedgerFullError", "LedgerCorruptError", "LedgerClosedError",
                 "LedgerConfigError")

# SQLite's result codes (the sqlite3 module names them from Python 3.11 on).
SQLITE_BUSY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB = 5, 10, 13, 14, 26


def _classes() -> list[type[BaseException]]:
    return [value for value in vars(errors).values()
            if isinstance(value, type) and issubclass(value, BaseException)
            and value.__module__ == errors.__name__]


def test_one_root_and_a_small_tree() -> None:
    classes = _classes()
    assert all(issubclass(cls, errors.RecallboundError) for cls in classes)
    assert len(classes) <= 19


def test_the_misuse_pair_is_the_builtins() -> None:
    assert issubclass(errors.InvalidArgumentError, ValueError)
    assert issubclass(errors.InvalidArgumentTypeError, TypeError)


@pytest.mark.parametrize("name", LEDGER_CAUSES)
def test_ledger_errors_are_ledger_errors(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, errors.LedgerError) and not issubclass(cls, errors.MemoryStoreError)
    assert getattr(plugin, name) is cls


def test_path_errors_stay_file_not_found_errors() -> None:
    assert issubclass(errors.LedgerPathError, FileNotFoundError)
    assert issubclass(errors.LedgerPathError, errors.LedgerUnavailableError)
    assert issubclass(store_errors.MemoryStorePathError, FileNotFoundError)


@pytest.mark.parametrize(("code", "message", "ledger", "store"), [
    (SQLITE_BUSY, "database is locked", "LedgerLockedError", "MemoryStoreLockedError"),
    (SQLITE_FULL, "database or disk is full", "LedgerFullError", "MemoryStoreFullError"),
    (SQLITE_NOTADB, "file is not a database", "LedgerCorruptError", "MemoryStoreCorruptError"),
    (SQLITE_CANTOPEN, "unable to open database file", "LedgerPathError",
     "MemoryStorePathError"),
    (SQLITE_IOERR, "disk I/O error", "LedgerError", "MemoryStoreError"),
])
def test_the_ledger_and_the_store_translate_a_driver_error_alike(
    code: int, message: str, ledger: str, store: str
) -> None:
    from plugin.control.sqlite_ledger import _translate as ledger_translate

    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    from_ledger = ledger_translate(exc, "l.db")
    from_store = store_errors.translate(exc, path="m.db", timeout=1.0)
    assert isinstance(from_ledger, getattr(errors, ledger))
    store_class = getattr(store_errors, store, None) or getattr(errors, store)
    assert isinstance(from_store, store_class)
    assert str(from_ledger).replace("ledger 'l.db'", "X") == str(from_store).replace(
        "memory store 'm.db'", "X").replace("1.0s", "its busy timeout")


def test_a_file_that_cannot_be_opened_is_told_apart_from_a_missing_folder(
    tmp_path: Path,
) -> None:
    exc = sqlite3.OperationalError("unable to open database file")
    existing = tmp_path / "m.db"
    existing.write_bytes(b"")
    told = {str(store_errors.translate(exc, path=str(path), timeout=1.0))
            for path in (existing, tmp_path / "gone" / "m.db")}
    assert any("readable and writable by this user" in text for text in told)
    assert any("its folder does not exist" in text for text in told)


def test_config_errors() -> None:
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.InvalidConfigTypeError, errors.ConfigError)
    assert issubclass(errors.InvalidConfigTypeError, TypeError)
    assert issubclass(errors.LedgerConfigError, errors.ConfigError)
    assert issubclass(errors.LedgerConfigError, errors.LedgerError)


# -- the old names: importable for one release, warning, and matching what is raised ----------


def _old(name: str) -> object:
    with pytest.warns(DeprecationWarning, match=name):
        return getattr(errors, name)


@pytest.mark.parametrize("name", sorted(errors.DEPRECATED))
def test_every_old_name_warns_and_matches_what_replaced_it(name: str) -> None:
    old = _old(name)
    classes = old if isinstance(old, tuple) else (old,)
    assert classes and all(isinstance(c, type) and issubclass(c, errors.RecallboundError)
                           for c in classes)
    for cls in classes:  # every class raised in its place is caught by the old name
        instance = cls.__new__(cls)
        assert isinstance(instance, old)  # type: ignore[arg-type]


def test_old_names_import_from_plugin_too() -> None:
    with pytest.warns(DeprecationWarning, match="InvalidPolicyError"):
        from plugin import InvalidPolicyError  # type: ignore[attr-defined]
    assert InvalidPolicyError is errors.InvalidArgumentError


def test_an_old_value_name_catches_a_real_raise() -> None:
    with pytest.raises(_old("InvalidPolicyError")):  # type: ignore[call-overload]
        AllowancePolicy(max_searches=0)


async def test_old_names_catch_what_the_allowance_raises() -> None:
    clock = ManualClock(wall=1_800_000_000.0, monotonic=10.0)
    allowance = RecallAllowance(MemoryLedger(), clock=clock)
    with pytest.raises(_old("InvalidRoundError")):  # type: ignore[call-overload]
        allowance.round("r", RoundKind.DELIBERATE, slots=0)
    one = allowance.round("r", RoundKind.DELIBERATE, slots=1)
    async with one as permit:
        with pytest.raises(_old("PermitMisuseError")):  # type: ignore[call-overload]
            copy.copy(permit)
        with pytest.raises(errors.RoundReusedError):
            async with one:
                pass


def test_an_old_storage_cause_catches_both_stores() -> None:
    exc = sqlite3.OperationalError("database is locked")
    exc.sqlite_errorcode = SQLITE_BUSY  # type: ignore[attr-defined]
    from plugin.control.sqlite_ledger import _translate as ledger_translate

    locked = _old("StorageLockedError")
    assert isinstance(ledger_translate(exc, "l.db"), locked)  # type: ignore[arg-type]
    assert isinstance(store_errors.translate(exc, path="m.db", timeout=1.0),
                      locked)  # type: ignore[arg-type]


def test_the_mcp_and_evaluation_errors_live_with_their_packages() -> None:
    from plugin.evaluation.errors import EvaluationError
    from runtime_hooks.mcp.errors import McpAuthError, McpSessionError

    assert _old("McpAuthError") is McpAuthError
    assert _old("McpSessionError") is McpSessionError
    assert _old("EvaluationError") is EvaluationError


def test_new_names_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("InvalidArgumentError", "InvalidArgumentTypeError", "LedgerError",
                     "RunIdentityError", "RetrieverFailedError"):
            getattr(errors, name)
            getattr(plugin, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        errors.NoSuchError  # type: ignore[attr-defined]  # noqa: B018
