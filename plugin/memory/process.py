"""ProcessRetriever: a retriever you do not trust, run in worker processes.

In-process, recallbound contains a retriever's *mistakes*; code in the same process can still
read any frame and object, permits included. ``ProcessRetriever(factory)`` is the boundary for
a retriever you do not trust: ``factory`` (an importable, module-level, zero-argument callable)
is called inside a worker process and returns the real retriever (a
:class:`~plugin.SimpleRetriever`, for example). The worker sees only search requests (the
query, its vector, the trusted principal and scope, the limit, the time left) and answers with
plain evidence as JSON lines; nothing is ever unpickled from it, and its answer is capped in
size and rebuilt into :class:`~plugin.memory.store.Evidence` here before the hooks admit it.

A worker inherits this process's environment without what names or opens the ledger and the
store (``RECALLBOUND_*``, libpq's ``PG*``, ``DATABASE_URL``; ``env=`` sets it whole). It runs
as your user, so the operating system lets it open any file you can, the ledger's included:
``launcher=`` starts it as another user, in a sandbox or a container that cannot reach them.

The hooks still take every slot and open every deadline on this side. A call that is cut by
the deadline or cancelled kills its worker (it may be stuck); a worker that crashes, answers
junk or does not answer in time is that call's ``failed`` result, and the next call gets a
fresh worker; so does a worker that writes a line out of turn (each request carries a number
its answer must repeat). A worker cuts its answer to the caps before sending it (a search's or
belief read's examined items and one more), and this side reads no more. Each call in flight
has a worker of its own; finished workers are kept idle for the next calls (at most
``idle_workers``). A worker gets no nested belief read (it reports no
People); source reads are accounted by the parent, on the attempt's own budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.buffered import BufferedByteReceiveStream

from plugin.control import RecallBudgetExceeded, validate
from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError, RetrieverFailedError

from ._process_launch import GROUPS, LAUNCHER_GRACE_S, kill_group, target, worker_env
from ._process_values import caps_values, evidence_list, names, prepared_values, read_limit
from .preparation import PreparedRecall
from .protocol import AttemptHandle, ContextCaps, Found
from .store import Evidence

MAX_REPLY_BYTES = 16 * 1024 * 1024
"""The largest answer a worker may send (one JSON line); a larger one fails its call."""

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The folder holding the ``plugin`` package: the worker imports it from there."""

T = TypeVar("T")


class _WorkerLost(Exception):
    """The worker died, closed its pipe or answered something that is not the protocol."""


class _Worker:
    """One worker process and its two pipes."""

    def __init__(self, process: anyio.abc.Process, token: object, *,
                 launched: bool = False, generation: int = 0) -> None:
        self.process = process
        self.token = token
        self.generation = generation
        """The retriever's :meth:`~ProcessRetriever.aclose` count when it started: a worker
        started before a close is stopped when its call ends, never kept idle."""
        self.launched = launched
        assert process.stdout is not None and process.stdin is not None
        self._reader = BufferedByteReceiveStream(process.stdout)
        self._writer = process.stdin

    async def send(self, value: dict[str, Any]) -> None:
        try:
            await self._writer.send(json.dumps(value).encode() + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            raise _WorkerLost from None

    async def receive(self) -> dict[str, Any]:
        try:
            line = await self._reader.receive_until(b"\n", MAX_REPLY_BYTES)
            value = json.loads(line)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError,
                anyio.ClosedResourceError, anyio.DelimiterNotFound, ValueError):
            raise _WorkerLost from None
        if type(value) is not dict:
            raise _WorkerLost
        return value

    async def exchange(self, request: dict[str, Any], handle: AttemptHandle | None) -> Any:
        await self.send(request)
        while True:
            answer = await self.receive()
            if ("result" in answer or "error" in answer) and answer.get("seq") != request["seq"]:
                raise _WorkerLost  # a line that answers no request of ours: out of step
            if "result" in answer:
                return answer["result"]
            if "error" in answer:
                reason = answer["error"]
                raise RetrieverFailedError(reason if isinstance(reason, str) else "raised")
            if answer.get("source_read") is True and handle is not None:
                try:
                    reply: dict[str, Any] = {"ok": handle.source_read()}
                except RecallBudgetExceeded as exc:
                    refusal = exc.refusal
                    reply = {"refused": {"reason": refusal.reason.value,
                                         "run_id": refusal.run_id,
                                         "reserved": refusal.reserved,
                                         "executed": refusal.executed}}
                await self.send(reply)
                continue
            raise _WorkerLost

    def kill(self) -> None:
        """Kill the process and what it started (its own process group), whichever event loop
        started it. Through a launcher, the group gets SIGTERM first (``sudo`` relays it to a
        worker of another user, which this process may not signal) and SIGKILL a moment
        later, from a timer thread: nothing waits here."""
        pid = self.process.pid
        if not GROUPS:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
            return
        if not self.launched:
            kill_group(pid)
            return
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGTERM)
        timer = threading.Timer(LAUNCHER_GRACE_S, kill_group, (pid,))
        timer.daemon = True
        timer.start()

    async def aclose(self) -> None:
        self.kill()
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await self.process.aclose()


class ProcessRetriever:
    """A :class:`~plugin.memory.protocol.Retriever` whose real retriever runs in worker
    processes (see the module doc for what crosses and what a worker can reach).

    ``factory`` must be importable by name (a module-level function or class); anything else
    raises :class:`~plugin.errors.InvalidArgumentError` here. ``timeout_s`` bounds the calls
    that have no attempt deadline (corrections, re-reads); a search is bounded by its
    attempt. Close it (``await retriever.aclose()`` or ``async with``) to stop idle workers.

    ``env`` is the workers' whole environment; by default this process's, without what
    names or opens the ledger and the store (``RECALLBOUND_*``, libpq's ``PG*``,
    ``DATABASE_URL``). ``launcher`` is put before the worker's command: another user
    (``("sudo", "-u", "retriever", "--")``), a sandbox or a container, which the operating
    system keeps from the ledger's file or server. Without one, a worker runs as your user
    and can open any file you can.
    """

    def __init__(
        self, factory: Callable[[], object], *, idle_workers: int = 4, timeout_s: float = 10.0,
        env: Mapping[str, str] | None = None, launcher: Sequence[str] = (),
    ) -> None:
        self._target, self._main_path = target(factory)
        self._env = worker_env(os.environ if env is None else env, default=env is None)
        if isinstance(launcher, str):
            raise InvalidArgumentTypeError("launcher must be a sequence of str (a command)")
        self._launcher = tuple(launcher)
        if not all(isinstance(part, str) for part in self._launcher):
            raise InvalidArgumentTypeError("launcher must be a sequence of str (a command)")
        if isinstance(idle_workers, bool) or not isinstance(idle_workers, int):
            raise InvalidArgumentTypeError("idle_workers must be an int")
        if idle_workers < 0:
            raise InvalidArgumentError(f"idle_workers must be >= 0, got {idle_workers}")
        self._idle_limit = idle_workers
        self._timeout_s = validate.seconds(timeout_s, field="ProcessRetriever.timeout_s")
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._seq = 0
        self._generation = 0
        self.started = 0
        """How many worker processes this retriever started (for tests and benchmarks)."""

    def __repr__(self) -> str:
        return f"ProcessRetriever({self._target})"

    async def __aenter__(self) -> ProcessRetriever:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the idle workers; calls in flight keep theirs until they end, and those
        workers are stopped then, never kept."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        token = anyio.lowlevel.current_token()
        for worker in idle:
            if worker.token == token:
                await worker.aclose()
            else:
                worker.kill()

    async def start(self, workers: int = 1) -> None:
        """Start ``workers`` idle workers now, so that the first searches do not wait.

        Raises :class:`~plugin.errors.RetrieverFailedError` when one cannot start (a launcher
        that is missing or exits, a factory that fails, or one not ready within
        ``timeout_s``: an import that hangs); none of them is kept then. A close while it runs
        stops them all, those started after the close too; a cancelled start stops those it
        started."""
        generation = self._generation
        started: list[_Worker] = []
        try:
            for _ in range(workers):
                with anyio.move_on_after(self._timeout_s):
                    started.append(await self._spawn(generation))
                    continue
                raise _WorkerLost  # not ready in time
        except BaseException as exc:  # cancelled too: the workers started are stopped
            for worker in started:
                await worker.aclose()
            if isinstance(exc, (_WorkerLost, OSError)):
                raise RetrieverFailedError("raised") from None
            raise
        for worker in started:
            await self._checkin(worker)

    # -- the worker pool ---------------------------------------------------------------------

    async def _spawn(self, generation: int | None = None) -> _Worker:
        """A ready worker, of ``generation`` (by default the current one)."""
        if generation is None:
            generation = self._generation
        env = dict(self._env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH")]))
        process = await anyio.open_process(
            [*self._launcher, sys.executable, "-m", "plugin.memory._process_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=env,
            start_new_session=GROUPS,  # a group of its own: killed with what it started
        )
        self.started += 1
        worker = _Worker(process, anyio.lowlevel.current_token(),
                         launched=bool(self._launcher), generation=generation)
        try:
            await worker.send({"factory": self._target, "main": self._main_path,
                               "path": [entry or os.getcwd() for entry in sys.path]})
            answer = await worker.receive()
        except BaseException:
            await worker.aclose()
            raise
        if answer.get("ready") is not True:
            await worker.aclose()
            raise _WorkerLost
        return worker

    async def _checkout(self) -> _Worker:
        token = anyio.lowlevel.current_token()
        while True:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None:
                return await self._spawn()
            if worker.token == token and worker.process.returncode is None:
                return worker
            if worker.token == token:
                await worker.aclose()
            else:
                worker.kill()  # started under another event loop: not usable here

    async def _checkin(self, worker: _Worker) -> None:
        with self._lock:
            if worker.generation == self._generation and len(self._idle) < self._idle_limit:
                self._idle.append(worker)
                return
        await worker.aclose()

    async def _call(
        self, request: dict[str, Any], parse: Callable[[Any, int], T],
        handle: AttemptHandle | None = None,
    ) -> T:
        """One request to a worker, its answer read by ``parse`` up to the request's
        ``read_limit`` (what the worker cut it to); every way it can go wrong is this call's
        failure. A worker is kept for the next call only when it answered in turn with what
        ``parse`` accepts, or reported its own failure; any other worker (junk, a line out of
        turn, cut by the deadline or cancelled) is killed."""
        limit = handle.seconds_left() if handle is not None else self._timeout_s
        self._seq += 1
        request = {**request, "seq": self._seq}
        worker: _Worker | None = None
        keep = False
        try:
            with anyio.move_on_after(limit):
                worker = await self._checkout()
                try:
                    answer = await worker.exchange(request, handle)
                except RetrieverFailedError:
                    keep = True  # the worker reported its failure: it is still in step
                    raise
                result = parse(answer, read_limit(request))
                keep = True
        except _WorkerLost:
            raise RetrieverFailedError("raised") from None
        finally:
            if worker is not None:
                if keep:
                    await self._checkin(worker)
                else:  # junk, out of turn, cancelled or timed out: it may be stuck or rogue
                    await worker.aclose()
        if not keep:
            raise RetrieverFailedError("raised")  # no answer in time
        return result

    # -- the retriever protocol --------------------------------------------------------------

    def searchable(self, prepared: PreparedRecall) -> bool:
        return bool(prepared.query.text.strip())

    async def named_people(self, prepared: PreparedRecall) -> tuple[str, ...]:
        return ()  # a worker gets no nested read, so no slot is reserved for one

    async def search(
        self, prepared: PreparedRecall, handle: AttemptHandle, *, caps: ContextCaps,
        nested_beliefs: bool,
    ) -> Found:
        def found(result: Any, limit: int) -> Found:
            if type(result) is not dict:
                raise RetrieverFailedError("bad_result")
            return Found(evidence=evidence_list(result.get("evidence"), limit),
                         people=names(result.get("people"), limit),
                         arms=names(result.get("arms"), limit),
                         notes=names(result.get("notes"), limit))

        return await self._call({
            "op": "search", "prepared": prepared_values(prepared), "caps": caps_values(caps),
            "slot": handle.slot, "kind": handle.kind.value,
            "seconds_left": handle.seconds_left(),
        }, found, handle)

    async def read_beliefs(
        self, people: Sequence[str], handle: AttemptHandle, *, principal: str, scope: str,
        caps: ContextCaps,
    ) -> tuple[Evidence, ...]:
        return await self._call({
            "op": "read_beliefs", "people": [str(name) for name in people],
            "principal": principal, "scope": scope, "caps": caps_values(caps),
            "slot": handle.slot, "kind": handle.kind.value,
            "seconds_left": handle.seconds_left(),
        }, evidence_list, handle)

    async def corrections(self, *, principal: str, scope: str) -> tuple[Evidence, ...]:
        return await self._call(
            {"op": "corrections", "principal": principal, "scope": scope}, evidence_list)

    async def revalidate(
        self, ids: Sequence[str], *, principal: str, scope: str
    ) -> tuple[Evidence, ...]:
        return await self._call(
            {"op": "revalidate", "ids": [str(i) for i in ids], "principal": principal,
             "scope": scope}, evidence_list)
