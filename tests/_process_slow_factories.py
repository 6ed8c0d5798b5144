"""A factory whose module takes ``RB_SLOW_IMPORT`` seconds to import in a worker."""

from __future__ import annotations

import os
import time

from plugin import Evidence, SearchRequest, SimpleRetriever

if os.environ.get("RB_SLOW_IMPORT"):
    time.sleep(float(os.environ["RB_SLOW_IMPORT"]))


async def _search(request: SearchRequest) -> list[Evidence]:
    return [Evidence(id="m1", text="one")]


def factory() -> SimpleRetriever:
    return SimpleRetriever(_search)
