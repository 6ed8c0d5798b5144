"""Project-wide test settings.

Every async test runs on asyncio and trio: ``anyio_backend`` below is the default (real time,
since the SQLite drivers use worker threads); modules with no worker thread override it with
``_loops.VIRTUAL_TIME_LOOPS`` (trio's MockClock). pytest-trio's ``trio_mode`` stays off.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import HealthCheck, settings

from plugin import ManualClock

from ._loops import LOOPS
from ._pg import pgbouncer_state

CLOCK_WALL = 1_800_000_000.0
"""Where the shared ``clock`` fixture's wall clock starts."""

# pydantic-ai 2.x and LangChain 1.x need Python 3.11 or newer: on 3.10 their extras cannot be
# installed (the `test` extra leaves them out there), so their adapters have nothing to test.
# The LangGraph store and LlamaIndex backends install on 3.10 and are tested there.
# CI and every newer interpreter collect these modules; nothing is skipped where the framework
# exists.
collect_ignore = (
    ["test_adapter_pydantic_ai.py", "test_adapter_langchain.py",
     "test_adapter_options.py", "test_pydantic_ai_invocations.py",
     "test_framework_unreadable_arguments.py",
     "test_pydantic_ai_delegation.py", "test_langgraph_subgraphs.py",
     "test_langgraph_invocations_evicted.py", "test_langchain_hitl_order.py",
     "test_stream_cancel_pydantic_ai.py", "test_stream_cancel_openai_agents.py",
     "test_stream_cancel_langchain.py"]
    if sys.version_info < (3, 11) else []
)


PROCESS_MODULES = frozenset({"test_mcp_transports.py", "test_evaluate_command.py",
                             "test_docs_examples.py"})
"""Modules whose tests start real server or command processes: marked ``slow`` as a whole."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that talks to PostgreSQL (its module or a parameter names it), so that
    ``-m "not postgres"`` runs without a server; mark the real-process modules ``slow``."""
    for item in items:
        if "postgres" in item.nodeid.lower() or "_pg" in getattr(item.module, "__dict__", {}):
            item.add_marker(pytest.mark.postgres)
        if item.path.name in PROCESS_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A failing test that went through PgBouncer carries PgBouncer's own account of its pools
    and the end of its log, so a failure seen once on CI can be read afterwards."""
    report = yield
    if report.failed and "pgbouncer" in item.nodeid:
        state = pgbouncer_state()
        if state is not None:
            report.sections.append(("pgbouncer state", state))
    return report


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


@pytest.fixture
def clock() -> ManualClock:
    """A fresh virtual clock: wall time at ``CLOCK_WALL``, monotonic at 10 s. A module that
    needs other start values defines its own ``clock``."""
    return ManualClock(wall=CLOCK_WALL, monotonic=10.0)


# Property tests check invariants, not speed: a loaded 2-core CI machine must not fail them
# on hypothesis' per-example deadline.
settings.register_profile(
    "recallbound", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("recallbound")
