"""The HTTP server's listening sockets, bound before the server starts.

A port in use, an address this machine does not have or a name that does not resolve is one
:class:`OSError` naming the address (the command prints it on one line and exits 1), never
the web server's own exit from inside its event loop. Port 0 on a name of several addresses
(``localhost``: 127.0.0.1 and ::1) is one free port for all of them: the port announced.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

_ATTEMPTS = 16
"""How many ports 0 picks before giving up on one free on every address of the name."""


def _bind(found: list[Any], port: int) -> list[socket.socket]:
    """One socket bound to each address of ``found``; with ``port`` 0, the later ones on the
    port the first one got. Closes what it bound when one fails."""
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(bound) > 1:
                address = (address[0], bound[0].getsockname()[1], *address[2:])
            sock.bind(address)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address ``host`` resolves to, as an asyncio server binds them
    (``SO_REUSEADDR``; IPv6 sockets IPv6 only), all on one port; the server starts listening
    on them.

    Raises :class:`OSError` ``cannot serve HTTP on HOST:PORT: <reason>``.
    """
    shown = f"[{host}]" if ":" in host else host
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        attempt = 1
        while True:
            try:
                return _bind(found, port)
            except OSError as exc:  # port 0's pick is taken on another address: pick again
                if port != 0 or exc.errno != errno.EADDRINUSE or attempt >= _ATTEMPTS:
                    raise
                attempt += 1
    except OSError as exc:
        raise OSError(f"cannot serve HTTP on {shown}:{port}: {exc.strerror or exc}") from None
