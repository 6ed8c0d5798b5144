"""Module-level factories for the worker lifecycle tests (a worker imports them by name)."""

from __future__ import annotations

import os
import time
from typing import Any

from plugin import Evidence, SearchRequest, SimpleRetriever
from plugin.memory.protocol import Found


async def slow_search(request: SearchRequest) -> list[Evidence]:
    """Write this worker's pid where ``RB_PIDFILE`` says, then answer a second later."""
    with open(os.environ["RB_PIDFILE"], "w") as out:
        out.write(str(os.getpid()))
    time.sleep(1.0)
    return [Evidence(id="m-slow", text="slow")]


def slow() -> SimpleRetriever:
    return SimpleRetriever(slow_search)


async def huge_names_search(request: SearchRequest) -> list[Evidence]:
    """One good item beside items whose id, arm, cited ids or principal are far too long: the
    host drops each of those, and together they are larger than the pipe's cap."""
    huge = "x" * 400_000
    return [Evidence(id="m-good", text="good"),
            *(Evidence(id=f"{i}{huge}", text="bad id") for i in range(20)),
            *(Evidence(id=f"m-arm-{i}", text="bad arm", arm=huge) for i in range(20)),
            *(Evidence(id=f"m-cites-{i}", text="bad cites", cites=(huge,)) for i in range(20)),
            Evidence(id="m-many-cites", text="too many", cites=tuple(f"s{i}" for i in range(99))),
            *(Evidence(id=f"m-other-{i}", text="other", principal=huge) for i in range(20))]


def huge_names() -> SimpleRetriever:
    return SimpleRetriever(huge_names_search)


class _LongNotes(SimpleRetriever):
    """A full-protocol search whose notes and arm names are far larger than the pipe's cap."""

    async def search(self, *args: Any, **kwargs: Any) -> Found:
        found = await super().search(*args, **kwargs)
        huge = "n" * 20_000_000
        return Found(evidence=found.evidence, people=found.people, arms=(huge,),
                     notes=(huge, "short note"))


async def one_search(request: SearchRequest) -> list[Evidence]:
    return [Evidence(id="m-1", text="cutover at noon")]


def long_notes() -> SimpleRetriever:
    return _LongNotes(one_search)
