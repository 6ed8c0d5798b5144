"""The admin of :class:`~plugin.control.postgres_ledger.PostgresLedger`: the one SQL admin.

``PostgresLedger(...).admin()`` returns it; :class:`~plugin.control.sql_admin.SqlAdmin` holds
the queries and invariants every SQL ledger shares (on PostgreSQL a prune locks the chosen
runs' rows first, and a ledger judged by the server's clock prunes by that clock).
"""

from __future__ import annotations

from .sql_admin import SqlAdmin

PostgresAdmin = SqlAdmin
"""The admin of an opened :class:`~plugin.control.postgres_ledger.PostgresLedger`."""

__all__ = ["PostgresAdmin"]
