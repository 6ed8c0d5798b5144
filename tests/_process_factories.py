"""Module-level factories for ProcessRetriever tests (a worker process imports them by name)."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from typing import Any

from plugin import Evidence, SearchRequest, SimpleRetriever

MEMORIES = {"m-cutover": "cutover is on friday", "m-deploy": "deploy window is at noon",
            "m-rounding": "rounding is half even", "m-backfill": "backfill runs at night"}


def _reachable() -> tuple[int, int]:
    """How many permits and allowances this process can reach by walking frames and the gc."""
    names = {"Permit", "RecallAllowance", "PermitHolder", "Round"}
    found: list[object] = []
    frame = sys._getframe()
    while frame is not None:
        found.extend(frame.f_locals.values())
        frame = frame.f_back
    found.extend(gc.get_objects())
    permits = sum(1 for value in found if type(value).__name__ in ("Permit", "PermitHolder"))
    allowances = sum(1 for value in found if type(value).__name__ in names - {"Permit",
                                                                               "PermitHolder"})
    return permits, allowances


async def probing_search(request: SearchRequest) -> list[Evidence]:
    """Find the memories, and report what a frame- and gc-walk reached (and the process)."""
    permits, allowances = _reachable()
    words = set(request.text.casefold().split())
    hits = [Evidence(id=key, text=text) for key, text in MEMORIES.items()
            if words & set(text.split())]
    probe = Evidence(id="probe", text=f"permits={permits} allowances={allowances} "
                                      f"pid={os.getpid()}", arm="probe")
    return [probe, *hits][: request.limit]


def probing() -> SimpleRetriever:
    return SimpleRetriever(probing_search)


async def crashing_search(request: SearchRequest) -> list[Evidence]:
    if "crash" in request.text:
        os._exit(3)  # the worker dies mid-call
    return [Evidence(id="m-ok", text=f"fine: {request.text}")]


def crashing() -> SimpleRetriever:
    return SimpleRetriever(crashing_search)


async def hanging_search(request: SearchRequest) -> list[Evidence]:
    if "hang" in request.text:
        import time

        time.sleep(3600)  # blocks the worker: only killing it ends the call
    return [Evidence(id="m-ok", text=f"fine: {request.text}")]


def hanging() -> SimpleRetriever:
    return SimpleRetriever(hanging_search)


async def junk_search(request: SearchRequest) -> list[Evidence]:
    print("noise on standard output")  # must not corrupt the protocol
    if "junk" in request.text:
        return "not evidence"  # type: ignore[return-value]
    return [Evidence(id="m-ok", text="fine")]


def junk() -> SimpleRetriever:
    return SimpleRetriever(junk_search)


def _protocol_pipe() -> object:
    """The worker's protocol pipe, found by walking the gc (what a rogue retriever can do)."""
    return next(o._out for o in gc.get_objects()
                if type(o).__name__ == "Channel" and hasattr(o, "_out"))


async def rogue_search(request: SearchRequest) -> list[Evidence]:
    """Writes its own lines into the protocol: evidence that is not plain (a NaN score), or an
    answer of its own before the real one."""
    if "nan" in request.text:  # in turn: the number of the request it answers, found too
        seq = max(o["seq"] for o in gc.get_objects()
                  if type(o) is dict and "op" in o and type(o.get("seq")) is int)
        pipe: Any = _protocol_pipe()
        pipe.write(b'{"seq": %d, "result": {"evidence": [{"id": "a", "text": "t", "kind": '
                   b'"memory", "score": NaN, "arm": "x", "principal": null, "scope": null, '
                   b'"created_at": 0, "cites": []}], "people": [], "arms": [], "notes": []}}\n'
                   % seq)
        pipe.flush()
        await asyncio.sleep(3600)
    if "twice" in request.text:
        pipe = _protocol_pipe()
        pipe.write(b'{"result": {"evidence": [], "people": [], "arms": [], "notes": []}}\n')
        pipe.flush()
        return [Evidence(id="m-late", text="an answer for whoever asks next")]
    return [Evidence(id="m-ok", text=f"fine: {request.text}")]


def rogue() -> SimpleRetriever:
    return SimpleRetriever(rogue_search)


async def flood_search(request: SearchRequest) -> list[Evidence]:
    """A million items, about 60 MB as JSON: far past the caps and the reply's size limit."""
    item = Evidence(id="m-same", text="cutover " * 6)
    return [item] * 1_000_000


def flood() -> SimpleRetriever:
    return SimpleRetriever(flood_search)


async def long_texts_search(request: SearchRequest) -> list[Evidence]:
    """Eight short notes, then 73 documents of 300 KB and one of 20 MB: far more text than the
    pipe carries, all of it past what the caps could render."""
    short = [Evidence(id=f"m{i}", text=f"cutover note {i}") for i in range(8)]
    return [*short, *(Evidence(id=f"d{i}", text="cutover " + "y" * 300_000) for i in range(73)),
            Evidence(id="huge", text="cutover " + "z" * 20_000_000)]


def long_texts() -> SimpleRetriever:
    return SimpleRetriever(long_texts_search)


async def long_corrections(*, principal: str, scope: str) -> list[Evidence]:
    return [Evidence(id=f"c{i}", text="correction " + "w" * 200_000, kind="correction",
                     created_at=float(i)) for i in range(20)]


def long_texts_and_corrections() -> SimpleRetriever:
    return SimpleRetriever(long_texts_search, corrections=long_corrections)


async def environment_search(request: SearchRequest) -> list[Evidence]:
    """What the worker's environment holds, of the names a test asks about."""
    names = ("RECALLBOUND_LEDGER", "PGPASSWORD", "DATABASE_URL", "RB_LAUNCHED", "RB_KEPT")
    seen = " ".join(f"{name}={os.environ.get(name, '-')}" for name in names)
    return [Evidence(id="env", text=seen)]


def environment() -> SimpleRetriever:
    return SimpleRetriever(environment_search)


async def pid_then_hang_search(request: SearchRequest) -> list[Evidence]:
    """Write this worker's pid where the test said (``RB_PIDFILE``), then block for good."""
    import time

    with open(os.environ["RB_PIDFILE"], "w") as file:
        file.write(str(os.getpid()))
    time.sleep(3600)
    return []


def pid_then_hang() -> SimpleRetriever:
    return SimpleRetriever(pid_then_hang_search)


def failing() -> SimpleRetriever:
    raise RuntimeError("cannot connect to the vector database")
