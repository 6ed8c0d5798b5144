"""The SQLite ledger's check-and-reserve of one round: one ``INSERT … ON CONFLICT DO UPDATE …
WHERE … RETURNING`` inside the caller's write transaction, its refusal recorded in the same."""

from __future__ import annotations

import math
import sqlite3

from ..headroom import REFUSAL_REASON, admits, grant
from ..ledger import Reservation, read_time
from ..refusal import BudgetRefusal, RefusalReason
from ..sql_rows import reservation
from ..sql_schema import ReserveRequest

_EXECUTED = "(SELECT count(*) FROM attempts a WHERE a.run_id = runs.run_id AND a.legacy = 0)"

_RESERVE = f"""
INSERT INTO runs (run_id, opened_wall, deadline_wall, max_searches, max_rounds,
                  rounds, reserved, last_grant)
VALUES (:run_id, :now, :now + :deadline_s, :max_searches, :max_rounds,
        1, min(:requested, :max_searches), min(:requested, :max_searches))
ON CONFLICT (run_id) DO UPDATE SET
    rounds = rounds + 1,
    last_grant = {grant("runs", ":requested", "min")},
    reserved = reserved + {grant("runs", ":requested", "min")}
WHERE {admits("runs", ":now")}
RETURNING rounds, reserved, last_grant, deadline_wall, opened_wall, {_EXECUTED}
"""

_RECORDED = """
SELECT max(at) FROM (
    SELECT max(reserved_wall) AS at FROM rounds WHERE run_id = :run_id
    UNION ALL SELECT max(at_wall) FROM refusals WHERE run_id = :run_id
    UNION ALL SELECT max(started_wall + coalesce(elapsed_s, 0)) FROM attempts
              WHERE run_id = :run_id)
"""
"""The latest time the ledger saw the run at (a round, a refusal, or the end of a recorded
attempt), or NULL: the earliest time any later round of the run may be judged at, whatever the
caller's clock says. An attempt's end counts: a search recorded as running past the deadline
has seen the deadline pass."""

_RUN_STATE = f"""
SELECT reserved, {_EXECUTED} FROM runs WHERE run_id = ?
"""

_REFUSE = f"""
INSERT INTO refusals (run_id, round_index, what, kind, reason, at_wall)
SELECT u.run_id, NULL, 'round', :kind, {REFUSAL_REASON}, :now FROM runs u WHERE u.run_id = :run_id
RETURNING reason
"""


def reserve_one(conn: sqlite3.Connection, request: ReserveRequest) -> Reservation | BudgetRefusal:
    """The check-and-reserve of one round, inside the caller's write transaction.

    Judged under the write lock: a round that waited for another writer past the deadline is
    refused, not born expired. Judged never before the latest time the run was judged at, so a
    process whose wall clock is behind another's (or stepped back across a restart) cannot
    reopen a deadline that has passed.
    """
    run_id, kind, requested, policy = (
        request.run_id, request.kind, request.requested, request.policy
    )
    (recorded,) = conn.execute(_RECORDED, {"run_id": run_id}).fetchone()
    now_wall = max(read_time(request.now), read_time(request.floor),
                   -math.inf if recorded is None else float(recorded))
    params = {
        "run_id": run_id,
        "now": now_wall,
        "deadline_s": policy.deadline_s,
        "max_searches": policy.max_searches,
        "max_rounds": policy.max_rounds,
        "requested": requested,
    }
    row = conn.execute(_RESERVE, params).fetchone()
    if row is not None:
        rounds, reserved, grant, deadline, opened, executed = row
        conn.execute(
            "INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, rounds, kind.value, requested, reserved - grant + 1, grant, executed,
             now_wall),
        )
        return reservation(run_id, kind, requested, rounds=rounds, reserved=reserved,
                           grant=grant, executed=executed, deadline=deadline, opened=opened,
                           judged=now_wall)
    ((reason,),) = conn.execute(_REFUSE, {"run_id": run_id, "kind": kind.value, "now": now_wall})
    reserved, executed = conn.execute(_RUN_STATE, (run_id,)).fetchone()
    return BudgetRefusal(reason=RefusalReason(reason), run_id=run_id, reserved=reserved,
                         executed=executed)
