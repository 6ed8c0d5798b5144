"""A bound on the client's side for each round trip to the server.

``statement_timeout`` runs on the server: it cannot end a wait for a server that never got the
query, or whose answer never comes back (a pooler or a proxy that stopped, a peer that still
acknowledges what it is sent). Past the bound the connection is given up (its socket shut
down, so the blocked read ends at once, in the event loop or in a worker thread alike) and the
round trip fails as a lost connection: :class:`~plugin.errors.LedgerUnavailableError`, no
permit. Whether a transaction in flight was committed is then unknown, as when the server
goes away: slots are never refunded, so nothing is granted twice.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import sniffio


def _sever(lent: Callable[[], Any], gone: list[bool]) -> None:
    """Shut the lent connection's socket down: the read that waits on it ends (lost)."""
    conn = lent()
    if conn is None:  # not lent yet: the pool's own timeout bounds the wait
        return
    gone.append(True)
    with contextlib.suppress(OSError, ValueError, psycopg.Error):
        duplicate = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        finally:
            duplicate.close()


@contextlib.asynccontextmanager
async def bounded(lent: Callable[[], Any], seconds: float) -> AsyncIterator[None]:
    """Give up the connection ``lent()`` returns (None: none lent yet) if the block has not
    ended within ``seconds``; the block then raises :class:`psycopg.OperationalError` (saying
    so). Shielded or not, on either loop."""
    gone: list[bool] = []
    try:
        if sniffio.current_async_library() == "asyncio":
            import asyncio

            timer = asyncio.get_running_loop().call_later(seconds, _sever, lent, gone)
            try:
                yield
            finally:
                timer.cancel()
        else:  # trio: a watcher of its own, so the block's errors are not grouped
            import trio

            scope = trio.CancelScope()

            async def give_up() -> None:
                with scope:
                    await trio.sleep(seconds)
                    _sever(lent, gone)

            trio.lowlevel.spawn_system_task(give_up)
            try:
                yield
            finally:
                scope.cancel()
    except psycopg.Error as exc:
        if gone:
            raise psycopg.OperationalError(
                f"no answer from the server within {seconds:g} s: the connection was given up"
            ) from exc
        raise
