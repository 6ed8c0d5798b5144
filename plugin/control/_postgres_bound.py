"""A bound on the client's side for each round trip to the server.

``statement_timeout`` runs on the server: it cannot end a wait for a server that never got the
query, or whose answer never comes back (a pooler or a proxy that stopped, a peer that still
acknowledges what it is sent). Past the bound the connection is given up (its socket shut
down, so the blocked read ends at once) and the round trip fails as a lost connection:
:class:`~plugin.errors.LedgerUnavailableError`, no permit. Whether a transaction in flight was
committed is then unknown, as when the server goes away: slots are never refunded, so nothing
is granted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import psycopg

T = TypeVar("T")


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


def _given_up(seconds: float) -> psycopg.OperationalError:
    return psycopg.OperationalError(
        f"no answer from the server within {seconds:g} s: the connection was given up")


@contextlib.contextmanager
def bounded(lent: Callable[[], Any], seconds: float) -> Generator[None, None, None]:
    """On asyncio, give up the connection ``lent()`` returns if the block (psycopg's async
    calls, shielded or not) has not ended within ``seconds``; it then raises
    :class:`psycopg.OperationalError`, saying so."""
    gone: list[bool] = []
    timer = asyncio.get_running_loop().call_later(seconds, _sever, lent, gone)
    try:
        yield
    except psycopg.Error as exc:
        if gone:
            raise _given_up(seconds) from exc
        raise
    finally:
        timer.cancel()


async def in_thread(fn: Callable[[], T], lent: Callable[[], Any], seconds: float,
                    limiter: anyio.CapacityLimiter) -> T:
    """``fn()`` in a worker thread, waited for at most ``seconds``; past them the connection
    ``lent()`` returns is given up (so ``fn`` fails and ends, and what it holds goes back) and
    this raises :class:`psycopg.OperationalError`, saying so."""
    with anyio.move_on_after(seconds):
        return await anyio.to_thread.run_sync(fn, limiter=limiter, abandon_on_cancel=True)
    _sever(lent, [])
    raise _given_up(seconds)
