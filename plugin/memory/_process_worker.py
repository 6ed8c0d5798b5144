"""The worker side of :class:`~plugin.memory.process.ProcessRetriever`: ``python -m`` this.

One JSON object a line on standard input, one answer a line on the protocol pipe (the original
standard output; the retriever's own prints go to standard error). The first line names the
factory and the import path; each later line is one request, answered before the next is read.
A search may ask the parent for a source read mid-call (``{"source_read": true}``), which the
parent answers on standard input. Nothing but these plain values ever crosses.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import runpy
import sys
import types
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

from plugin.control import AttemptKind, BudgetRefusal, RecallBudgetExceeded, RefusalReason
from plugin.control.validate import MAX_ID_BYTES
from plugin.errors import InvalidArgumentError, RetrieverFailedError

from ._process_launch import load
from ._process_values import read_limit, text_limit
from .enforce import MAX_CITES, NOTE_LIMIT
from .preparation import PreparedRecall, SemanticPreparation, WithheldReason
from .protocol import ContextCaps, Found, NestedRead, Retriever, check_retriever
from .query import BaselineReason, FragmentRole, QueryStrategy, RecallQuery
from .store import Evidence


class WorkerHandle:
    """What a retriever in the worker gets for its attempt: the slot, the time left, and
    source reads that the parent accounts. It offers no nested read."""

    def __init__(self, slot: int, kind: AttemptKind, seconds_left: float,
                 channel: Channel) -> None:
        self.slot = slot
        self.kind = kind
        self._deadline = _now() + seconds_left
        self._channel = channel
        self.ended = False
        self.offers_nested = False

    def seconds_left(self) -> float:
        return 0.0 if self.ended else max(0.0, self._deadline - _now())

    def source_read(self) -> int:
        answer = self._channel.ask({"source_read": True})
        number = answer.get("ok")
        if type(number) is int:
            return number
        refusal = answer.get("refused") or {}
        raise RecallBudgetExceeded(BudgetRefusal(
            reason=RefusalReason(refusal.get("reason", "closed")),
            run_id=str(refusal.get("run_id", "")) or "-",
            reserved=int(refusal.get("reserved", 0)), executed=int(refusal.get("executed", 0)),
        ))

    async def nested(self, people: Sequence[str]) -> NestedRead:
        raise InvalidArgumentError("a retriever in a worker process gets no nested read")


def _now() -> float:
    import time

    return time.monotonic()


class Channel:
    """The worker's two pipes."""

    def __init__(self, inp: IO[bytes], out: IO[bytes]) -> None:
        self._inp = inp
        self._out = out

    def send(self, value: dict[str, Any]) -> None:
        self._out.write(json.dumps(value, allow_nan=False).encode() + b"\n")
        self._out.flush()

    def receive(self) -> dict[str, Any] | None:
        line = self._inp.readline()
        if not line:
            return None
        value = json.loads(line)
        assert isinstance(value, dict)
        return value

    def ask(self, value: dict[str, Any]) -> dict[str, Any]:
        self.send(value)
        answer = self.receive()
        if answer is None:
            raise SystemExit(0)  # the parent went away
        return answer


def _query(data: dict[str, Any]) -> RecallQuery:
    reason = data["baseline_reason"]
    return RecallQuery(
        fragments=tuple(data["fragments"]), strategy=QueryStrategy(data["strategy"]),
        baseline_reason=None if reason is None else BaselineReason(reason),
        scope=data["scope"], principal=data["principal"],
        roles=tuple(FragmentRole(role) for role in data["roles"]),
    )


def _vector(values: list[float] | None) -> Any:
    if values is None:
        return None
    vector = np.asarray(values, dtype=np.float32)
    vector.setflags(write=False)
    return vector


def _prepared(data: dict[str, Any]) -> PreparedRecall:
    query = _query(data["query"])
    semantic = data["semantic"]
    withheld = semantic["withheld"]
    return PreparedRecall(
        query=query, recent_query=_query(data["recent"]),
        semantic=SemanticPreparation(
            fingerprint=query.fingerprint, vector=_vector(semantic["vector"]),
            withheld_reason=None if withheld is None else WithheldReason(withheld),
            tokens=semantic["tokens"], model=semantic["model"],
            fragment_vectors=tuple(_vector(v) for v in semantic["fragment_vectors"]),
        ),
    )


class BadResult(Exception):
    """What the retriever returned cannot be sent as plain evidence."""


_NAME_CUT = MAX_ID_BYTES + 1
"""Where an id, a cited id, an arm, a principal and a scope are cut: one longer than
:data:`~plugin.control.validate.MAX_ID_BYTES` characters is dropped by the host anyway (a bad
id, or not the run's principal or scope), and cut here it still is, so a huge one costs what a
short one does and the answer stays within the pipe's cap, as the same item does in process."""


def _cut(value: str | None) -> str | None:
    return None if value is None else value[:_NAME_CUT]


def evidence_to_json(item: object, longest: int) -> dict[str, Any]:
    """An evidence item as plain values, its text cut to ``longest`` characters (a longer one
    cannot be rendered whole anyway) and its names to what keeps them as the host judges them
    (at most :data:`MAX_CITES` and one cited ids, each cut to :data:`_NAME_CUT`)."""
    if not isinstance(item, Evidence):
        raise BadResult
    try:
        score, created = float(item.score), float(item.created_at)
    except (TypeError, ValueError):
        raise BadResult from None
    if not (math.isfinite(score) and math.isfinite(created)):
        raise BadResult
    return {"id": item.id[:_NAME_CUT], "text": item.text[:longest], "kind": item.kind,
            "score": score, "arm": item.arm[:_NAME_CUT], "principal": _cut(item.principal),
            "scope": _cut(item.scope), "created_at": created,
            "cites": [cite[:_NAME_CUT] for cite in item.cites[:MAX_CITES + 1]]}


def _items(values: object, limit: int, longest: int) -> list[dict[str, Any]]:
    """The first ``limit`` items as JSON values (the rest are never sent), each text cut to
    ``longest`` characters."""
    if not isinstance(values, (tuple, list)):
        raise BadResult
    return [evidence_to_json(item, longest) for item in values[:limit]]


def _cut_texts(values: Sequence[object], limit: int, longest: int) -> list[object]:
    """The first ``limit`` of ``values``, each text cut to ``longest`` characters: at least
    what the host keeps of it (a note is shown cut to :data:`NOTE_LIMIT`), so the answer
    stays within the pipe's cap and the host sees what it would see in process."""
    return [value[:longest] if isinstance(value, str) else value for value in values[:limit]]


def _caps(data: dict[str, Any]) -> ContextCaps:
    return ContextCaps(**data)


async def serve(retriever: Retriever, request: dict[str, Any], channel: Channel) -> Any:
    op = request["op"]
    limit, longest = read_limit(request), text_limit(request)
    if op == "search":
        handle = WorkerHandle(request["slot"], AttemptKind(request["kind"]),
                              request["seconds_left"], channel)
        try:
            found = await retriever.search(
                _prepared(request["prepared"]), handle,  # type: ignore[arg-type]
                caps=_caps(request["caps"]), nested_beliefs=False)
        finally:
            handle.ended = True
        if not isinstance(found, Found):
            raise BadResult
        return {"evidence": _items(found.evidence, limit, longest),
                "people": _cut_texts(found.people, limit, longest),
                "arms": _cut_texts(found.arms, limit, longest),
                "notes": _cut_texts(found.notes, limit, NOTE_LIMIT + 1)}
    if op == "read_beliefs":
        handle = WorkerHandle(request["slot"], AttemptKind(request["kind"]),
                              request["seconds_left"], channel)
        try:
            beliefs = await retriever.read_beliefs(
                tuple(request["people"]), handle,  # type: ignore[arg-type]
                principal=request["principal"], scope=request["scope"],
                caps=_caps(request["caps"]))
        finally:
            handle.ended = True
        return _items(beliefs, limit, longest)
    if op == "corrections":
        return _items(await retriever.corrections(principal=request["principal"],
                                                  scope=request["scope"]), limit, longest)
    if op == "revalidate":
        return _items(await retriever.revalidate(tuple(request["ids"]),
                                                 principal=request["principal"],
                                                 scope=request["scope"]), limit, longest)
    raise ValueError(f"unknown request {op!r}")


def main() -> None:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the retriever's prints go to standard error, never into the protocol
    sys.stdout = sys.stderr
    channel = Channel(sys.stdin.buffer, out)
    init = channel.receive()
    if init is None:
        return
    sys.path[:] = [entry for entry in init["path"] if isinstance(entry, str)]
    try:
        if init.get("main"):  # the factory lives in the parent's main script
            namespace = runpy.run_path(init["main"], run_name="__mp_main__")
            main_module = types.ModuleType("__mp_main__")
            main_module.__dict__.update(namespace)
            sys.modules["__mp_main__"] = sys.modules["__main__"] = main_module
        retriever = check_retriever(load(init["factory"])())
    except Exception as exc:  # the parent reports it as every call's failure
        channel.send({"error": "raised", "detail": type(exc).__name__})
        return
    channel.send({"ready": True})
    loop = asyncio.new_event_loop()
    try:
        while (request := channel.receive()) is not None:
            seq = request.get("seq")  # repeated in the answer: the parent checks it
            try:
                result = loop.run_until_complete(serve(retriever, request, channel))
            except BadResult:
                encoded = json.dumps({"error": "bad_result", "seq": seq})
            except RetrieverFailedError as exc:  # a SimpleRetriever's own typed failure
                encoded = json.dumps({"error": exc.reason, "seq": seq})
            except Exception:
                encoded = json.dumps({"error": "raised", "seq": seq})
            else:
                try:
                    encoded = json.dumps({"result": result, "seq": seq}, allow_nan=False)
                except (TypeError, ValueError):
                    encoded = json.dumps({"error": "bad_result", "seq": seq})
            out.write(encoded.encode() + b"\n")
            out.flush()
    finally:
        loop.close()


if __name__ == "__main__":
    main()
