"""A server, database, role or connection string may set session defaults the ledger's results
depend on (``ALTER ROLE … SET``, ``PGOPTIONS``, ``options=-c …``, or a client that leaves a
``SET`` on a connection a transaction pooler lends on). Every transaction sets what it reads
by for itself:

- ``extra_float_digits``: times are read back as text; with fewer digits a later round's
  permit would outlive the run's deadline, and usage would report a made-up deadline;
- the isolation: under a default of REPEATABLE READ or SERIALIZABLE, two workers reserving a
  round of one run at once would take their snapshots before the run's lock, and one of them
  would fail to serialize: a round the allowance grants, lost.

Also: the options every ledger connection opens with (a connection string's ``connect_timeout``
of 0 waits forever in libpq; TCP keepalives find a partitioned server). On asyncio and trio,
against the test server (tests/_pg.py).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator

import anyio
import pytest

from plugin import AllowancePolicy, ManualClock, RecallAllowance, RoundKind
from plugin.control.postgres_ledger import PostgresLedger

from . import _pg

W0 = 1_796_634_856.0


@pytest.fixture
def schema() -> Iterator[str]:
    with _pg.fresh_schema("session") as name:
        yield name


def _with_option(option: str, schema: str) -> str:
    return f"{_pg.DSN}?options={urllib.parse.quote(option)}&schema={schema}"


@pytest.mark.anyio
@pytest.mark.parametrize("digits", [-6, -15])
async def test_fewer_float_digits_do_not_move_the_deadline(
    anyio_backend: object, schema: str, digits: int
) -> None:
    clock = ManualClock(wall=W0, monotonic=100.0)
    dsn = _with_option(f"-c extra_float_digits={digits}", schema)
    async with PostgresLedger(dsn, time_source="caller") as ledger:
        allowance = RecallAllowance(ledger, policy=AllowancePolicy(), clock=clock)
        async with allowance.round("run", RoundKind.AUTOMATIC) as first:
            assert first.seconds_left() == pytest.approx(10.0)
        clock.advance(5.0)
        async with allowance.round("run", RoundKind.DELIBERATE, slots=1) as second:
            assert second.seconds_left() == pytest.approx(5.0)
            clock.advance(6.0)  # a second past the run's deadline
            assert second.expired()
        usage = await ledger.usage("run")
        assert usage.deadline_wall == W0 + 10.0


@pytest.mark.anyio
@pytest.mark.parametrize("isolation", ["serializable", "repeatable read"])
async def test_a_default_isolation_loses_no_round(
    anyio_backend: object, schema: str, isolation: str
) -> None:
    escaped = isolation.replace(" ", "\\ ")  # libpq's options: a space in a value is escaped
    dsn = _with_option(f"-c default_transaction_isolation={escaped}", schema)
    granted, failed = 0, []
    ledgers = [PostgresLedger(dsn, max_size=4) for _ in range(2)]
    for ledger in ledgers:
        await ledger.open()
    try:
        allowances = [RecallAllowance(ledger, policy=AllowancePolicy()) for ledger in ledgers]

        async def one(allowance: RecallAllowance, run: str) -> None:
            nonlocal granted
            try:
                async with allowance.round(run, RoundKind.DELIBERATE, slots=1):
                    granted += 1
            except Exception as exc:  # pragma: no cover - the failure's message
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            for run in range(12):
                for allowance in allowances:
                    tg.start_soon(one, allowance, f"run-{run}")
        for run in range(12):
            usage = await ledgers[0].usage(f"run-{run}")
            assert (usage.rounds, usage.reserved) == (2, 2)
    finally:
        for ledger in ledgers:
            await ledger.aclose()
    assert failed == []
    assert granted == 24


@pytest.mark.parametrize(("dsn", "expected"), [
    ("host=127.0.0.1 dbname=db", {"keepalives": 1, "keepalives_idle": 10,
                                  "keepalives_interval": 5, "keepalives_count": 3,
                                  "tcp_user_timeout": 10_000}),
    ("host=127.0.0.1 dbname=db keepalives=0 tcp_user_timeout=500",
     {"keepalives": None, "keepalives_idle": 10, "tcp_user_timeout": None}),
    ("postgresql://u@127.0.0.1/db?keepalives_idle=60",
     {"keepalives": 1, "keepalives_idle": None}),
])
def test_connections_find_a_lost_server_unless_the_dsn_says_otherwise(
    dsn: str, expected: dict[str, int | None]
) -> None:
    """Keepalives and ``tcp_user_timeout`` (statement plus connect timeout, in milliseconds)
    fill in where the connection string names none: its own value stands (libpq reads it)."""
    from plugin.control._postgres_options import connection_options
    from plugin.control.dsn import conninfo_dict

    options = connection_options(conninfo_dict(dsn), name="t", connect_timeout=3.0,
                                 statement_timeout=7.0)
    assert {key: options.get(key) for key in expected} == expected
