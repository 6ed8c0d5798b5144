"""Real processes on one ledger file: racing for one run, and SIGKILL in the middle of work.

Each child runs ``tests/_ledger_worker.py`` (see its docstring). The parent inspects the file
afterwards with plain ``sqlite3`` (``PRAGMA integrity_check``, the raw tables) and through
:class:`SqliteLedger` on both backends.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from plugin.control import (
    AllowancePolicy,
    ManualClock,
    Permit,
    Reservation,
    RoundKind,
    SqliteLedger,
    Usage,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

WORKER = Path(__file__).with_name("_ledger_worker.py")
WALL = 1_700_000_000.0
TIMEOUT = 60.0
BACKENDS = ("asyncio", "trio")


def _spawn(mode: str, **args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), mode, json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _event(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The child's next JSON line (the child flushes each one)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        _, err = proc.communicate(timeout=TIMEOUT)
        pytest.fail(f"worker exited with {proc.returncode} before reporting:\n{err}")
    event: dict[str, Any] = json.loads(line)
    return event


def _finish(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Children to reap whatever happens (killed, never left running)."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=TIMEOUT)


def _integrity(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()


Rows = list[tuple[Any, ...]]


def _tables(path: Path) -> tuple[Rows, Rows, Rows]:
    conn = sqlite3.connect(path)
    try:
        runs = conn.execute("SELECT run_id, rounds, reserved FROM runs ORDER BY run_id").fetchall()
        rounds = conn.execute(
            "SELECT run_id, round_index, first_slot, slots FROM rounds "
            "ORDER BY run_id, round_index"
        ).fetchall()
        attempts = conn.execute("SELECT run_id, round_index, slot FROM attempts").fetchall()
        return runs, rounds, attempts
    finally:
        conn.close()


def _usage(path: Path, run_id: str, backend: str) -> tuple[Usage, list[Reservation]]:
    async def read() -> tuple[Usage, list[Reservation]]:
        async with SqliteLedger(path) as ledger:
            return await ledger.usage(run_id), await ledger.reservations(run_id)

    return anyio.run(read, backend=backend)


# -- (a) sixteen processes race for one run --------------------------------------------------


def _race(
    path: Path, children: list[subprocess.Popen[str]], *, policy: dict[str, Any], slots: int
) -> list[dict[str, Any]]:
    for i in range(16):
        children.append(
            _spawn(
                "race", path=str(path), run_id="contested", backend=BACKENDS[i % 2],
                wall=WALL, policy=policy, slots=slots,
            )
        )
    for proc in children:  # every child is imported and waiting: start them together
        assert _event(proc)["event"] == "ready"
    for proc in children:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in children:
        (result,) = _finish(proc)
        results.append(result)
    assert sorted(r["backend"] for r in results) == sorted(BACKENDS * 8)
    return results


def test_sixteen_processes_get_exactly_the_four_slots(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    path = tmp_path / "ledger.sqlite3"  # created by the racing children themselves
    results = _race(path, children, policy={"max_searches": 4, "max_rounds": 16}, slots=1)
    winners = [r for r in results if r["event"] == "granted"]
    losers = [r for r in results if r["event"] == "refused"]
    assert len(winners) == 4 and len(losers) == 12
    assert {r["reason"] for r in losers} == {"slots"}
    assert all(r["slots"] == 1 for r in winners)
    assert sorted(r["first_slot"] for r in winners) == [1, 2, 3, 4]
    assert sorted(r["round_index"] for r in winners) == [1, 2, 3, 4]
    assert _integrity(path) == [("ok",)]
    for backend in BACKENDS:
        usage, history = _usage(path, "contested", backend)
        assert (usage.rounds, usage.reserved, usage.executed, usage.refused) == (4, 4, 0, 12)
        assert usage.deadline_wall == WALL + 10.0
        assert [(r.first_slot, r.slots) for r in history] == [(1, 1), (2, 1), (3, 1), (4, 1)]


def test_sixteen_processes_asking_three_each_share_four_slots(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    path = tmp_path / "ledger.sqlite3"
    results = _race(path, children, policy={}, slots=3)  # the default policy: 4 slots, 2 rounds
    winners = sorted(
        (r for r in results if r["event"] == "granted"), key=lambda r: r["round_index"]
    )
    losers = [r for r in results if r["event"] == "refused"]
    assert sum(r["slots"] for r in winners) == 4
    assert len(winners) <= 2
    assert [(r["first_slot"], r["slots"]) for r in winners] == [(1, 3), (4, 1)]
    assert len(losers) == 16 - len(winners)
    assert {r["reason"] for r in losers} <= {"rounds", "slots"}
    assert _integrity(path) == [("ok",)]
    usage, _ = _usage(path, "contested", "trio")
    assert (usage.rounds, usage.reserved, usage.refused) == (2, 4, 14)


# -- (b) a process killed right after its reservation ----------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_after_a_reservation_keeps_it_consumed_and_the_file_sound(
    tmp_path: Path, children: list[subprocess.Popen[str]], backend: str
) -> None:
    path = tmp_path / "ledger.sqlite3"
    policy = {"max_searches": 5, "max_rounds": 3, "deadline_s": 3600.0}
    holder = _spawn("hold", path=str(path), run_id="run", backend=backend, wall=WALL,
                    policy=policy)
    children.append(holder)
    reserved = _event(holder)
    assert reserved == {
        "event": "reserved", "round_index": 1, "first_slot": 1, "slots": 2, "slot": 1,
        "deadline_wall": WALL + 3600.0,
    }
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=TIMEOUT)
    assert holder.returncode == -signal.SIGKILL

    assert _integrity(path) == [("ok",)]
    usage, history = _usage(path, "run", backend)
    # consumed, no refund; the attempt in flight was never written, so nothing is "executed"
    assert (usage.rounds, usage.reserved, usage.executed, usage.refused) == (1, 2, 0, 0)
    assert usage.deadline_wall == WALL + 3600.0

    # The old reservation is data only: it cannot become a permit.
    (old,) = history
    assert isinstance(old, Reservation)
    assert not hasattr(old, "attempt")
    with pytest.raises(TypeError):
        Permit(  # type: ignore[call-arg]
            run_id="run", round_index=old.round_index, kind=old.kind, slots=old.slots,
            first_slot=old.first_slot, legacy=False, clock=ManualClock(), ledger=SqliteLedger(path),
            deadline_wall=old.deadline_wall, issued_mono=0.0, left_at_issue=3600.0,
            source_reads_limit=2, reserved_total=old.reserved, executed_before=0,
        )
    with pytest.raises(TypeError):
        Permit(
            run_id="run", round_index=old.round_index, kind=old.kind, slots=old.slots,
            first_slot=old.first_slot, legacy=False, clock=ManualClock(), ledger=SqliteLedger(path),
            deadline_wall=old.deadline_wall, issued_mono=0.0, left_at_issue=3600.0,
            source_reads_limit=2, reserved_total=old.reserved, executed_before=0,
            _issuer=object(),
        )

    # Resume: a new process reserves a new round of the same run.
    other = "trio" if backend == "asyncio" else "asyncio"
    resumer = _spawn("resume", path=str(path), run_id="run", backend=other, wall=WALL + 100.0,
                     policy={"deadline_s": 10.0, "max_searches": 50, "max_rounds": 9}, slots=5)
    children.append(resumer)
    (resumed,) = _finish(resumer)
    assert resumed == {
        "event": "resumed", "old_rounds": 1, "round_index": 2, "first_slot": 3, "slots": 3,
        "slot": 3, "deadline_wall": WALL + 3600.0, "seconds_left": 3500.0,
    }
    usage, history = _usage(path, "run", other)
    assert (usage.rounds, usage.reserved, usage.executed) == (2, 5, 1)
    assert usage.deadline_wall == WALL + 3600.0
    assert [(r.round_index, r.first_slot, r.slots) for r in history] == [(1, 1, 2), (2, 3, 3)]
    assert _integrity(path) == [("ok",)]


# -- (c) a process killed at a random moment of a long stream of reservations ----------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_in_a_stream_of_reservations_leaves_a_consistent_file(
    tmp_path: Path, children: list[subprocess.Popen[str]], backend: str
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    path = tmp_path / "ledger.sqlite3"
    streamer = _spawn(
        "stream", path=str(path), backend=backend, wall=WALL, seed=seed, runs=5,
        policy={"max_searches": 10**9, "max_rounds": 10**9, "deadline_s": 10.0**6},
    )
    children.append(streamer)
    assert _event(streamer)["event"] == "started"
    time.sleep(rng.uniform(0.05, 0.6))  # a random moment of the stream, not a time under test
    os.kill(streamer.pid, signal.SIGKILL)
    streamer.wait(timeout=TIMEOUT)
    assert streamer.returncode == -signal.SIGKILL, f"seed {seed}"

    assert _integrity(path) == [("ok",)], f"seed {seed}"
    runs, rounds, attempts = _tables(path)
    assert runs, f"seed {seed}"
    for run_id, run_rounds, run_reserved in runs:
        mine = [r for r in rounds if r[0] == run_id]
        assert [r[1] for r in mine] == list(range(1, run_rounds + 1)), f"seed {seed}"
        assert run_reserved == sum(r[3] for r in mine), f"seed {seed}"
        assert [r[2] for r in mine] == [
            1 + sum(r[3] for r in mine[:i]) for i in range(len(mine))
        ], f"seed {seed}"
        spans = {r[1]: range(r[2], r[2] + r[3]) for r in mine}
        slots = [a[2] for a in attempts if a[0] == run_id]
        assert len(slots) == len(set(slots)), f"seed {seed}"
        assert all(a[2] in spans[a[1]] for a in attempts if a[0] == run_id), f"seed {seed}"
        usage, _ = _usage(path, run_id, backend)
        assert (usage.rounds, usage.reserved, usage.executed) == (
            run_rounds, run_reserved, len(slots)
        ), f"seed {seed}"

    # and the ledger goes on from there
    async def one_more() -> Reservation:
        async with SqliteLedger(path) as ledger:
            result = await ledger.reserve(
                runs[0][0], RoundKind.DELIBERATE, 2,
                AllowancePolicy(max_searches=10**9, max_rounds=10**9), WALL,
            )
            assert isinstance(result, Reservation)
            return result

    nxt = anyio.run(one_more, backend=backend)
    assert (nxt.round_index, nxt.first_slot) == (runs[0][1] + 1, runs[0][2] + 1)
