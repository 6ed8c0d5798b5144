"""What the packages export, in the manner of trio's ``_tests/test_exports.py``.

Every name in ``__all__`` is importable, public and documented; the surface is the small one
a user writes against (the names the public API promises among it); the memory layer stays out of
``import plugin.control``; every other module keeps what it names in its own ``__all__``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings
from types import ModuleType
from typing import get_origin

import pytest

import plugin
import plugin.control
import plugin.memory
import runtime_hooks

PUBLIC_PACKAGES = [plugin, plugin.control, plugin.memory, runtime_hooks]

PROMISED_NAMES = {
    "AllowancePolicy", "RoundKind", "Clock", "SystemClock", "ManualClock", "SqliteLedger",
    "RecallAllowance", "Permit", "AttemptKind", "current_permit", "BudgetRefusal",
    "RefusalReason", "RecallBudgetExceeded", "BoundedRecallNotice", "WorkingState", "Task",
    "Fact", "QueryPlanner", "QueryStrategy", "RecallQuery", "compose_baseline",
    "compose_task_context", "SimpleRetriever", "Evidence", "ProcessRetriever",
    "PostgresLedger", "RunIdentityError", "RecallboundError",
}


@pytest.mark.parametrize("package", PUBLIC_PACKAGES, ids=lambda m: m.__name__)
def test_every_exported_name_imports_and_is_public(package: ModuleType) -> None:
    assert len(package.__all__) == len(set(package.__all__)), "a name listed twice"
    for name in package.__all__:
        assert not name.startswith("_"), name
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an exported name never warns
            value = getattr(package, name)
        assert value is not None, name


@pytest.mark.parametrize("package", PUBLIC_PACKAGES, ids=lambda m: m.__name__)
def test_every_exported_class_and_function_is_documented(package: ModuleType) -> None:
    for name in package.__all__:
        value = getattr(package, name)
        # A generic alias (``Checkpoint = Callable[...]``) is no class, though Python 3.10's
        # inspect.isclass says it is.
        if (inspect.isclass(value) and get_origin(value) is None) or inspect.isfunction(value):
            assert inspect.getdoc(value), f"{package.__name__}.{name} has no docstring"


def test_the_top_level_surface_is_small_and_keeps_the_design_names() -> None:
    assert set(plugin.__all__) >= PROMISED_NAMES
    assert len(plugin.__all__) <= 60
    # Preparation internals are reachable from their module, not exported at the top.
    for name in ("PreparationBound", "RecallPreparer", "SemanticPreparation", "WithheldReason",
                 "BaselineReason", "compose_search_call", "Reservation", "AttemptTrace"):
        assert name not in plugin.__all__, name
        home = plugin.memory if hasattr(plugin.memory, name) else plugin.control
        assert getattr(home, name) is not None


def test_runtime_hooks_exports_what_the_readme_imports() -> None:
    from runtime_hooks.bootstrap import RecallConfig, open_hooks

    assert runtime_hooks.RecallConfig is RecallConfig
    assert runtime_hooks.open_hooks is open_hooks
    assert {"RecallConfig", "RecallHooks", "open_hooks"} <= set(runtime_hooks.__all__)


@pytest.mark.parametrize("name", ["WithheldReason", "PreparationBound", "AttemptTrace"])
def test_a_name_that_left_the_surface_still_imports_with_a_warning(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=name):
        value = getattr(plugin, name)
    assert value is not None


def test_a_module_all_names_only_what_it_has() -> None:
    for package in (plugin, runtime_hooks):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith(("__main__", "_process_worker")):
                continue
            try:
                module = importlib.import_module(info.name)
            except ImportError:  # an optional extra's adapter (a framework not installed)
                continue
            for name in getattr(module, "__all__", ()):
                assert hasattr(module, name), f"{info.name}.__all__ names missing {name}"


def test_unknown_names_are_attribute_errors() -> None:
    with pytest.raises(AttributeError):
        plugin.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
