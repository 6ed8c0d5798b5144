"""The anyio backends tests run on."""

from __future__ import annotations

import pytest
import trio.testing

LOOPS = [pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")]
"""Both loops on real time: for tests that use worker threads (the SQLite drivers)."""

VIRTUAL_TIME_LOOPS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param(("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}), id="trio"),
]
"""Both loops, trio on an autojumping MockClock: for tests with no worker thread."""
