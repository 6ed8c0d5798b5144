"""``recallbound mcp --http localhost:0`` on a machine where ``localhost`` is both 127.0.0.1
and ::1: every socket gets the one port the server announces, so a client that reaches
``localhost`` over either family finds the server (not a refused or foreign port)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from runtime_hooks.mcp.listen import listen


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="needs an IPv6 loopback")
def test_port_zero_on_a_name_of_two_families_binds_one_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = socket.getaddrinfo

    def both(host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host != "localhost":
            return real(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0))]

    monkeypatch.setattr(socket, "getaddrinfo", both)
    for _ in range(5):
        sockets = listen("localhost", 0)
        try:
            ports = {sock.getsockname()[1] for sock in sockets}
            assert len(sockets) == 2 and len(ports) == 1 and 0 not in ports
        finally:
            for sock in sockets:
                sock.close()
