"""A run id is validated once, where it enters any public ledger method, on every ledger.

A 10 MB run id, a lone surrogate or a NUL is the typed misuse error (``InvalidArgumentError``, a
``ValueError``) on SQLite and PostgreSQL alike, never a raw ``UnicodeEncodeError``, a
``LedgerError`` or a ``LedgerUnavailableError`` that reads as an outage. Both loops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from plugin.control import AllowancePolicy, RoundKind, SqliteLedger
from plugin.errors import InvalidArgumentError, RecallboundError
from runtime_hooks.ledgers import open_ledger

from . import _pg

pytestmark = pytest.mark.anyio

BAD_RUN_IDS = ["r" * 10_000_000, "run\ud800", "run\x00id", "", "   "]

Call = Callable[[Any, str], Awaitable[object]]
CALLS: dict[str, Call] = {
    "bind_identity": lambda ledger, run: ledger.bind_identity(run, principal="p", scope="s"),
    "usage": lambda ledger, run: ledger.usage(run),
    "retain": lambda ledger, run: ledger.retain(run, ["m1"], limit=8),
    "take_validations": lambda ledger, run: ledger.take_validations(run, ["m1"], limit=8),
    "reservations": lambda ledger, run: ledger.reservations(run),
    "attempts": lambda ledger, run: ledger.attempts(run),
    "refusals": lambda ledger, run: ledger.refusals(run),
    "reserve": lambda ledger, run: ledger.reserve(run, RoundKind.AUTOMATIC, 1, AllowancePolicy(),
                                                  1_800_000_000.0),
}


@pytest.fixture(params=["sqlite", "postgres"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "sqlite":
        async with SqliteLedger(tmp_path / "ledger.db") as opened:
            yield opened
        return
    with _pg.fresh_schema("runid") as schema:
        async with open_ledger(f"{_pg.DSN}?schema={schema}") as opened:
            yield opened


@pytest.mark.parametrize("method", sorted(CALLS))
@pytest.mark.parametrize("run_id", BAD_RUN_IDS, ids=["10MB", "surrogate", "nul", "empty",
                                                    "blank"])
async def test_a_bad_run_id_is_the_typed_misuse_error_at_every_entry(
    anyio_backend: object, ledger: Any, method: str, run_id: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        await CALLS[method](ledger, run_id)
    assert len(str(caught.value)) < 200  # the message names the field, not the value


@pytest.mark.parametrize("field", ["principal", "scope"])
@pytest.mark.parametrize("value", ["\ud800", "x" * 1_000_000, "a\x00b"])
async def test_a_bad_host_identity_is_the_typed_misuse_error(
    anyio_backend: object, ledger: Any, field: str, value: str
) -> None:
    identity = {"principal": "p", "scope": "s", field: value}
    with pytest.raises(InvalidArgumentError, match=field):
        await ledger.bind_identity("run-ok", **identity)


async def test_a_good_run_id_still_works_everywhere(anyio_backend: object, ledger: Any) -> None:
    run = "run-\u00e9\u4e2d-ok"
    for method in sorted(CALLS):
        try:
            await CALLS[method](ledger, run)
        except RecallboundError as exc:  # pragma: no cover - shown on failure
            pytest.fail(f"{method}: {exc!r}")
    assert (await ledger.usage(run)).rounds == 1
