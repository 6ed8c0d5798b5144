"""A pool whose idle connections the server ended (a restart, a failover, an operator's
``pg_terminate_backend``): the next operation runs at once on a new connection.

Every connection the pool lends is checked first, without a round trip; one found lost is
replaced. Finding one lost must not make the checkout wait before trying the next: after a
restart every idle connection is lost, and a pool of many would otherwise wait seconds per
connection, past ``pool_timeout``, and fail a round on a server that is up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import anyio
import pytest

from plugin import PostgresLedger
from plugin.control import AllowancePolicy, Reservation, RoundKind

from . import _pg

pytestmark = pytest.mark.anyio

POLICY = AllowancePolicy()


@pytest.fixture
def schema() -> Iterator[str]:
    with _pg.fresh_schema("lost") as name:
        yield name


def _terminate(schema: str) -> int:
    """End every connection of the ledger's pool, waiting until each has ended."""
    with _pg.connect() as conn:
        return len(conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE application_name = %s", (f"recallbound-{schema}",)).fetchall())


@pytest.mark.parametrize("idle", [2, 6])
async def test_a_round_after_every_idle_connection_was_ended_is_granted_at_once(
    schema: str, idle: int
) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema, min_size=idle,
                              time_source="caller") as ledger:
        assert isinstance(await ledger.reserve("run", RoundKind.AUTOMATIC, 2, POLICY, 100.0),
                          Reservation)
        assert _terminate(schema) == idle
        began = time.monotonic()
        with anyio.fail_after(30):
            granted = await ledger.reserve("run", RoundKind.DELIBERATE, 1, POLICY, 101.0)
        waited = time.monotonic() - began
        assert isinstance(granted, Reservation), granted
        assert (granted.round_index, granted.first_slot) == (2, 3)
        assert waited < 0.8, f"the checkout waited {waited:.2f} s for lost connections"
        assert (await ledger.usage("run")).rounds == 2
