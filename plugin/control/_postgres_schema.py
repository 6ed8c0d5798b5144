"""The PostgreSQL ledger's schema: its tables, its functions, and how it is created, migrated
and checked. A schema is migrated in place, one version at a time (:data:`MIGRATIONS`)."""

from __future__ import annotations

from plugin.errors import LedgerCorruptError, LedgerPathError

from .headroom import REFUSAL_REASON, admits, grant
from .ledger_admin import PRUNED_TABLES
from .sql_schema import (
    CALLS_SINCE,
    REFUSAL_KEYS,
    SPEND_TOMBSTONES,
    TABLES,
    Session,
    create_table,
)

APPLICATION = "recallbound"

REQUESTED = "(SELECT p.requested FROM p WHERE p.run_id = excluded.run_id)"

RESERVE_WAVE = """
CREATE FUNCTION {s}.reserve_wave(p_server boolean, p_requests jsonb)
RETURNS TABLE (ord int4, judged float8, executed int8, rounds int8, reserved int8,
               granted int8, deadline float8, opened float8, reason text,
               reserved_before int8)
LANGUAGE plpgsql VOLATILE AS $body$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH req AS MATERIALIZED (
    -- times travel as text: JSON has no infinity (a floor of -inf is the usual one)
    SELECT t.ord, t.run_id, t.kind, t.requested, t.deadline_s::float8 AS deadline_s,
           t.max_searches, t.max_rounds, t.now::float8 AS now, t.floor::float8 AS floor
    FROM jsonb_to_recordset(p_requests) AS t(ord int4, run_id text, kind text, requested int8,
        deadline_s text, max_searches int8, max_rounds int8, now text, floor text)
), p AS MATERIALIZED (
    SELECT req.ord, req.run_id, req.kind, req.requested, req.deadline_s, req.max_searches,
           req.max_rounds,
           -- never before the latest time the run was judged at (greatest skips a NULL)
           greatest(CASE WHEN p_server THEN extract(epoch FROM clock_timestamp())::float8
                         ELSE req.now END, req.floor,
                    (SELECT max(rd.reserved_wall) FROM {s}.rounds rd
                     WHERE rd.run_id = req.run_id),
                    (SELECT max(rf.at_wall) FROM {s}.refusals rf
                     WHERE rf.run_id = req.run_id),
                    -- a recorded attempt's end, read on the caller's clock like the attempt
                    (SELECT max(a.started_wall + coalesce(a.elapsed_s, 0)) FROM {s}.attempts a
                     WHERE a.run_id = req.run_id AND NOT p_server)) AS now
    FROM req
), cur AS MATERIALIZED (
    SELECT u.run_id, u.reserved, """ + REFUSAL_REASON + """ AS reason
    FROM {s}.runs u WHERE u.run_id IN (SELECT req.run_id FROM req)
), exe AS MATERIALIZED (
    SELECT a.run_id, count(*) AS n FROM {s}.attempts a
    WHERE a.run_id IN (SELECT req.run_id FROM req) AND a.legacy = false GROUP BY a.run_id
), up AS (
    INSERT INTO {s}.runs AS r (run_id, opened_wall, deadline_wall, max_searches, max_rounds,
                               rounds, reserved, last_grant)
    SELECT p.run_id, p.now, p.now + p.deadline_s, p.max_searches, p.max_rounds,
           1, least(p.requested, p.max_searches), least(p.requested, p.max_searches)
    FROM p ORDER BY p.run_id
    ON CONFLICT (run_id) DO UPDATE SET
        rounds = r.rounds + 1,
        last_grant = """ + grant("r", REQUESTED, "least") + """,
        reserved = r.reserved + """ + grant("r", REQUESTED, "least") + """
    WHERE """ + admits("r", "excluded.opened_wall") + """
    RETURNING r.run_id, r.rounds, r.reserved, r.last_grant, r.deadline_wall, r.opened_wall
), rnd AS (
    INSERT INTO {s}.rounds (run_id, round_index, kind, requested, first_slot, slots, executed,
                            reserved_wall)
    SELECT p.run_id, up.rounds, p.kind, p.requested, up.reserved - up.last_grant + 1,
           up.last_grant, coalesce(exe.n, 0), p.now
    FROM p JOIN up ON up.run_id = p.run_id LEFT JOIN exe ON exe.run_id = p.run_id
), ref AS (
    INSERT INTO {s}.refusals (run_id, round_index, what, kind, reason, at_wall)
    SELECT p.run_id, NULL, 'round', p.kind, cur.reason, p.now
    FROM p JOIN cur ON cur.run_id = p.run_id
    WHERE NOT EXISTS (SELECT FROM up WHERE up.run_id = p.run_id)
)
SELECT p.ord, p.now, coalesce(exe.n, 0)::int8, up.rounds, up.reserved, up.last_grant,
       up.deadline_wall, up.opened_wall, cur.reason, cur.reserved
FROM p LEFT JOIN exe ON exe.run_id = p.run_id LEFT JOIN up ON up.run_id = p.run_id
       LEFT JOIN cur ON cur.run_id = p.run_id
ORDER BY p.ord;
END
$body$
"""
"""One wave of a batch judged and recorded in one statement over arrays of requests: the
round, or the refusal, of each, in the order of ``ord``. Called after the batch's locks, so
every time it reads is current (each query of a volatile function takes a new snapshot)."""

RESERVE_LONE = """
CREATE FUNCTION {s}.reserve_lone(p_space int4, p_statement text, p_lock text, p_idle text,
                                 p_requests jsonb)
RETURNS TABLE (ord int4, judged float8, executed int8, rounds int8, reserved int8,
               granted int8, deadline float8, opened float8, reason text,
               reserved_before int8)
LANGUAGE plpgsql VOLATILE AS $body$
BEGIN
PERFORM set_config('synchronous_commit', 'on', true),
        set_config('statement_timeout', p_statement, true),
        set_config('lock_timeout', p_lock, true),
        set_config('idle_in_transaction_session_timeout', p_idle, true);
PERFORM pg_advisory_xact_lock(p_space, hashtext(p_requests->0->>'run_id'));
RETURN QUERY SELECT * FROM {s}.reserve_wave(true, p_requests);
END
$body$
"""
"""A lone request, judged by the server's clock, in ONE statement (its own transaction): the
transaction's settings, the run's lock, then :data:`RESERVE_WAVE`. The settings it makes apply
from there on (the lock wait is bounded by ``lock_timeout``, the commit is synchronous), but
not ``statement_timeout`` to the statement already running: the ledger sends the settings'
statement before it, in the same round trip."""

TYPES = {"text": "text", "real": "float8", "int": "bigint", "bool": "boolean",
          "serial": "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY"}

_RUN_OPENS = tuple(statement for table in TABLES if table.since == 6
                   for statement in create_table(table, TYPES, prefix="{s}.", if_not_exists=True))

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # versions 1 to 3, the ledger's tables by the version that added them: 1 runs, rounds,
    # attempts, refusals; 2 retained evidence and its re-check bound; 3 each run bound to the
    # principal and scope of its first use
    *(
        tuple(statement for table in TABLES if table.since == version
              for statement in create_table(table, TYPES, prefix="{s}."))
        for version in (1, 2, 3)
    ),
    # version 4: the reserving statement, kept in the schema (its plan is cached per server
    # connection, where a client-side prepared statement would not survive a transaction pooler)
    (RESERVE_WAVE,),
    # version 5: each attempt counts the evidence dropped for naming another principal or scope
    ("ALTER TABLE {s}.attempts ADD COLUMN IF NOT EXISTS dropped bigint NOT NULL DEFAULT 0",),
    # version 6: the runs each (principal, scope) opened in the last hour (a cap on new runs)
    _RUN_OPENS,
    # version 7: each dispatched call's outcome, and tombstones (a pruned run keeps its row).
    # Ledgers of an earlier numbering hold these as their version 6, without the table of
    # version 6: so the step takes what is there and adds the table of version 6 if missing.
    (
        *_RUN_OPENS,
        *(statement for table in TABLES if table.since == CALLS_SINCE
          for statement in create_table(table, TYPES, prefix="{s}.", if_not_exists=True)),
        "ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS pruned boolean NOT NULL DEFAULT false",
        RESERVE_LONE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1),
    ),
    # version 8: a round is judged never before the latest time its run was judged at
    (RESERVE_WAVE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1),),
    # version 9: ... or the end of its latest recorded attempt, on the callers' clock
    (RESERVE_WAVE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1),),
    # version 10: an attempt's refusal has a unique key (written twice, it is one row)
    ("ALTER TABLE {s}.refusals ADD COLUMN IF NOT EXISTS refusal_key text",
     REFUSAL_KEYS.replace("{q}", "{s}.")),
    # version 11: the tombstones an older release left unspent are spent
    (SPEND_TOMBSTONES.replace("{q}", "{s}."),),
)
SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this code writes; older versions are migrated in place at open."""

META = """CREATE TABLE {s}.recallbound_meta (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    application text NOT NULL,
    version     integer NOT NULL)"""

SERVER_CLOCK = "extract(epoch FROM clock_timestamp())::float8"
"""The server's clock, read when the statement evaluates it (after any lock wait before it)."""

LOCK_RUN = "SELECT pg_advisory_xact_lock(:space::int4, hashtext(:run_id))"

LOCK_RUNS = """
SELECT count(pg_advisory_xact_lock(:space::int4, hashtext(r)))
FROM (SELECT DISTINCT r COLLATE "C" AS r FROM unnest(:runs::text[]) AS r ORDER BY 1 OFFSET 0)
    AS ordered
"""
"""The per-run locks of a batch, taken in one order, by run id byte-wise (as a batch of writes
orders its runs), so that two workers' batches never wait for each other in a cycle."""

RESERVE = """
SELECT * FROM {q}reserve_wave(:server::boolean, :requests::jsonb)
"""
"""One wave of a batch (at most one request per run), judged and recorded in ONE statement."""

RESERVE_ONE = """
SELECT * FROM {q}reserve_lone(:space::int4, :statement, :lock, :idle, :requests::jsonb)
"""
"""A lone request judged by the server's clock, after the settings' statement (see
:data:`RESERVE_LONE`)."""

SCHEMA_TABLES = ("recallbound_meta", *PRUNED_TABLES)
"""Every table of a ledger schema."""


async def setup_schema(s: Session, schema: str, *, create: bool) -> None:
    """Create the ledger's schema in ``schema``, or migrate it to :data:`SCHEMA_VERSION`, under
    a lock (safe when many workers open at once); refuse a foreign or newer schema."""
    q = f'"{schema}"'
    await s.fetchall("SELECT pg_advisory_xact_lock(hashtext(%(key)s)::bigint)",
                     {"key": f"recallbound schema {schema}"})
    ((relations, has_meta),) = await s.fetchall(
        "SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %(n)s), "
        "to_regclass(%(meta)s) IS NOT NULL",
        {"n": schema, "meta": f"{q}.recallbound_meta"},
    )
    if has_meta:
        ((application, version),) = await s.fetchall(
            f"SELECT application, version FROM {q}.recallbound_meta", {})
        if application != APPLICATION:
            raise LedgerCorruptError(f"schema {schema!r} is not a recallbound ledger")
        if version > SCHEMA_VERSION:
            raise LedgerCorruptError(
                f"ledger schema {schema!r} has version {version}; "
                f"this recallbound reads version {SCHEMA_VERSION}"
            )
    elif relations:
        raise LedgerCorruptError(
            f"schema {schema!r} holds other tables and is not a recallbound ledger"
        )
    elif not create:
        raise LedgerPathError(
            f"no recallbound ledger in schema {schema!r} of this database")
    else:
        version = 0
        await s.fetchall(f"CREATE SCHEMA IF NOT EXISTS {q}", {})
        await s.fetchall(META.format(s=q), {})
        await s.fetchall(
            f"INSERT INTO {q}.recallbound_meta (application, version) VALUES (%(a)s, 0)",
            {"a": APPLICATION})
    if version < SCHEMA_VERSION:
        # A step rewrites a table (a column, a unique index): its time grows with the ledger,
        # so it is not cut by the ledger's statement_timeout (it would never complete on a
        # large ledger, and each try would hold the table from the running fleet again).
        await s.fetchall("SET LOCAL statement_timeout = 0", {})
    for step in MIGRATIONS[version:]:
        for statement in step:
            await s.fetchall(statement.format(s=q), {})
    if version < SCHEMA_VERSION:
        await s.fetchall(f"UPDATE {q}.recallbound_meta SET version = %(v)s",
                         {"v": SCHEMA_VERSION})


FUNCTIONS = ("reserve_wave(boolean, jsonb)", "reserve_lone(int4, text, text, text, jsonb)")
"""The schema's functions by signature: a round is reserved through them."""


async def inspect_schema(session: Session, schema: str, problems: list[str]) -> tuple[int, bool]:
    """The admin check of the schema itself (see :meth:`SqlLedger._inspect_storage`)."""
    q = f'"{schema}"'
    ((*present,),) = await session.fetchall(
        "SELECT " + ", ".join(f"to_regclass('{q}.{t}') IS NOT NULL" for t in SCHEMA_TABLES), {})
    missing = [table for table, there in zip(SCHEMA_TABLES, present, strict=True) if not there]
    if missing:
        problems.append(f"missing table(s): {', '.join(missing)}")
    ((*defined,),) = await session.fetchall(
        "SELECT " + ", ".join(f"to_regprocedure('{q}.{f}') IS NOT NULL" for f in FUNCTIONS), {})
    gone = [f.partition("(")[0] for f, there in zip(FUNCTIONS, defined, strict=True) if not there]
    if gone:  # every reservation would fail: the fleet is down though the tables are sound
        problems.append(f"missing function(s): {', '.join(gone)}")
    version = -1
    if "recallbound_meta" not in missing:
        meta = await session.fetchall(f"SELECT application, version FROM {q}.recallbound_meta",
                                      {})
        if len(meta) != 1:
            problems.append(f"the schema's meta table holds {len(meta)} rows, not 1")
        else:
            ((application, version),) = meta
            if application != APPLICATION:
                problems.append(f"application {application!r} is not a recallbound "
                                "ledger's")
    return int(version), not missing
