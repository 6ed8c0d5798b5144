"""A peer that takes what it is sent and never answers (a pooler or a proxy that stopped, a
network that drops the answers): ``statement_timeout`` runs on the server, which never got the
query, and TCP sees nothing wrong. The ledger bounds each round trip on its own side (twice
``statement_timeout``), gives the connection up past it, and the caller gets a
:class:`~plugin.errors.LedgerUnavailableError` and no permit, instead of waiting as long as the
peer stays stopped, shielded from its own cancellation. On asyncio and trio, through a proxy
in this process that can be stopped (tests/_pg.py's server behind it).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator

import anyio
import pytest

from plugin import AllowancePolicy, RecallAllowance, RoundKind
from plugin.control.postgres_ledger import PostgresLedger
from plugin.errors import LedgerUnavailableError

from . import _pg


class _Proxy:
    """Forwards TCP to the test server until :meth:`stall`: then it reads nothing more (the
    kernel still acknowledges what is sent, as for a stopped process)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.stalled = threading.Event()
        self.closed = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            source.settimeout(0.05)
            while not self.closed.is_set():
                try:
                    data = source.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    return
                while self.stalled.is_set() and not self.closed.is_set():
                    time.sleep(0.01)  # held, never passed on
                sink.sendall(data)

    def stall(self) -> None:
        self.stalled.set()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.listener, *self.sockets):
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def proxy() -> Iterator[_Proxy]:
    url = urllib.parse.urlsplit(_pg.DSN)
    running = _Proxy((url.hostname or "127.0.0.1", url.port or 5432))
    try:
        yield running
    finally:
        running.close()


@pytest.mark.anyio
async def test_a_stalled_peer_ends_in_a_typed_error_not_a_wait(
    anyio_backend: object, proxy: _Proxy
) -> None:
    url = urllib.parse.urlsplit(_pg.DSN)
    with _pg.fresh_schema("stall") as schema:
        dsn = (f"postgresql://{url.username or 'root'}@127.0.0.1:{proxy.port}"
               f"{url.path}?schema={schema}")
        async with PostgresLedger(dsn, statement_timeout=1.0, lock_timeout=0.5,
                                  connect_timeout=2.0, pool_timeout=2.0, max_size=2) as ledger:
            allowance = RecallAllowance(ledger, policy=AllowancePolicy())
            async with allowance.round("run-before", RoundKind.AUTOMATIC) as permit:
                assert permit.slots == 2
            proxy.stall()
            with anyio.fail_after(30):  # a hang guard only: the bound is 2 s
                with pytest.raises(LedgerUnavailableError, match="no answer from the server "
                                   "within 2 s: the connection was given up"):
                    async with allowance.round("run-stalled", RoundKind.AUTOMATIC):
                        pass  # pragma: no cover
