"""A fleet on one PostgreSQL ledger: real worker processes, SIGKILL, a server restart.

Each child runs ``tests/_pg_fleet_worker.py`` (see its docstring) on its own pool, half of them
on asyncio and half on trio, judged by the server's clock. The parent checks the raw tables
(every run: rounds numbered 1.., slots contiguous, ``executed <= reserved <= max_searches``,
``rounds <= max_rounds``, attempts in distinct slots of their round) and what the workers
reported against them.

Size: ``RECALLBOUND_FLEET_WORKERS`` x ``RECALLBOUND_FLEET_RUNS`` (default 8 x 500, the
full size).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugin import PostgresLedger

from . import _pg

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

WORKER = Path(__file__).with_name("_pg_fleet_worker.py")
TIMEOUT = 300.0
BACKENDS = ("asyncio", "trio")
WORKERS = int(os.environ.get("RECALLBOUND_FLEET_WORKERS", "8"))
RUNS = int(os.environ.get("RECALLBOUND_FLEET_RUNS", "500"))


class Child:
    """A worker process whose JSON lines a thread collects as they come."""

    def __init__(self, mode: str, **args: Any) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), mode, json.dumps(args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.events: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_errors, daemon=True)
        self._err_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def _read_errors(self) -> None:
        assert self.proc.stderr is not None
        self.errors.extend(self.proc.stderr)

    def reap(self) -> None:
        self.proc.wait(timeout=TIMEOUT)
        self._reader.join(timeout=10)
        self._err_reader.join(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def wait_for(self, predicate: Any, what: str) -> None:
        deadline = time.monotonic() + 120.0
        while not predicate(self.events):
            if self.proc.poll() is not None:
                self.reap()
                if predicate(self.events):
                    return
                err = "".join(self.errors)
                pytest.fail(f"worker exited ({self.proc.returncode}) before {what}:\n{err}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker never reached {what}")
            time.sleep(0.02)

    def finish(self) -> list[dict[str, Any]]:
        self.reap()
        assert self.proc.returncode == 0, "".join(self.errors)
        return self.events

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e["event"] == event]


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Children to reap whatever happens (killed, never left running)."""
    procs: list[Child] = []
    yield procs
    for child in procs:
        if child.proc.poll() is None:
            child.proc.kill()
        child.reap()


@pytest.fixture
def schema() -> Iterator[str]:
    with _pg.fresh_schema("fleet") as name:
        yield name


def _rows(statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with _pg.connect() as conn:
        return conn.execute(statement.encode(), params or None).fetchall()


def _check_ledger(schema: str, *, max_searches: int, max_rounds: int) -> dict[str, Any]:
    """Every run's invariants, straight from the tables; returns the rounds by run."""
    s = f'"{schema}"'
    runs = _rows(f"SELECT run_id, rounds, reserved, max_searches, max_rounds FROM {s}.runs")
    rounds: dict[str, list[tuple[int, int, int]]] = {}
    for run_id, index, first, slots in _rows(
        f"SELECT run_id, round_index, first_slot, slots FROM {s}.rounds "
        "ORDER BY run_id, round_index"
    ):
        rounds.setdefault(run_id, []).append((index, first, slots))
    attempts: dict[str, list[tuple[int, int]]] = {}
    for run_id, index, slot in _rows(
        f"SELECT run_id, round_index, slot FROM {s}.attempts WHERE NOT legacy"
    ):
        attempts.setdefault(run_id, []).append((index, slot))
    assert runs
    for run_id, n_rounds, reserved, run_max_searches, run_max_rounds in runs:
        mine = rounds.get(run_id, [])
        assert (run_max_searches, run_max_rounds) == (max_searches, max_rounds)
        assert 1 <= n_rounds <= max_rounds, run_id
        assert [r[0] for r in mine] == list(range(1, n_rounds + 1)), run_id
        assert [r[1] for r in mine] == [1 + sum(r[2] for r in mine[:i]) for i in range(len(mine))]
        assert reserved == sum(r[2] for r in mine) <= max_searches, run_id
        done = attempts.get(run_id, [])
        assert len(done) <= reserved, run_id  # executed <= reserved
        assert len({slot for _, slot in done}) == len(done), run_id
        spans = {index: range(first, first + slots) for index, first, slots in mine}
        assert all(slot in spans[index] for index, slot in done), run_id
    return rounds


def _wait_for_server() -> None:
    for _ in range(120):
        ready = subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"], check=False)
        if ready.returncode == 0:
            return
        time.sleep(0.5)
    pytest.fail("PostgreSQL did not come back")


# -- 8 workers x 500 runs, every run resumed on other workers --------------------------------


def test_a_fleet_never_over_admits_a_run(schema: str, children: list[Child]) -> None:
    policy = {"max_searches": 4, "max_rounds": 2, "deadline_s": 3600.0}
    for w in range(WORKERS):
        children.append(Child(
            "fleet", dsn=_pg.DSN, schema=schema, backend=BACKENDS[w % 2], worker=w,
            workers=WORKERS, runs=RUNS, seed=11, concurrency=8, policy=policy,
        ))
    reports = [child.finish()[-1] for child in children]
    assert sorted(r["backend"] for r in reports) == sorted(
        BACKENDS[w % 2] for w in range(WORKERS))

    rounds = _check_ledger(schema, max_searches=4, max_rounds=2)
    assert len(rounds) == RUNS
    # What the workers were granted is exactly what the ledger holds, and every attempt a
    # worker ran is a distinct slot of its grant.
    granted: dict[str, list[tuple[int, int, int]]] = {}
    by_worker: dict[str, set[int]] = {}
    for w, report in enumerate(reports):
        for g in report["granted"]:
            granted.setdefault(g["run_id"], []).append(
                (g["round_index"], g["first_slot"], g["slots"]))
            by_worker.setdefault(g["run_id"], set()).add(w)
            assert g["taken"] == list(range(g["first_slot"], g["first_slot"] + len(g["taken"])))
    assert {run: sorted(v) for run, v in granted.items()} == rounds
    executed = _rows(f'SELECT count(*) FROM "{schema}".attempts')[0][0]
    assert executed == sum(len(g["taken"]) for r in reports for g in r["granted"])
    # Resumed on another worker: a run's second round came from another process.
    two_rounds = [run for run, got in granted.items() if len(got) == 2]
    assert two_rounds and all(len(by_worker[run]) == 2 for run in two_rounds)
    attempts_made = WORKERS * RUNS
    refused = sum(sum(r["refused"].values()) for r in reports)
    assert refused == attempts_made - sum(len(v) for v in rounds.values())
    assert set().union(*(r["refused"] for r in reports)) <= {"rounds", "slots"}


# -- SIGKILL mid-attempt, resume on another worker --------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_mid_attempt_loses_nothing_committed_and_resume_stays_bounded(
    schema: str, children: list[Child], backend: str
) -> None:
    policy = {"max_searches": 4, "max_rounds": 3, "deadline_s": 3600.0}
    holder = Child("hold", dsn=_pg.DSN, schema=schema, backend=backend, run_id="run",
                   slots=3, policy=policy)
    children.append(holder)
    holder.wait_for(lambda ev: ev, "its reservation")
    (reserved,) = holder.of("reserved")
    assert (reserved["round_index"], reserved["first_slot"], reserved["slots"]) == (1, 1, 3)
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait(timeout=TIMEOUT)
    assert holder.proc.returncode == -signal.SIGKILL

    # the committed round is there; the attempt in flight was never written
    assert _rows(f'SELECT rounds, reserved FROM "{schema}".runs') == [(1, 3)]
    assert _rows(f'SELECT count(*) FROM "{schema}".attempts') == [(0,)]

    other = "trio" if backend == "asyncio" else "asyncio"
    resumer = Child("resume", dsn=_pg.DSN, schema=schema, backend=other, run_id="run",
                    slots=4, policy={"max_searches": 50, "max_rounds": 9})
    children.append(resumer)
    (resumed,) = resumer.finish()
    assert (resumed["old_rounds"], resumed["round_index"], resumed["first_slot"],
            resumed["slots"], resumed["taken"]) == (1, 2, 4, 1, [4])
    _check_ledger(schema, max_searches=4, max_rounds=3)
    assert _rows(f'SELECT rounds, reserved FROM "{schema}".runs') == [(2, 4)]
    # no transaction of the killed worker is left behind
    assert _rows("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                 "AND state LIKE 'idle in transaction%%'", f"recallbound-{schema}") == [(0,)]


# -- the server restarted mid-run -------------------------------------------------------------


def test_a_server_restart_fails_the_permit_in_flight_and_loses_nothing(
    schema: str, children: list[Child], tmp_path: Path
) -> None:
    policy = {"max_searches": 6, "max_rounds": 4, "deadline_s": 3600.0}
    stop = tmp_path / "stop"
    streams = [
        Child("stream", dsn=_pg.DSN, schema=schema, backend=BACKENDS[i % 2], runs=2000,
              seed=100 + i, stop=str(stop), policy=policy, pool_timeout=30.0)
        for i in range(4)
    ]
    children.extend(streams)
    space = PostgresLedger(_pg.DSN, schema=schema)._space
    blocked: Child | None = None
    holder = _pg.connect()
    try:
        for child in streams:
            child.wait_for(lambda ev: sum(e["event"] == "granted" for e in ev) >= 10, "grants")
        # One reservation surely in flight: it waits inside its transaction for the run's
        # lock, which this connection holds until the restart ends it.
        holder.execute("SELECT pg_advisory_lock(%s::int4, hashtext('blocked'))", (space,))
        blocked = Child("one", dsn=_pg.DSN, schema=schema, backend="trio", run_id="blocked",
                        policy=policy, pool_timeout=30.0)
        children.append(blocked)
        deadline = time.monotonic() + TIMEOUT
        # Wait for this run's lock to have a waiter: the stream workers wait on advisory
        # locks of their own too, so a wait event alone can name one of theirs.
        while not _rows("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                        "AND objsubid = 2 AND classid::int8 = (%s::int8 & 4294967295) "
                        "AND objid::int8 = (hashtext('blocked')::int8 & 4294967295)", space):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        before = [len(child.of("granted")) for child in streams]
        _pg.restart_server()
    finally:
        _wait_for_server()
        holder.close()
    assert blocked is not None
    blocked.wait_for(lambda ev: any(e["event"] == "granted" for e in ev), "a grant")
    for child, seen in zip(streams, before, strict=True):
        child.wait_for(lambda ev, seen=seen: sum(e["event"] == "granted" for e in ev) >= seen + 10,
                       "grants after the restart")
    stop.touch()
    for child in streams:
        child.finish()
    events = blocked.finish()

    # The reservation in flight failed closed: an error, no permit; the retry got round 1.
    assert events[1]["event"] == "failed"
    assert events[1]["error"] == "LedgerUnavailableError"
    assert [e["event"] for e in events[1:]].count("granted") == 1
    assert (events[-1]["round_index"], events[-1]["first_slot"]) == (1, 1)
    failures = [e for child in streams for e in child.of("failed")]
    assert {e["error"] for e in failures} <= {"LedgerUnavailableError"}

    # Nothing committed was lost: every permit any worker was issued is in the ledger.
    rounds = _check_ledger(schema, max_searches=6, max_rounds=4)
    for child in [*streams, blocked]:
        for g in child.of("granted"):
            assert (g["round_index"], g["first_slot"], g["slots"]) in rounds[g["run_id"]], g
