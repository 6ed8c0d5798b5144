"""The call records of the SQL ledgers: a call claimed before it searches, a claim withdrawn
when nothing searched, and the records read back (see :class:`~plugin.control.ledger.Ledger`).

A claim is a ``pending`` record bearing its claimant's token. It is this claimant's only when
that token is read back: a claim another claimant withdrew between this one's write (which
then wrote nothing) and its read-back is written again, never assumed.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from plugin.errors import LedgerError

from . import validate
from .ledger import CallIdentity, CallRecord
from .shield import finish
from .sql_rows import (
    _CALLS,
    _CLAIM_CALL,
    _RELEASE_CALL,
    _WITHDRAW_CLAIMS,
    calls_of,
    claim_rows,
    held,
    storable_row,
)

if TYPE_CHECKING:
    from ._group import GroupCommit
    from .sql_schema import Dialect, Row, Rows

CLAIM_TRIES = 3
"""How often a claim is written again when its read-back finds no record at all; after that
the call is held as if another claimed it (answered ``in_flight``, never searched)."""


class SqlCalls:
    """The call-record methods of :class:`~plugin.control.sql_ledger.SqlLedger`."""

    _dialect: Dialect
    _writes: GroupCommit[tuple[str, Rows], bool]

    if TYPE_CHECKING:
        def _sql(self, template: str) -> str: ...

        async def _read(self, template: str, params: Mapping[str, Any],
                        where: str) -> list[Row]: ...

    async def claim_calls(self, run_id: str, calls: Sequence[CallIdentity]
                          ) -> dict[CallIdentity, CallRecord]:
        validate.run_id(run_id)
        token, there, left = secrets.token_hex(16), {}, list(calls)
        try:
            for tries in reversed(range(CLAIM_TRIES)):
                rows = claim_rows(run_id, left, token)
                await self._writes.submit((run_id, [(self._sql(_CLAIM_CALL), rows)]))
                records = await self.recorded_calls(run_id, [call_id for call_id, _ in left])
                found, left = held(run_id, records, left, token, last=not tries)
                there.update(found)
                if not left:
                    break
        except BaseException:  # this claimant never ran its calls: its claims go
            params = {"run_id": run_id, "reason": token}
            with contextlib.suppress(LedgerError):
                await finish(lambda: self._writes.submit(
                    (run_id, [(self._sql(_WITHDRAW_CLAIMS), [params])])))
            raise
        return there

    async def release_calls(self, run_id: str, calls: Sequence[CallIdentity]) -> None:
        validate.run_id(run_id)
        rows = [storable_row({"run_id": run_id, "call_id": c, "digest": d}, "call")
                for c, d in calls]
        await self._writes.submit((run_id, [(self._sql(_RELEASE_CALL), rows)]))

    async def recorded_calls(self, run_id: str, call_ids: Sequence[str]) -> list[CallRecord]:
        validate.run_id(run_id)
        # An id no ledger can store was never recorded: it is not asked for.
        ids = [i for i in dict.fromkeys(call_ids) if validate.is_storable(i)]
        if not ids:
            return []
        where = f"reading the calls of run {run_id!r}"
        rows = await self._read(_CALLS + self._dialect.in_ids("ids"),
                                {"run_id": run_id, "ids": self._dialect.ids(ids)}, where)
        return calls_of(run_id, rows, where)
