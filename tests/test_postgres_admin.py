"""What only the PostgreSQL admin has: the server's clock guarding a prune, row locks keeping a
prune and the fleet's reservations apart, a prune as one transaction, a damaged schema, and
opening for an operator (no new schema, errors on one line without the password).

The shared admin contract is tests/test_ledger_admin_contract.py. Every test runs on asyncio and
trio against the test server (tests/_pg.py: its own schema, dropped afterwards; no skip).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from plugin import PostgresLedger
from plugin.control import (
    AllowancePolicy,
    BudgetRefusal,
    RefusalReason,
    Reservation,
    RoundKind,
)
from plugin.control.ledger_admin import LedgerAdmin
from plugin.control.postgres_admin import PostgresAdmin
from plugin.control.postgres_ledger import redact_dsn
from plugin.errors import (
    LedgerConfigError,
    LedgerLockedError,
    LedgerPathError,
    LedgerUnavailableError,
)
from runtime_hooks.ledgers import (
    admin_for,
    open_ledger,
    redact_location,
    split_postgres_location,
)

from . import _pg

pytestmark = pytest.mark.anyio

WALL = 1_700_000_000.0
POLICY = AllowancePolicy()  # 4 searches, 2 rounds, 10 s
AUTO = RoundKind.AUTOMATIC
FAR = 10.0**12  # a cutoff and a "now" beyond every deadline by the caller's reckoning


@pytest.fixture
def schema() -> Iterator[str]:
    with _pg.fresh_schema("pgadmin") as name:
        yield name


def _sql(statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with _pg.connect() as conn:
        cur = conn.execute(statement.encode(), params or None)
        return cur.fetchall() if cur.description else []


def _waiting(schema: str) -> int:
    """How many of the ledger's connections wait for another transaction's row lock."""
    ((count,),) = _sql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
        "AND wait_event_type = 'Lock'", f"recallbound-{schema}")
    return int(count)


async def _until(condition: Any) -> None:
    """Poll for a state of the server (another connection's), not for a time."""
    with anyio.fail_after(20):
        while not await anyio.to_thread.run_sync(condition):
            await anyio.sleep(0.01)


def _admin(ledger: PostgresLedger) -> LedgerAdmin:
    admin = admin_for(ledger)
    assert isinstance(admin, PostgresAdmin) and admin.ledger is ledger
    return admin


async def _old_run(schema: str, run_id: str = "old") -> None:
    """A run that finished long ago (by explicit caller times) with one attempt traced."""
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        assert isinstance(await ledger.reserve(run_id, AUTO, 2, POLICY, WALL), Reservation)


# -- the server's clock ---------------------------------------------------------------------


async def test_a_server_clock_ledger_never_prunes_a_run_open_by_the_server_clock(
    schema: str,
) -> None:
    await _old_run(schema)
    async with PostgresLedger(_pg.DSN, schema=schema) as ledger:  # judged by the server
        live = await ledger.reserve("live", AUTO, 2, POLICY, 0.0)  # `now` is ignored
        assert isinstance(live, Reservation)
        assert live.deadline_wall > time.time()  # the server's deadline, 10 s away
        # An operator whose clock reads year 33658 asks for everything: only "old" goes.
        report = await _admin(ledger).prune(before_wall=FAR, now_wall=FAR, dry_run=False)
        assert report.run_ids == ("old",)
        assert [r.run_id for r in await _admin(ledger).runs(limit=5)] == ["live"]
        dry = await _admin(ledger).prune(before_wall=FAR, now_wall=FAR, dry_run=True)
        assert dry.run_ids == ()
    # Judged by the caller's times, the ledger's own clock is the newest time it recorded
    # ("live" opened, by the server's clock): that holds the operator's clock back too.
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        report = await _admin(ledger).prune(before_wall=FAR, now_wall=FAR, dry_run=True)
        assert report.run_ids == ()


async def test_a_server_clock_ledger_still_honours_the_callers_now(schema: str) -> None:
    await _old_run(schema)
    async with PostgresLedger(_pg.DSN, schema=schema) as ledger:
        # by the caller's `now`, "old" (deadline WALL+10) has not finished yet: kept
        report = await _admin(ledger).prune(before_wall=FAR, now_wall=WALL + 5, dry_run=False)
        assert report.run_ids == ()
        assert [r.run_id for r in await _admin(ledger).runs(limit=5)] == ["old"]


# -- a prune and the fleet -----------------------------------------------------------------


async def test_a_prune_is_one_transaction(schema: str) -> None:
    await _old_run(schema)
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller",
                              lock_timeout=0.2) as ledger:
        await ledger.retain("old", ["m1"], limit=4)
        # the ledger's own records reach past the old run's deadline: it may be pruned
        assert isinstance(await ledger.reserve("later", AUTO, 2, POLICY, WALL + 1000),
                          Reservation)
        with _pg.connect() as holder:
            holder.execute("BEGIN")
            # a row the prune must delete after the run's own row, held elsewhere
            holder.execute(f'SELECT * FROM "{schema}".retained FOR UPDATE')
            with pytest.raises(LedgerLockedError):
                await _admin(ledger).prune(before_wall=FAR, now_wall=FAR, dry_run=False)
            holder.execute("ROLLBACK")
        # nothing was removed: not the run, not its round
        summary = await _admin(ledger).run("old")
        assert summary is not None and summary.rounds == 1
        assert len(await ledger.reservations("old")) == 1
        assert (await _admin(ledger).check()).ok


async def test_a_reservation_waits_for_a_prune_of_its_run_then_meets_its_tombstone(
    schema: str,
) -> None:
    await _old_run(schema)
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller",
                              max_size=3) as ledger:
        await ledger.retain("old", ["m1"], limit=4)
        # the ledger's own records reach past the old run's deadline: it may be pruned
        assert isinstance(await ledger.reserve("later", AUTO, 2, POLICY, WALL + 20),
                          Reservation)
        results: dict[str, Any] = {}

        async def prune() -> None:
            results["prune"] = await _admin(ledger).prune(before_wall=WALL + 20,
                                                          now_wall=WALL + 20, dry_run=False)

        async def reserve() -> None:
            # Past the old deadline: refused, before the prune or after (its tombstone).
            results["reserve"] = await ledger.reserve("old", AUTO, 2, POLICY, WALL + 30)

        with _pg.connect() as holder:
            holder.execute("BEGIN")
            holder.execute(f'SELECT * FROM "{schema}".retained FOR UPDATE')
            async with anyio.create_task_group() as tg:
                tg.start_soon(prune)  # holds the run's row, then waits for `retained`
                await _until(lambda: _waiting(schema) == 1)
                tg.start_soon(reserve)  # waits for the prune's row lock on the run
                await _until(lambda: _waiting(schema) == 2)
                holder.execute("COMMIT")
        assert results["prune"].run_ids == ("old",)
        assert results["prune"].rows["retained"] == 1
        refused = results["reserve"]
        assert isinstance(refused, BudgetRefusal)
        assert refused.reason in (RefusalReason.DEADLINE, RefusalReason.ROUNDS)
        assert (await ledger.usage("old")).rounds == POLICY.max_rounds  # the spent tombstone
        assert (await _admin(ledger).check()).problems == ()


# -- check on a damaged schema --------------------------------------------------------------


async def test_check_reports_a_missing_table(schema: str) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        _sql(f'DROP TABLE "{schema}".retained')
        result = await _admin(ledger).check()
    assert result.problems == ("missing table(s): retained",)
    assert result.backend == "postgresql" and not result.ok


async def test_check_reports_a_missing_function(schema: str) -> None:
    # every reservation would fail closed; the check must not call that ledger sound
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        _sql(f'DROP FUNCTION "{schema}".reserve_lone')
        _sql(f'DROP FUNCTION "{schema}".reserve_wave')
        result = await _admin(ledger).check()
    assert result.problems == ("missing function(s): reserve_wave, reserve_lone",)
    assert not result.ok


async def test_check_reports_a_damaged_table_as_unreadable(schema: str) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        _sql(f'ALTER TABLE "{schema}".rounds DROP COLUMN slots')
        result = await _admin(ledger).check()
    (problem,) = result.problems
    assert problem.startswith("unreadable: ") and "slots" in problem and "\n" not in problem


async def test_check_reports_a_foreign_application(schema: str) -> None:
    async with PostgresLedger(_pg.DSN, schema=schema, time_source="caller") as ledger:
        _sql(f"UPDATE \"{schema}\".recallbound_meta SET application = 'other'")
        result = await _admin(ledger).check()
    assert result.problems == ("application 'other' is not a recallbound ledger's",)


async def test_check_names_the_location_without_the_password(schema: str) -> None:
    scheme, _, rest = _pg.DSN.partition("://")
    user, at, host = rest.rpartition("@")
    dsn = f"{scheme}://{user.split(':')[0] if at else 'root'}:hunter2@{host}"
    async with PostgresLedger(dsn, schema=schema) as ledger:  # trust auth ignores it
        result = await _admin(ledger).check()
    assert result.ok and "hunter2" not in result.location
    assert result.location.endswith(f"(schema {schema})") and ":***@" in result.location


def test_redact_dsn() -> None:
    assert redact_dsn("postgresql://u:p%40ss@h:5/db") == "postgresql://u:***@h:5/db"
    assert redact_dsn("postgresql://h/db?password=x&sslmode=require") == (
        "postgresql://h/db?password=***&sslmode=require")
    assert redact_dsn("host=h password='a b' user=u") == "host=h password=*** user=u"
    assert redact_dsn("postgresql://u@h/db") == "postgresql://u@h/db"


# -- opening for an operator ---------------------------------------------------------------


async def test_an_operator_never_creates_a_schema(schema: str) -> None:
    with pytest.raises(LedgerPathError, match=f"no recallbound ledger in schema '{schema}'"):
        async with PostgresLedger(_pg.DSN, schema=schema, create=False):
            pass  # pragma: no cover
    assert _sql("SELECT count(*) FROM pg_namespace WHERE nspname = %s", schema) == [(0,)]
    with pytest.raises(LedgerPathError):
        async with open_ledger(f"{_pg.DSN}?schema={schema}", must_exist=True):
            pass  # pragma: no cover
    async with open_ledger(f"{_pg.DSN}?schema={schema}") as ledger:  # the bootstrap creates
        assert isinstance(ledger, PostgresLedger) and ledger.schema == schema
    async with open_ledger(f"{_pg.DSN}?schema={schema}", must_exist=True) as ledger:
        assert isinstance(ledger, PostgresLedger)


async def test_an_unreachable_server_is_one_line_without_the_password(
    anyio_backend: object,
) -> None:
    ledger = PostgresLedger("postgresql://u:s3cr3t@127.0.0.1:1/test", connect_timeout=2.0)
    with pytest.raises(LedgerUnavailableError) as caught:
        await ledger.open()
    message = str(caught.value)
    assert "\n" not in message and "s3cr3t" not in message
    assert "127.0.0.1" in message and "port 1" in message  # libpq's reason, not a pool timeout


def test_the_schema_parameter_is_taken_out_of_the_dsn() -> None:
    assert PostgresLedger(_pg.DSN).schema == "recallbound"  # without the parameter
    assert split_postgres_location("postgresql://h/db") == ("postgresql://h/db", None)
    assert split_postgres_location("postgresql://h/db?schema=fleet") == (
        "postgresql://h/db", "fleet")
    assert split_postgres_location("postgres://h/db?sslmode=require&schema=a&connect_timeout=3"
                                   ) == ("postgres://h/db?sslmode=require&connect_timeout=3", "a")
    assert redact_location("postgresql://u:pw@h/db?schema=a&password=x&sslmode=require") == (
        "postgresql://u:***@h/db?schema=a&password=***&sslmode=require")
    for bad in ("postgresql://h/db?schema=a&schema=b", "postgresql://h/db?schema="):
        with pytest.raises(LedgerConfigError, match="schema"):
            split_postgres_location(bad)


async def test_a_bad_schema_name_in_the_dsn_is_a_config_error(anyio_backend: object) -> None:
    with pytest.raises(LedgerConfigError, match="lowercase identifier"):
        async with open_ledger(f"{_pg.DSN}?schema=Robert');DROP"):
            pass  # pragma: no cover
