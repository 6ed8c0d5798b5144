"""Module-level factories for the worker lifecycle tests (a worker imports them by name)."""

from __future__ import annotations

import os
import time

from plugin import Evidence, SearchRequest, SimpleRetriever


async def slow_search(request: SearchRequest) -> list[Evidence]:
    """Write this worker's pid where ``RB_PIDFILE`` says, then answer a second later."""
    with open(os.environ["RB_PIDFILE"], "w") as out:
        out.write(str(os.getpid()))
    time.sleep(1.0)
    return [Evidence(id="m-slow", text="slow")]


def slow() -> SimpleRetriever:
    return SimpleRetriever(slow_search)
