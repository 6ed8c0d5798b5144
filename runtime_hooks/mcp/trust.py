"""Who the caller is: the principal and scope every tool call runs under.

Principal and scope never come from tool arguments. Over stdio (one user per launched
server) they are the server's own: ``--principal``/``--scope`` or the ``[mcp]`` table. Over
HTTP they come from the caller's bearer token, looked up in a token table read from a file or
an environment variable; the SDK's bearer middleware rejects a request without a valid token
with ``401`` before any tool runs. Tokens are kept only as SHA-256 digests once read, and no
message, log line or ``repr`` carries one.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs
from mcp.server.auth.provider import AccessToken

from plugin import strict_json
from plugin.control import validate

from .errors import McpAuthError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PRINCIPAL_CLAIM = "recallbound/principal"
SCOPE_CLAIM = "recallbound/scope"
MIN_TOKEN_CHARS = 16
"""Shorter tokens are refused when the table is read: they are guessable."""
MAX_TOKEN_FILE_BYTES = 16 * 1024 * 1024
"""A token file is read no further than this (``/dev/zero`` would never end)."""


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise McpAuthError(f"{name} must be a non-empty string")
    try:  # what the ledger stores: longer, the server would write memories it cannot recall
        validate.bounded_text(value, field=name, max_bytes=validate.MAX_ID_BYTES)
    except ValueError as exc:
        raise McpAuthError(str(exc)) from None
    return value


def _check_text(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    _text(attribute.name, value)


@attrs.frozen(kw_only=True)
class Caller:
    """The trusted identity of a tool call."""

    principal: str = attrs.field(validator=_check_text)
    scope: str = attrs.field(validator=_check_text)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@attrs.frozen
class TokenTable:
    """Bearer token digest -> :class:`Caller`. Build with :meth:`from_entries`."""

    _callers: Mapping[str, Caller] = attrs.field(repr=lambda m: f"<{len(m)} tokens>")

    @classmethod
    def from_entries(cls, entries: Iterable[object], *, source: str) -> TokenTable:
        """Entries are ``{"token", "principal", "scope"}`` objects; errors name ``source`` and
        the entry's position, never the token."""
        callers: dict[str, Caller] = {}
        for position, entry in enumerate(entries):
            where = f"{source}: token entry {position}"
            if not isinstance(entry, Mapping) or set(entry) != {"token", "principal", "scope"}:
                raise McpAuthError(f"{where} must have exactly 'token', 'principal', 'scope'")
            token = entry["token"]
            if not isinstance(token, str) or len(token.strip()) < MIN_TOKEN_CHARS:
                raise McpAuthError(f"{where}: the token must be a string of at least "
                                   f"{MIN_TOKEN_CHARS} characters")
            if not all("!" <= char <= "~" for char in token):  # what a request can carry
                raise McpAuthError(f"{where}: the token must be visible ASCII characters only "
                                   f"(no space, control or non-ASCII character)")
            try:
                caller = Caller(principal=_text("principal", entry["principal"]),
                                scope=_text("scope", entry["scope"]))
            except McpAuthError as exc:
                raise McpAuthError(f"{where}: {exc}") from None
            digest = _digest(token)
            if digest in callers:
                raise McpAuthError(f"{where}: the same token appears twice")
            callers[digest] = caller
        if not callers:
            raise McpAuthError(f"{source}: no token entries")
        return cls(callers)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> TokenTable:
        """A TOML file of ``[[token]]`` tables (``token``, ``principal``, ``scope``)."""
        try:
            with Path(path).open("rb") as handle:
                data = handle.read(MAX_TOKEN_FILE_BYTES + 1)
        except OSError as exc:
            raise McpAuthError(f"token file {os.fspath(path)!r}: cannot read: "
                               f"{exc.strerror}") from None
        if len(data) > MAX_TOKEN_FILE_BYTES:
            raise McpAuthError(f"token file {os.fspath(path)!r}: larger than "
                               f"{MAX_TOKEN_FILE_BYTES:,} bytes")
        try:
            document = tomllib.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            raise McpAuthError(f"token file {os.fspath(path)!r}: not valid TOML") from None
        if set(document) != {"token"} or not isinstance(document["token"], list):
            raise McpAuthError(f"token file {os.fspath(path)!r}: expected [[token]] tables only")
        return cls.from_entries(document["token"], source=f"token file {os.fspath(path)!r}")

    @classmethod
    def from_env(cls, name: str, env: Mapping[str, str] | None = None) -> TokenTable:
        """The environment variable ``name``: a JSON list of token objects."""
        env = os.environ if env is None else env
        text = env.get(name)
        if text is None:
            raise McpAuthError(f"environment variable {name} is not set")
        try:
            entries = strict_json.decode(text)
        except strict_json.StrictJsonError as exc:
            reason = exc.reason if exc.reason.startswith("not valid JSON") else (
                f"not valid JSON: {exc.reason}")
            raise McpAuthError(f"environment variable {name}: {reason}") from None
        if not isinstance(entries, list):
            raise McpAuthError(f"environment variable {name}: expected a JSON list")
        return cls.from_entries(entries, source=f"environment variable {name}")

    def caller(self, token: str) -> Caller | None:
        """The caller a presented token maps to, or None."""
        return self._callers.get(_digest(token))


@attrs.frozen
class TableTokenVerifier:
    """The SDK's ``TokenVerifier`` over a :class:`TokenTable`: the bearer middleware calls it
    for every HTTP request, and a request whose token it does not know gets ``401``."""

    table: TokenTable

    async def verify_token(self, token: str) -> AccessToken | None:
        caller = self.table.caller(token)
        if caller is None:
            return None
        # The SDK binds a stateful session to (client_id, issuer, subject): the token's own
        # digest as client_id keeps a session to the token that opened it.
        return AccessToken(
            token="<redacted>", client_id=f"token-{_digest(token)[:32]}", scopes=[],
            subject=caller.principal,
            claims={PRINCIPAL_CLAIM: caller.principal, SCOPE_CLAIM: caller.scope},
        )


def caller_of_token(token: AccessToken) -> Caller:
    """The caller an authenticated request's access token names."""
    claims = token.claims or {}
    return Caller(principal=_text("principal", claims.get(PRINCIPAL_CLAIM)),
                  scope=_text("scope", claims.get(SCOPE_CLAIM)))
