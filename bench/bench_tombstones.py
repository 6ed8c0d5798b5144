"""Bytes a pruned run leaves in a ledger: its tombstone, on SQLite and PostgreSQL.

Run from the repository root: ``python -m bench.bench_tombstones``. Opens ``RUNS`` runs (one
automatic round each, run ids of 30 characters), prunes them all, compacts the storage and
reports the size of what is left of them (the ``runs`` table and its primary-key index) per
pruned run. Needs the PostgreSQL server of ``RECALLBOUND_TEST_PG_DSN`` (default
``postgresql://root@127.0.0.1:5432/test``); it works in a schema of its own, dropped after.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import anyio
import psycopg

from plugin.control import AllowancePolicy, PostgresLedger, RoundKind, SqliteLedger

DSN = os.environ.get("RECALLBOUND_TEST_PG_DSN", "postgresql://root@127.0.0.1:5432/test")
RUNS = 5000
TASKS = 50
POLICY = AllowancePolicy()


async def _open_and_prune(ledger: Any) -> None:
    async def task(first: int) -> None:
        for i in range(first, RUNS, TASKS):
            run_id = f"run-{i:09d}-{secrets.token_hex(8)}"  # 30 characters
            await ledger.reserve(run_id, RoundKind.AUTOMATIC, 2, POLICY, 1000.0 + i * 1e-4)

    async with anyio.create_task_group() as tg:
        for first in range(TASKS):
            tg.start_soon(task, first)
    # A later run: the ledger's own clock passes every deadline (it prunes nothing younger).
    await ledger.reserve("later", RoundKind.AUTOMATIC, 2, POLICY, 1e6)
    report = await ledger.admin().prune(before_wall=1e5, now_wall=1e6, dry_run=False)
    assert len(report.run_ids) == RUNS


async def sqlite_bytes(folder: Path) -> float:
    path = folder / "tombstones.sqlite3"
    async with SqliteLedger(path) as ledger:
        await _open_and_prune(ledger)
    conn = sqlite3.connect(path)
    try:
        conn.execute("VACUUM")
        (size,) = conn.execute("SELECT sum(pgsize) FROM dbstat WHERE name IN "
                               "('runs', 'sqlite_autoindex_runs_1')").fetchone()
    finally:
        conn.close()
    return float(size) / RUNS


async def postgres_bytes(schema: str) -> float:
    async with PostgresLedger(DSN, schema=schema, time_source="caller") as ledger:
        await _open_and_prune(ledger)
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f'VACUUM FULL "{schema}".runs'.encode())
        row = conn.execute(f"SELECT pg_total_relation_size('\"{schema}\".runs')".encode()
                           ).fetchone()
    assert row is not None
    return float(row[0]) / RUNS


def main() -> None:
    schema = "bench_tombstones_" + secrets.token_hex(4)
    try:
        with tempfile.TemporaryDirectory() as folder:
            lite = anyio.run(sqlite_bytes, Path(folder))
        pg = anyio.run(postgres_bytes, schema)
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())
    print(f"bytes per pruned run ({RUNS} runs, run ids of 30 characters):")
    print(f"  SQLite      {lite:6.0f}")
    print(f"  PostgreSQL  {pg:6.0f}")


if __name__ == "__main__":
    main()
