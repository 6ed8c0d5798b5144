"""What the allowance state machine drives its steps with: a clock it moves by hand (the
monotonic reading too, backwards), one memory backend that records every search, the store
its ledgers open (a SQLite file, or a PostgreSQL schema of its own: directly, through
PgBouncer, or judged by the server's clock) and the rules only a PostgreSQL ledger has."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import attrs
import hypothesis.strategies as st
from hypothesis.stateful import precondition, rule
from psycopg import sql

from plugin import (
    Evidence,
    LedgerLockedError,
    LedgerUnavailableError,
    PostgresLedger,
    SimpleRetriever,
    SqliteLedger,
)
from runtime_hooks import RecallHooks, ToolCall

from . import _pg

P, S = "u1", "proj"
RUNS = ("ra", "rb")
CALL_IDS = ("c1", "c2", "c3", "c4")
QUERIES = ("alpha", "beta")
PICKS = st.lists(
    st.tuples(st.sampled_from(CALL_IDS), st.sampled_from(QUERIES)), min_size=1, max_size=4
)
"""One turn's search calls: (call id, query) pairs, some sent again."""
MEMORIES = [Evidence(id=f"m{i}", text=f"cutover note {i}", principal=P, scope=S) for i in range(2)]


def query_of(call: ToolCall) -> str:
    """The query text a call was built with (it names the run and the call)."""
    assert isinstance(call.arguments, dict)
    return str(call.arguments["query"])


@attrs.define
class Handle:
    ledger: Any
    hooks: RecallHooks


@attrs.define
class RunModel:
    deadline_wall: float
    cancelled: bool = False
    """Whether a step of this run was cancelled (a slot taken whose search never began)."""
    spawned: int = 0
    """Attempts taken by spawned tasks in the machine's ``spawn`` rule (no search text)."""


@attrs.define(eq=False)
class SteppedClock:
    """A clock the machine moves: both readings forward, the wall alone either way, and the
    monotonic reading alone backwards (a clock no host should have, that must not extend a
    permit either)."""

    _wall: float = 1_800_000_000.0
    _mono: float = 100.0
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def wall(self) -> float:
        with self._lock:
            return self._wall

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._wall += seconds
            self._mono += seconds

    def step_wall(self, seconds: float) -> None:
        with self._lock:
            self._wall += seconds

    def step_mono(self, seconds: float) -> None:
        with self._lock:
            self._mono += seconds


@attrs.define
class Search:
    run_id: str
    text: str
    wall: float
    mono: float
    round_wall: float
    round_mono: float


class World:
    """The one memory backend: records every search (with the clock's readings and the round
    it belongs to), may pass time inside a search, and may hold searches until cancelled."""

    def __init__(self, clock: SteppedClock) -> None:
        self.clock = clock
        self.searches: list[Search] = []
        self.round_at = (clock.wall(), clock.monotonic())
        self.real_at = time.time()
        self.slow_s = 0.0
        self.wall_step_s = 0.0
        self.hold = False
        self.held: anyio.Event | None = None
        self.retriever = SimpleRetriever(self.search, get=self.get)

    def begin_round(self, slow: tuple[float, float] = (0.0, 0.0), hold: bool = False) -> None:
        self.round_at = (self.clock.wall(), self.clock.monotonic())
        self.real_at = time.time()  # what the server's clock reads, on this host
        (self.slow_s, self.wall_step_s), self.hold = slow, hold

    def record(self, text: str) -> None:
        run_id = text.split(" ", 1)[0]
        self.searches.append(
            Search(run_id, text, self.clock.wall(), self.clock.monotonic(), *self.round_at)
        )

    async def search(self, request: Any) -> list[Evidence]:
        self.record(request.text)
        if self.hold:
            assert self.held is not None
            self.held.set()
            await anyio.sleep_forever()
        self.clock.advance(self.slow_s)
        self.clock.step_wall(self.wall_step_s)
        await anyio.lowlevel.checkpoint()
        return list(MEMORIES)

    async def get(self, evidence_id: str, *, principal: str, scope: str) -> Evidence | None:
        return next((m for m in MEMORIES if m.id == evidence_id), None)


# -- where the ledger lives: a SQLite file, or a PostgreSQL schema of its own -----------------


@attrs.define
class SqliteStore:
    """One SQLite file; every handle opens it (another process on the same host)."""

    folder: Path
    server_clock = False

    def ledger(self, lock_timeout: float | None = None) -> SqliteLedger:
        return SqliteLedger(self.folder / "ledger.sqlite3")


@attrs.define
class PgStore:
    """One fresh schema on the test server, reached directly or through PgBouncer; every
    handle is a :class:`PostgresLedger` with its own pool (another worker of the fleet).
    ``server_clock``: rounds judged by the server's clock (never below the floor the
    allowance passes), else by the injected clock's wall time."""

    dsn: str
    schema: str
    server_clock: bool = False

    def ledger(self, lock_timeout: float | None = None) -> PostgresLedger:
        return PostgresLedger(
            self.dsn, schema=self.schema, max_size=4,
            time_source="server" if self.server_clock else "caller",
            **({} if lock_timeout is None else {"lock_timeout": lock_timeout}))

    @contextlib.contextmanager
    def run_locked(self, run_id: str, space: int) -> Iterator[None]:
        """Another connection holds ``run_id``'s row of the runs table (``FOR UPDATE``) in
        an open transaction; a run with no row yet, its reservation lock."""
        with _pg.connect() as conn, conn.transaction():
            held = conn.execute(
                sql.SQL("SELECT 1 FROM {}.runs WHERE run_id = %s FOR UPDATE").format(
                    sql.Identifier(self.schema)), (run_id,)).fetchall()
            if not held:
                conn.execute("SELECT pg_advisory_xact_lock(%s::int4, hashtext(%s))",
                             (space, run_id))
            yield

    def kill_backends(self) -> int:
        """Terminate the server connections of every handle's pool (directly, or PgBouncer's
        behind them), waiting until each has ended; how many there were."""
        with _pg.connect() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND application_name = %s", (f"recallbound-{self.schema}",)).fetchall()
        return len(rows)


def make_store(kind: str, stack: contextlib.ExitStack) -> SqliteStore | PgStore:
    """A new, empty store of ``kind``: ``sqlite``, ``postgres`` (judged by the caller's
    clock), ``postgres-server`` (by the server's) or ``pgbouncer`` (the caller's, through
    PgBouncer in transaction mode); removed when ``stack`` closes."""
    if kind == "sqlite":
        folder = Path(tempfile.mkdtemp(prefix="allowance-machine-"))
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        return SqliteStore(folder)
    return PgStore(_pg.pooled_dsn() if kind == "pgbouncer" else _pg.DSN,
                   stack.enter_context(_pg.fresh_schema("machine")),
                   server_clock=kind == "postgres-server")


# -- what only a PostgreSQL ledger meets -------------------------------------------------------


def _on_postgres(machine: Any) -> bool:
    return isinstance(machine.store, PgStore)


class PgRules:
    """The machine's rules for what only a fleet's ledger meets: a run's row held by another
    connection while a turn is sent, and the server ending the pools' connections."""

    store: SqliteStore | PgStore
    world: World
    portal: Any

    @precondition(_on_postgres)
    @rule(run_id=st.sampled_from(RUNS), picks=PICKS)
    def dispatch_while_locked(self, run_id: str, picks: list[tuple[str, str]]) -> None:
        """Another connection holds the run's row (or, before its first round, its lock)
        while a worker whose ``lock_timeout`` is short sends a turn: a typed ledger error,
        nothing searched; the claims are withdrawn, so the same calls sent later run. Calls
        all answered before are answered from their records, without a lock."""
        assert isinstance(self.store, PgStore)
        machine: Any = self
        calls, searched = machine._calls(run_id, picks), len(self.world.searches)
        self.world.begin_round()
        handle = self.portal.call(machine._open, 0.3)
        try:
            with self.store.run_locked(run_id, handle.ledger._space):
                results = self.portal.call(self._send_locked, handle, calls, run_id)
        finally:
            self.portal.call(handle.ledger.aclose)
        assert len(self.world.searches) == searched, self.world.searches[searched:]
        if results is not None:
            machine._check_answers(run_id, calls, results)

    @staticmethod
    async def _send_locked(handle: Any, calls: list[Any], run_id: str) -> list[Any] | None:
        try:
            return list(await handle.hooks.dispatch(calls, run_id=run_id, scope=S, principal=P))
        except (LedgerLockedError, LedgerUnavailableError):
            return None

    @precondition(_on_postgres)
    @rule()
    def kill_backends(self) -> None:
        """The server ends every pooled connection (an operator's ``pg_terminate_backend``, a
        failover) between steps: the next step runs on new ones, and nothing is lost."""
        assert isinstance(self.store, PgStore)
        self.store.kill_backends()
