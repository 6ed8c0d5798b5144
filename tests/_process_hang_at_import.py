"""A factory module that hangs when a worker imports it (a stuck import in user code)."""

from __future__ import annotations

import os
import time

from plugin import Evidence, SearchRequest, SimpleRetriever

if os.environ.get("RB_HANG_AT_IMPORT"):
    time.sleep(3600)


async def _search(request: SearchRequest) -> list[Evidence]:
    return []


def factory() -> SimpleRetriever:
    return SimpleRetriever(_search)
