"""Configuration from a TOML file, ``RECALLBOUND_*`` environment variables and arguments.

Each setting is declared once, on its :class:`~runtime_hooks.settings.RecallConfig` field
(a :class:`~runtime_hooks.settings.Setting` in the field's metadata: key, kind, meaning, whether
it widens a bound); the file reader, the environment reader, ``config show`` and the
documentation's table (:func:`settings_table`) are derived from those declarations
(:data:`FIELDS`, :mod:`runtime_hooks.config_fields`).

Precedence, highest first: **explicit arguments > environment variables > the TOML file >
defaults**. The file is the ``file`` argument, else ``$RECALLBOUND_CONFIG``, else
``recallbound.toml`` in the working directory when it exists (a named file that is missing is
an error). Every key has one environment variable: ``RECALLBOUND_`` + the key upper-cased with
dots as underscores (``policy.max_searches`` -> ``RECALLBOUND_POLICY_MAX_SEARCHES``).

Every value is checked for its type and its range, and an error names the key and where the
value came from (``recallbound.toml: policy.max_searches``, ``RECALLBOUND_LEGACY``). Nothing
is coerced: ``legacy = "false"`` in TOML is an error, environment booleans are exactly
``true`` or ``false``, numbers in the environment are plain decimal literals. Unknown keys and
unknown ``RECALLBOUND_*`` variables are errors too, in one format that suggests the nearest
key (a typo must not fall back to a default). The test suite's own variables
(``RECALLBOUND_TEST_*`` and :data:`TEST_VARIABLES`) are not settings and are ignored.

From a file or the environment, every setting that widens a bound past its default (declared
``widens`` beside it in :mod:`runtime_hooks.settings`: searches, rounds, the deadline, source-read
fallbacks, the context caps' items and bytes, the preparation and admission budgets) and the
legacy mode need ``allow_looser_policy = true``, and an ephemeral ledger (``":memory:"``)
``allow_ephemeral_ledger = true``. Relative paths in the file
are relative to the file's folder; elsewhere, to the working directory.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from plugin.control.dsn import is_connection_string, parse_location, redact
from plugin.errors import ConfigError, RecallboundError
from plugin.memory.planning import Admission

from .config_fields import (
    _BY_ENV,
    _BY_KEY,
    _SECTIONS,
    FIELDS,
    _Bad,
    _Field,
    _shown,
    unknown_setting,
)
from .config_fields import settings_table as settings_table
from .ledgers import redact_location
from .settings import (
    RecallConfig,
    check_store_location,
    is_ephemeral,
    loosened,
    shown_location,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = ["FIELDS", "ConfigError", "LoadedConfig", "Source", "load_config", "settings_table"]

FILE_NAME = "recallbound.toml"
ENV_PREFIX = "RECALLBOUND_"
ENV_FILE = "RECALLBOUND_CONFIG"
TEST_PREFIX = "RECALLBOUND_TEST_"
"""Variables with this prefix belong to the test suite, not to the configuration."""
TEST_VARIABLES = frozenset({"RECALLBOUND_STRESS", "RECALLBOUND_FLEET_WORKERS",
                            "RECALLBOUND_FLEET_RUNS"})
"""The test suite's sizing variables: read by the tests, ignored by the configuration."""
SERVER_PREFIX = "RECALLBOUND_MCP_"
"""Variables with this prefix belong to ``recallbound mcp`` (its ``[mcp]`` table): the
configuration checks them by the server's rules (an unknown or bad one is an error here too) but
never keeps or shows them, as they may hold secrets."""
TOKENS_PREFIX = "RECALLBOUND_MCP_TOKENS"
"""The MCP server's token tables (``--tokens-env`` may name another such variable)."""
PRECEDENCE = ("explicit", "env", "file", "default")
"""Where a value may come from, the one that wins first."""


@attrs.frozen
class Source:
    """Where one value came from: ``kind`` is one of :data:`PRECEDENCE`."""

    kind: str
    where: str = ""

    def __str__(self) -> str:
        return self.kind if not self.where else f"{self.kind} ({self.where})"


_LOCATIONS = frozenset(f.key for f in FIELDS if f.kind == "path")
"""The keys whose value may be a location holding a password (``ledger``, ``store``)."""


def _shown_values(values: Mapping[str, Any]) -> str:
    shown = ", ".join(f"{key!r}: {shown_location(value) if key in _LOCATIONS else repr(value)}"
                      for key, value in values.items())
    return "{" + shown + "}"


@attrs.frozen(kw_only=True)
class LoadedConfig:
    """The effective configuration: every key's value and where it came from."""

    file: Path | None
    values: Mapping[str, Any] = attrs.field(repr=_shown_values)
    """Each key's value; its ``repr`` hides a location's password."""
    sources: Mapping[str, Source]
    admission: Admission | None = None

    def recall_config(self) -> RecallConfig:
        """The :class:`RecallConfig` these values describe (``ledger`` and ``store`` needed)."""
        for key in ("ledger", "store"):
            if self.values[key] is None:
                raise ConfigError(
                    f"{key} is not configured: set {key!r} in {FILE_NAME} or "
                    f"{_BY_KEY[key].env}, or pass it explicitly"
                )
        arguments = self._arguments()
        if self.admission is not None:
            arguments["admission"] = self.admission
        config: RecallConfig = self._guarded(lambda: RecallConfig(**arguments, sources={
            key: str(source) for key, source in self.sources.items()
            if source.kind != "default"}))
        return config

    def _arguments(self) -> dict[str, Any]:
        """RecallConfig's keyword arguments, sections built (ledger/store as they are)."""
        arguments: dict[str, Any] = {}
        sections: dict[str, dict[str, Any]] = {}
        for f in FIELDS:
            value = self.values[f.key]
            if f.part is not None:
                sections.setdefault(f.attribute, {})[f.part] = value
            elif value is not None:
                arguments[f.attribute] = value
        for attribute, parts in sections.items():
            arguments[attribute] = self._build(attribute, parts)
        return arguments

    def _build(self, attribute: str, parts: dict[str, Any]) -> Any:
        setting = attrs.fields_dict(RecallConfig)[attribute].metadata["setting"]
        section = setting.key
        try:
            return setting.of(**parts)
        except (ValueError, TypeError) as exc:
            # Blame the keys the message names (a rule may join two), or all that were set.
            named = [n for n in parts if n in str(exc)] or [
                n for n in parts if self.sources[f"{section}.{n}"].kind != "default"]
            where = "; ".join(f"{section}.{n} from {self.sources[f'{section}.{n}']}"
                              for n in named)
            raise ConfigError(f"{where}: {exc}") from None

    def _guarded(self, build: Callable[[], Any], key: str | None = None) -> Any:
        """``build()``, a RecallConfig error re-raised naming the key and its source."""
        try:
            return build()
        except RecallboundError as exc:
            if key is None:
                key = next((f.key for f in FIELDS if f.part is None and re.search(
                    rf"RecallConfig\.{f.attribute}\b", str(exc))), None)
            if key is None or (isinstance(exc, ConfigError) and str(exc).startswith(
                    f"{key} from ")):
                raise
            raise ConfigError(f"{key} from {self.sources[key]}: {exc}") from None

    def check(self) -> None:
        """Validate everything :meth:`recall_config` would build, ``ledger``/``store`` aside.

        Each value through its RecallConfig field's own converter and validator, then the
        rules that join settings: a looser policy (or the legacy mode) from a file or the
        environment needs ``allow_looser_policy``; an ephemeral ledger needs
        ``allow_ephemeral_ledger``.
        """
        arguments = self._arguments()
        fields = attrs.fields_dict(RecallConfig)
        for f in FIELDS:
            if f.part is not None or f.attribute not in arguments:
                continue
            field, value = fields[f.attribute], arguments[f.attribute]
            if f.kind == "admission" and self.admission is not None:
                continue

            def one(field: attrs.Attribute[Any] = field, value: object = value) -> Any:
                if field.converter is not None:
                    value = field.converter(value)  # type: ignore[operator]
                if field.validator is not None:
                    field.validator(None, field, value)
                return value

            self._guarded(one, f.key)
        ledger, store = self.values["ledger"], self.values["store"]
        if ledger is not None:
            try:
                parse_location(ledger)
            except ConfigError as exc:
                raise ConfigError(f"ledger from {self.sources['ledger']}: {exc}") from None
        if store is not None:  # as RecallConfig refuses it
            check_store_location(store, f"store from {self.sources['store']}:")
        if ledger is not None and is_ephemeral(ledger) and \
                self.values["allow_ephemeral_ledger"] is not True:
            raise ConfigError(
                f"ledger from {self.sources['ledger']}: {redact(ledger)!r} keeps nothing once "
                f"closed, so "
                f"every open of a run would start a fresh allowance; use a file or a DSN, or "
                f"set allow_ephemeral_ledger = true (for tests only)")
        if self.values["allow_looser_policy"] is not True:
            for key, why in loosened(arguments):
                if self.sources[key].kind in ("file", "env"):
                    raise ConfigError(
                        f"{key} from {self.sources[key]}: {why}; a looser allowance (any setting "
                        f"that widens a bound) needs allow_looser_policy = true "
                        f"({_BY_KEY['allow_looser_policy'].env}) beside it")

    def looser(self) -> set[str]:
        """The keys whose values widen a bound past the default (``config show`` marks them)."""
        return {key for key, _ in loosened(self._arguments())}

    def describe(self) -> list[dict[str, Any]]:
        """One row per key for display: key, value (plain, a DSN's password hidden), source,
        and whether it loosens the default allowance."""
        rows = []
        looser = self.looser()
        for f in FIELDS:
            value = _shown(self.values[f.key])
            if f.key in _LOCATIONS and isinstance(value, str):
                value = redact_location(value)
            source = self.sources[f.key]
            rows.append({"key": f.key, "value": value, "source": source.kind,
                         "where": source.where, "env": f.env, "looser": f.key in looser})
        return rows


def _relative_to(folder: Path, location: object) -> object:
    """A relative path (or ``file:`` URI's path) taken relative to ``folder``, a DSN unchanged:
    the file's folder (every reader names the same ledger), or the working folder at load time
    (a later ``chdir`` does not move the ledger)."""
    assert isinstance(location, str)  # checked by the field
    if is_connection_string(location) or is_ephemeral(location):
        return location
    if location.startswith("file:"):
        path = location[len("file:"):]
        if path.startswith("/"):
            return location  # absolute
        return f"file:{urllib.parse.quote(str(folder), safe='/')}/{path}"
    return str(folder / location)


def _not_a_file(path: Path) -> str:  # why ``path`` cannot be the configuration file
    return ("is a folder, not a file" if path.is_dir() else
            "is not a regular file" if path.exists() else "does not exist")


def _find_file(file: str | os.PathLike[str] | None, env: Mapping[str, str],
               cwd: Path) -> Path | None:
    if file is not None:
        path = cwd / Path(file)
        if not path.is_file():
            raise ConfigError(f"configuration file {shown_location(str(path))} (given "
                              f"explicitly) {_not_a_file(path)}")
        return path
    named = env.get(ENV_FILE)
    if named is not None:
        path = cwd / Path(named)
        if not named or not path.is_file():
            raise ConfigError(f"configuration file {shown_location(named)} (from {ENV_FILE}) "
                              f"{_not_a_file(path) if named else 'does not exist'}")
        return path
    default = cwd / FILE_NAME
    return default if default.is_file() else None


def _read_file(path: Path) -> dict[str, tuple[object, str]]:
    """The file's keys (dotted) -> (value, where); unknown keys and bad TOML are errors."""
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid TOML: the file is not UTF-8") from None
    except ValueError as exc:  # an integer past Python's 4,300-digit conversion limit
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    found: dict[str, tuple[object, str]] = {}

    def walk(table: Mapping[str, object], prefix: str) -> None:
        for name, value in table.items():
            key = prefix + name
            if not prefix and key in _SECTIONS:
                if not isinstance(value, dict):
                    raise ConfigError(f"{path}: {key} must be a table ([{key}]), "
                                      f"got {type(value).__name__}")
                walk(value, key + ".")
            elif key in _BY_KEY:
                found[key] = (value, f"{path}: {key}")
            elif key == "mcp":
                pass  # the MCP server's own table: checked below, as the server reads it
            else:
                raise unknown_setting(key, f"in {path}", [*_BY_KEY, *_SECTIONS])

    walk(document, "")
    if "mcp" in document:
        from .mcp.cli import check_settings  # the server's own rules, in one place

        check_settings(document["mcp"], path, {})
    return found


def load_config(
    file: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    admission: Admission | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> LoadedConfig:
    """Read the effective configuration (see the module docstring for the precedence).

    ``env`` defaults to :data:`os.environ`; ``overrides`` maps keys (``"policy.max_rounds"``,
    ``"ledger"``) to explicit values. ``admission`` (a callable) given here wins over the
    ``admission`` setting. Raises :class:`ConfigError` naming the key and the source of the
    first bad value.
    """
    env = os.environ if env is None else env
    base = Path.cwd() if cwd is None else Path(cwd)
    path = _find_file(file, env, base)
    layers: list[tuple[str, dict[str, tuple[object, str]], Callable[[_Field, object], object]]]
    layers = [("file", _read_file(path) if path is not None else {},
               lambda f, value: f.check(value))]

    env_values: dict[str, tuple[object, str]] = {}
    server_env: dict[str, str] = {}
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_FILE:
            continue
        if name.startswith(SERVER_PREFIX):
            if not name.startswith(TOKENS_PREFIX):  # a token table: the server's secret
                server_env[name] = text  # the MCP server's: checked below as it reads them
            continue
        if name.startswith(TEST_PREFIX) or name in TEST_VARIABLES:
            continue  # the test suite's, not a setting
        if name not in _BY_ENV:
            raise unknown_setting(name, "environment variable", [*_BY_ENV, ENV_FILE])
        env_values[_BY_ENV[name].key] = (text, name)
    if server_env:
        from .mcp.cli import check_settings

        check_settings(None, Path(), server_env)
    layers.append(("env", env_values, lambda f, text: f.check(f.from_env(str(text)))))

    explicit: dict[str, tuple[object, str]] = {}
    for key, value in (overrides or {}).items():
        if key not in _BY_KEY:
            raise unknown_setting(key, "argument", list(_BY_KEY))
        explicit[key] = (value, f"argument {key}")
    layers.append(("explicit", explicit, lambda f, value: f.check(value)))

    values: dict[str, Any] = {f.key: f.default for f in FIELDS}
    sources = {f.key: Source("default") for f in FIELDS}
    for kind, found, check in layers:  # lowest precedence first: later layers win
        for key, (raw, where) in found.items():
            field = _BY_KEY[key]
            try:
                value = check(field, raw)
            except _Bad as exc:
                raise ConfigError(f"{key} from {where}: {exc}") from None
            if field.path:  # the file's folder, or the working folder when read
                value = _relative_to(path.parent if kind == "file" and path else base, value)
            values[key] = value
            sources[key] = Source(kind, where)
    loaded = LoadedConfig(file=path, values=values, sources=sources, admission=admission)
    loaded.check()
    if values["allow_looser_policy"] is not True:  # the MCP server's run cap, as the server
        from .mcp.shown import describe

        for row in describe(path, env):
            if row["looser"]:
                raise ConfigError(
                    f"{row['key']} from {Source(row['source'], row['where'])}: above its "
                    f"default it widens a bound; a looser allowance needs allow_looser_policy "
                    f"= true ({_BY_KEY['allow_looser_policy'].env}) beside it")
    return loaded


if __name__ == "__main__":  # pragma: no cover - regenerates the documentation's table
    sys.stdout.write(settings_table())
