"""The HTTP server's listening sockets, bound before the server starts.

A port in use, an address this machine does not have or a name that does not resolve is one
:class:`OSError` naming the address (the command prints it on one line and exits 1), never
the web server's own exit from inside its event loop.
"""

from __future__ import annotations

import socket


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address ``host`` resolves to, as an asyncio server binds them
    (``SO_REUSEADDR``; IPv6 sockets IPv6 only); the server starts listening on them.

    Raises :class:`OSError` ``cannot serve HTTP on HOST:PORT: <reason>``.
    """
    shown = f"[{host}]" if ":" in host else host
    bound: list[socket.socket] = []
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as exc:
        for sock in bound:
            sock.close()
        raise OSError(f"cannot serve HTTP on {shown}:{port}: {exc.strerror or exc}") from None
    return bound
