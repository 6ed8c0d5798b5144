"""PostgresLedger's own timeouts hold on every path: a lone reservation judged by the server's
clock (one round trip) is bounded by ``statement_timeout`` as a batch is.

The test server (tests/_pg.py: a schema of its own, dropped afterwards; no skip), asyncio and
trio. A lock held by another connection stands for a statement that does not answer: the lock
wait is bounded by the far longer ``lock_timeout``, so only ``statement_timeout`` can end it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import anyio
import pytest

from plugin import PostgresLedger
from plugin.control import AllowancePolicy, ManualClock, RecallAllowance, RoundKind
from plugin.errors import LedgerUnavailableError

from . import _pg

pytestmark = pytest.mark.anyio


@pytest.fixture
def schema() -> Iterator[str]:
    with _pg.fresh_schema("h7to") as name:
        yield name


async def test_a_lone_reservation_by_the_servers_clock_is_bounded_by_statement_timeout(
    schema: str,
) -> None:
    async with PostgresLedger(
        _pg.DSN, schema=schema, statement_timeout=0.3, lock_timeout=20.0
    ) as ledger:
        allowance = RecallAllowance(
            ledger, policy=AllowancePolicy(), clock=ManualClock(wall=time.time())
        )
        async with allowance.round("run", RoundKind.AUTOMATIC):
            pass
        with _pg.connect() as holder:
            # the run's lock, held elsewhere: the reservation waits inside its statement
            holder.execute("SELECT pg_advisory_lock(%s::int4, hashtext('run'))", (ledger._space,))
            started = time.monotonic()
            with (
                anyio.fail_after(30),
                pytest.raises(LedgerUnavailableError, match="statement_timeout"),
            ):
                async with allowance.round("run", RoundKind.DELIBERATE, slots=1):
                    pytest.fail("no permit for a reservation that never answered")
            waited = time.monotonic() - started
            holder.execute("SELECT pg_advisory_unlock_all()")
        assert waited < 10.0, f"waited {waited:.1f} s past a statement_timeout of 0.3 s"
        usage = await ledger.usage("run")
        assert (usage.rounds, usage.reserved) == (1, 2)  # nothing of it was committed
