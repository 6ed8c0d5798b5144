"""A connection string whose options libpq refuses (an ``sslmode`` typo, a port out of range,
more ports than hosts, an unknown service) is a configuration error when the ledger opens: a
:class:`~plugin.errors.LedgerConfigError`, never "the database is unreachable" (a
:class:`~plugin.errors.LedgerUnavailableError`, which an operator and a supervisor read as a
server to wait for). Its message keeps libpq's reason and never the password. Against the test
server (tests/_pg.py), on asyncio and trio.
"""

from __future__ import annotations

import urllib.parse

import pytest

from plugin.errors import LedgerConfigError, LedgerUnavailableError
from runtime_hooks.ledgers import open_ledger

from . import _pg

SECRET = "Sw0rdfish-XYZZY"
_URL = urllib.parse.urlsplit(_pg.DSN)
BASE = (f"host={_URL.hostname} port={_URL.port or 5432} dbname={_URL.path.lstrip('/')} "
        f"user={_URL.username or 'root'} password={SECRET}")
URI = f"postgresql://{_URL.username or 'root'}:{SECRET}@{_URL.hostname}:{_URL.port or 5432}/test"


@pytest.mark.anyio
@pytest.mark.parametrize(("dsn", "reason"), [
    (f"{BASE} sslmode=bogus", "sslmode"),
    (f"{URI}?sslmode=requir", "sslmode"),
    (f"{URI}?target_session_attrs=primry", "target_session_attrs"),
    (f"{BASE} gssencmode=maybe", "gssencmode"),
    (f"{BASE} channel_binding=on", "channel_binding"),
    (f"{BASE} ssl_min_protocol_version=TLS9", "ssl_min_protocol_version"),
    (f"{BASE} port=99999", "port"),
    (f"{BASE} port=abc", "port"),
    (f"{BASE} keepalives=yes", "keepalives"),
    (f"host=127.0.0.1,127.0.0.2 port=5432,5432,5432 dbname=test password={SECRET}", "port"),
    (f"service=recallbound-no-such-service password={SECRET}", "service"),
])
async def test_an_option_libpq_refuses_is_a_config_error(
    anyio_backend: object, dsn: str, reason: str
) -> None:
    with pytest.raises(LedgerConfigError) as caught:
        async with open_ledger(dsn):
            pass  # pragma: no cover
    assert not isinstance(caught.value, LedgerUnavailableError)
    assert reason in str(caught.value) and "unreachable" not in str(caught.value)
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value.__cause__)


@pytest.mark.anyio
async def test_a_server_that_is_not_there_is_still_unavailable(anyio_backend: object) -> None:
    with pytest.raises(LedgerUnavailableError) as caught:
        async with open_ledger(f"{URI.replace(':5432', ':1')}?connect_timeout=2"):
            pass  # pragma: no cover
    assert not isinstance(caught.value, LedgerConfigError)
    assert SECRET not in str(caught.value)


@pytest.mark.anyio
async def test_a_connect_timeout_that_is_not_a_number_is_a_config_error(
    anyio_backend: object,
) -> None:
    with pytest.raises(LedgerConfigError, match="connect_timeout") as caught:
        async with open_ledger(f"{URI}?connect_timeout=soon"):
            pass  # pragma: no cover
    assert SECRET not in str(caught.value)
