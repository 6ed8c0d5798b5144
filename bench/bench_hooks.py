"""What the allowance costs an agent loop, and what the retriever containment adds to it.

Default: enforced hooks vs the legacy (unenforced) path, in one process. Both sides run the
same planning, the same store and the same searches; the enforced side adds the durable
reservation (one ``synchronous=FULL`` commit per round), the permit and the traces. Measured in
the same run, alternating, on asyncio:

    python -m bench.bench_hooks

``--containment`` measures what the retriever containment adds, in one process: the same
hooks alternate calls with the containment on and off (its checks swapped for pass-throughs:
no contained call, no admission of evidence), wall and CPU time:

    python -m bench.bench_hooks --containment

``--process`` measures what :class:`plugin.ProcessRetriever` costs per search: the same
dictionary retriever (a ``SimpleRetriever``) in-process and in a worker process, behind the same
enforced hooks, one search call per dispatch, alternating:

    python -m bench.bench_hooks --process

``--against DIR`` compares this checkout's enforced hooks with another checkout's (for example
the code before the containment: ``git worktree add /tmp/old <commit>``). Each side runs in a
worker process of its own (the two cannot share a process: same package names), on the same
demo store; the parent alternates batches between them, so both see the same machine load, and
prints medians and the ratio this/other:

    python -m bench.bench_hooks --against /tmp/old
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from itertools import count
from pathlib import Path
from typing import IO, Any

import anyio
from attrs import evolve

from plugin import AllowancePolicy, SystemClock
from plugin.memory.store import MemoryStore
from runtime_hooks.bootstrap import RecallConfig, Semantic, load_embedding, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed
from runtime_hooks.hooks import RecallHooks, ToolCall

ROUNDS = 60
BATCH = 5
BATCHES = 60
HERE = Path(__file__).resolve().parents[1]

QUERIES = ["invoice backfill dry-run", "currency rounding", "cutover date"]


async def _median_pair(
    enforced: Callable[[], Awaitable[Any]], legacy: Callable[[], Awaitable[Any]],
    rounds: int = ROUNDS,
) -> tuple[float, float]:
    """Median microseconds of each, timed one call at a time, alternating (fsync drifts)."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(5):  # warm-up
        await enforced()
        await legacy()
    for _ in range(rounds):
        for side, call in enumerate((enforced, legacy)):
            start = time.perf_counter_ns()
            await call()
            times[side].append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(times[0]), statistics.median(times[1])


def _config(folder: Path, **changes: Any) -> RecallConfig:
    async def admit(_: str) -> bool:
        return True

    base = RecallConfig(ledger_path=folder / "l.db", store_path=folder / "m.db",
                        semantic=Semantic.HASHING, query_planning="task_context",
                        policy=AllowancePolicy(), admission=admit)
    return evolve(base, **changes)


async def _seed(config: RecallConfig) -> None:
    async with MemoryStore(config.store_path, embedding=load_embedding(config.semantic),
                           clock=SystemClock()) as store:
        await seed(store)


def _calls() -> list[ToolCall]:
    return [ToolCall(call_id=f"c{i}", arguments={"query": q}) for i, q in enumerate(QUERIES)]


def _phases(hooks: RecallHooks, tag: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    runs = count()
    calls = _calls()
    return {
        "prepare": lambda: hooks.prepare(STATE, run_id=f"{tag}p{next(runs)}", scope=SCOPE,
                                         principal=PRINCIPAL),
        "dispatch": lambda: hooks.dispatch(calls, run_id=f"{tag}d{next(runs)}", scope=SCOPE,
                                           principal=PRINCIPAL),
    }


async def legacy_main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        await _seed(_config(folder))
        async with open_hooks(_config(folder)) as enforced, open_hooks(
            _config(folder, legacy=True)
        ) as legacy:
            on, off = _phases(enforced, "e"), _phases(legacy, "l")
            rows = [
                ("prepare (automatic round: base + delta)",
                 *await _median_pair(on["prepare"], off["prepare"])),
                ("dispatch (3 parallel search calls)",
                 *await _median_pair(on["dispatch"], off["dispatch"])),
            ]
    print(f"hooks on asyncio, demo store, medians of {ROUNDS} alternating calls")
    print(f"  {'phase':42} {'enforced':>10} {'legacy':>10} {'ratio':>7}")
    for name, enforced_us, legacy_us in rows:
        print(f"  {name:42} {enforced_us:>8.0f}us {legacy_us:>8.0f}us "
              f"{enforced_us / legacy_us:>6.2f}x")


# -- --containment: on and off in one process ------------------------------------------------


class _Switch:
    """Swap the containment's checks for pass-throughs (off) and back (on)."""

    def __init__(self) -> None:
        from plugin.memory import enforce, recall

        async def call(fn: Callable[[], Awaitable[Any]]) -> Any:
            return await fn()

        def call_sync(fn: Callable[[], Any]) -> Any:
            return fn()

        def admit(items: Any, **_: Any) -> tuple[Any, int]:
            return tuple(items), 0

        self._modules = (enforce, recall)
        self._on = {name: getattr(module, name) for module in self._modules
                    for name in ("contained", "contained_sync", "admit", "_found")
                    if hasattr(module, name)}
        self._off = {"contained": call, "contained_sync": call_sync, "admit": admit,
                     "_found": lambda found: found}

    def set(self, on: bool) -> None:
        for module in self._modules:
            for name, value in (self._on if on else self._off).items():
                if name in vars(module):
                    setattr(module, name, value if not on else self._on[name])


async def containment_main() -> None:
    switch = _Switch()
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        await _seed(_config(folder))
        async with open_hooks(_config(folder)) as hooks:
            phases = _phases(hooks, "c")
            for phase in ("prepare", "dispatch"):
                times: list[list[tuple[float, float]]] = [[], []]
                for index in range(10 + 2 * ROUNDS * 2):
                    on = index % 2 == 0
                    switch.set(on)
                    start, cpu = time.perf_counter_ns(), time.process_time_ns()
                    await phases[phase]()
                    if index >= 10:  # warm-up
                        times[0 if on else 1].append(((time.perf_counter_ns() - start) / 1000,
                                                      (time.process_time_ns() - cpu) / 1000))
                switch.set(True)
                for kind, column in (("wall", 0), ("CPU", 1)):
                    mine, theirs = (statistics.median(t[column] for t in side) for side in times)
                    rows.append((f"{phase} {kind}", mine, theirs))
    print(f"retriever containment on vs off, one process, asyncio, demo store; medians of "
          f"{2 * ROUNDS} alternating calls per side")
    print(f"  load average: {Path('/proc/loadavg').read_text().split()[:3]}")
    print(f"  {'phase':14} {'on':>10} {'off':>10} {'on/off':>8}")
    for phase, on_us, off_us in rows:
        print(f"  {phase:14} {on_us:>8.0f}us {off_us:>8.0f}us {on_us / off_us:>7.3f}x")


# -- --process: a retriever in-process vs in a worker process -------------------------------

_MEMORIES = {f"m{i}": f"memory {i} about the invoice backfill and currency rounding"
             for i in range(20)}


async def _dict_search(request: Any) -> list[Any]:
    from plugin import Evidence

    words = set(request.text.casefold().split())
    hits = [Evidence(id=key, text=text) for key, text in _MEMORIES.items()
            if words & set(text.split())]
    return hits[: request.limit]


def dict_retriever() -> Any:
    """The benchmark's retriever (module level: a worker process imports it by name)."""
    from plugin import SimpleRetriever

    return SimpleRetriever(_dict_search)


async def process_main() -> None:
    from plugin import ProcessRetriever

    one_call = [ToolCall(call_id="c0", arguments={"query": QUERIES[0]})]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        await _seed(_config(folder))
        async with ProcessRetriever(dict_retriever) as remote:
            await remote.start()
            async with open_hooks(_config(folder), retriever=dict_retriever()) as local, \
                    open_hooks(_config(folder, ledger_path=folder / "l2.db"),
                               retriever=remote) as far:
                runs = count()

                def dispatch(hooks: RecallHooks) -> Callable[[], Awaitable[Any]]:
                    return lambda: hooks.dispatch(one_call, run_id=f"p{next(runs)}",
                                                  scope=SCOPE, principal=PRINCIPAL)

                process_us, local_us = await _median_pair(dispatch(far), dispatch(local))
            started = remote.started
    print(f"one search call per dispatch, enforced hooks, asyncio; medians of {ROUNDS} "
          f"alternating calls")
    print(f"  load average: {Path('/proc/loadavg').read_text().split()[:3]}")
    print(f"  in-process SimpleRetriever      {local_us:>8.0f}us")
    print(f"  ProcessRetriever (warm worker)  {process_us:>8.0f}us")
    print(f"  cost per search                 {process_us - local_us:>8.0f}us "
          f"({process_us / local_us:.2f}x); worker processes started: {started}")


# -- --against: two checkouts, one worker process each ---------------------------------------


async def worker(folder: Path) -> None:
    """Serve ``<phase> <n>`` lines on stdin: run ``n`` calls, answer their times (JSON, us)."""
    import plugin

    config = _config(folder)
    async with open_hooks(config) as hooks:
        phases = _phases(hooks, f"w{os.getpid()}-")
        print(json.dumps({"plugin": plugin.__file__}), flush=True)
        for line in sys.stdin:
            phase, n = line.split()
            times = []
            for _ in range(int(n)):
                start, cpu = time.perf_counter_ns(), time.process_time_ns()
                await phases[phase]()
                times.append(((time.perf_counter_ns() - start) / 1000,
                              (time.process_time_ns() - cpu) / 1000))
            print(json.dumps(times), flush=True)


def _spawn(tree: Path, folder: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker", str(folder)],
        cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


def _ask(proc: subprocess.Popen[str], phase: str, n: int) -> list[list[float]]:
    """``n`` calls of ``phase`` in the worker: (wall, CPU) microseconds of each."""
    stdin, stdout = proc.stdin, proc.stdout
    assert stdin is not None and stdout is not None
    stdin.write(f"{phase} {n}\n")
    stdin.flush()
    answer: list[list[float]] = json.loads(stdout.readline())
    return answer


def _hello(stdout: IO[str] | None) -> str:
    assert stdout is not None
    return str(json.loads(stdout.readline())["plugin"])


def against(other: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folders = [Path(tmp) / "this", Path(tmp) / "other"]
        for folder in folders:
            folder.mkdir()
            anyio.run(_seed, _config(folder))
        procs = [_spawn(HERE, folders[0]), _spawn(other.resolve(), folders[1])]
        try:
            trees = [_hello(proc.stdout) for proc in procs]
            rows: list[tuple[str, float, float]] = []
            for phase in ("prepare", "dispatch"):
                times: list[list[list[float]]] = [[], []]
                for proc in procs:  # warm-up
                    _ask(proc, phase, 5)
                for batch in range(BATCHES):  # who goes first alternates too
                    for side in (0, 1) if batch % 2 == 0 else (1, 0):
                        times[side].extend(_ask(procs[side], phase, BATCH))
                for kind, column in (("wall", 0), ("CPU", 1)):
                    mine, theirs = (statistics.median(t[column] for t in side) for side in times)
                    rows.append((f"{phase} {kind}", mine, theirs))
        finally:
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=60)
    print(f"enforced hooks, this checkout vs {other}, asyncio, demo store;")
    print(f"medians of {BATCH * BATCHES} calls per side, alternating batches of {BATCH}")
    print(f"  this:  {trees[0]}\n  other: {trees[1]}")
    print(f"  load average: {Path('/proc/loadavg').read_text().split()[:3]}")
    print("  (CPU: the process's CPU time per call, its SQLite threads included; it does not")
    print("  count waits for the disk or for the scheduler, which dominate wall time under load)")
    print(f"  {'phase':14} {'this':>10} {'other':>10} {'this/other':>11}")
    for phase, this_us, other_us in rows:
        print(f"  {phase:14} {this_us:>8.0f}us {other_us:>8.0f}us {this_us / other_us:>10.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", type=Path, help="another checkout to compare with")
    parser.add_argument("--containment", action="store_true",
                        help="the retriever containment on vs off, in one process")
    parser.add_argument("--process", action="store_true",
                        help="a retriever in-process vs in a ProcessRetriever worker")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        anyio.run(worker, args.worker)
    elif args.against is not None:
        against(args.against)
    elif args.containment:
        anyio.run(containment_main)
    elif args.process:
        anyio.run(process_main)
    else:
        anyio.run(legacy_main)


if __name__ == "__main__":
    main()
