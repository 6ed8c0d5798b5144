"""The admin of :class:`~plugin.control.sqlite_ledger.SqliteLedger`: the one SQL admin.

``SqliteLedger(...).admin()`` returns it; :class:`~plugin.control.sql_admin.SqlAdmin` holds
the queries and invariants every SQL ledger shares.
"""

from __future__ import annotations

from .sql_admin import SqlAdmin

SqliteAdmin = SqlAdmin
"""The admin of an opened :class:`~plugin.control.sqlite_ledger.SqliteLedger`."""

__all__ = ["SqliteAdmin"]
