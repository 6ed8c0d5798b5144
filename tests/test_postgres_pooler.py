"""Through PgBouncer in transaction mode, a ledger between operations holds no server connection.

PgBouncer lends a server connection to a client from its first message to the end of its
transaction (a ``ReadyForQuery`` that says idle). Any message after that, even one with no
reply such as the extended protocol's ``Flush``, takes a server again and keeps it until the
client's next query: a ledger's idle pooled connection would then pin one of the pooler's few
servers, every other client would queue behind it, and PgBouncer would drop the queued ones at
``query_wait_timeout`` (a two-minute stall, then "server closed the connection"). psycopg's
pipeline mode sends exactly such a ``Flush`` after its closing ``Sync`` whenever the results
had not all arrived when it sent the ``Sync``; a busy host makes the ``Flush`` late. The test
makes it late on purpose.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg._pipeline_base
import pytest

from plugin import AllowancePolicy
from plugin.control.ledger import Reservation, RoundKind
from plugin.control.postgres_ledger import PostgresLedger

from ._pg import fresh_schema, pooled_dsn

pytestmark = pytest.mark.anyio

POLICY = AllowancePolicy()


@pytest.fixture
def schema() -> Iterator[str]:
    with fresh_schema("pooler") as name:
        yield name


@pytest.fixture
def late_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever ``Flush`` a pipeline sends after its ``Sync`` leaves 50 ms late, as on a host
    whose threads wait for the interpreter."""
    fetch = psycopg._pipeline_base.BasePipeline._fetch_gen

    def late(self: Any, *, flush: bool) -> Any:
        if flush:
            time.sleep(0.05)
        return (yield from fetch(self, flush=flush))

    monkeypatch.setattr(psycopg._pipeline_base.BasePipeline, "_fetch_gen", late)


def _servers_lent(application: str) -> int:
    """How many of PgBouncer's server connections are lent to clients named ``application``."""
    admin = urllib.parse.urlsplit(pooled_dsn())._replace(path="/pgbouncer").geturl()
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute("SHOW CLIENTS", prepare=False)
        names = [column.name for column in cur.description or ()]
        clients = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    return sum(1 for c in clients if c["application_name"] == application and c["link"])


@pytest.mark.parametrize("time_source", ["server", "caller"])
async def test_an_idle_ledger_holds_no_server_of_the_pooler(
    schema: str, late_flush: None, time_source: Any
) -> None:
    async with PostgresLedger(pooled_dsn(), schema=schema, time_source=time_source,
                              min_size=2, max_size=2) as ledger:
        for i in range(3):
            result = await ledger.reserve(f"run-{i}", RoundKind.AUTOMATIC, 2, POLICY,
                                          1_700_000_000.0 + i)
            assert isinstance(result, Reservation)
            await ledger.usage(f"run-{i}")
        # Every operation has returned: none of the ledger's connections is in a transaction.
        assert _servers_lent(f"recallbound-{schema}") == 0
