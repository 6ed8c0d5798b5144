"""Configuration from a TOML file, ``RECALLBOUND_*`` environment variables and arguments.

Each setting is declared once, on its :class:`~runtime_hooks.bootstrap.RecallConfig` field
(a :class:`~runtime_hooks.bootstrap.Setting` in the field's metadata: key, kind, meaning); the
file reader, the environment reader, ``config show`` and the documentation's table
(:func:`settings_table`) are derived from those declarations (:data:`FIELDS`).

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

From a file or the environment, a policy looser than the defaults (more than 4 searches or 2
rounds, a deadline beyond 10 s) or the legacy mode needs ``allow_looser_policy = true``, and an
ephemeral ledger (``":memory:"``) ``allow_ephemeral_ledger = true``. Relative paths in the file
are relative to the file's folder; elsewhere, to the working directory.
"""

from __future__ import annotations

import difflib
import enum
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from plugin.control.dsn import parse_location, redact
from plugin.errors import ConfigError, RecallboundError
from plugin.memory.planning import Admission

from .bootstrap import RecallConfig, Setting, is_ephemeral, loosened
from .ledgers import is_postgres, redact_location

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
"""Variables with this prefix belong to ``recallbound mcp`` (its ``[mcp]`` table), which reads
and checks them itself; they may hold secrets, so the configuration never reads or shows them."""
PRECEDENCE = ("explicit", "env", "file", "default")
"""Where a value may come from, the one that wins first."""


@attrs.frozen
class Source:
    """Where one value came from: ``kind`` is one of :data:`PRECEDENCE`."""

    kind: str
    where: str = ""

    def __str__(self) -> str:
        return self.kind if not self.where else f"{self.kind} ({self.where})"


class _Bad(Exception):
    """A value failed its check; the loader adds the key and the source."""


# -- value checks: one for typed values (TOML, arguments), one for environment text ----------


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"must be an integer, got {type(value).__name__} {value!r}")
    return value


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(f"must be a number, got {type(value).__name__} {value!r}")
    return float(value)


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"must be a boolean (true or false), got {type(value).__name__} {value!r}")
    return value


def _text(value: object) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise _Bad(f"must be a string, got {type(value).__name__} {value!r}")
    if not value.strip() or "\x00" in value:
        raise _Bad(f"must be a non-empty string with no NUL character, got {value!r}")
    return value


def _choice(kind: type[enum.Enum]) -> Callable[[object], enum.Enum]:
    def check(value: object) -> enum.Enum:
        if isinstance(value, kind):
            return value
        names = ", ".join(repr(m.value) for m in kind)
        if not isinstance(value, str):
            raise _Bad(f"must be one of {names}, got {type(value).__name__} {value!r}")
        try:
            return kind(value)
        except ValueError:
            raise _Bad(f"must be one of {names}, got {value!r}") from None

    return check


_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _env_int(text: str) -> object:
    if not _INT_TEXT.fullmatch(text):
        raise _Bad(f"must be a decimal integer, got {text!r}")
    return int(text)


def _env_float(text: str) -> object:
    if not _FLOAT_TEXT.fullmatch(text):
        raise _Bad(f"must be a decimal number, got {text!r}")
    return float(text)


def _env_bool(text: str) -> object:
    if text not in ("true", "false"):
        raise _Bad(f"must be exactly 'true' or 'false', got {text!r}")
    return text == "true"


def _env_text(text: str) -> object:
    return text


_TYPED: dict[str, Callable[[object], Any]] = {
    "path": _text, "text": _text, "admission": _text, "int": _int, "seconds": _float,
    "number": _float, "bool": _bool,
}
_FROM_ENV: dict[str, Callable[[str], object]] = {
    "int": _env_int, "seconds": _env_float, "number": _env_float, "bool": _env_bool,
}


@attrs.frozen
class _Field:
    """One key as the readers see it, derived from a RecallConfig field's :class:`Setting`."""

    key: str
    kind: str
    doc: str
    attribute: str
    """The RecallConfig field it sets."""
    part: str | None = None
    """Within a section: the field of the section's class."""
    default: object = None
    choices: type[enum.Enum] | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper().replace(".", "_")

    @property
    def path(self) -> bool:
        """Relative values from the file are taken relative to the file's folder."""
        return self.kind == "path"

    def check(self, value: object) -> Any:
        if self.choices is not None:
            return _choice(self.choices)(value)
        return _TYPED[self.kind](value)

    def from_env(self, text: str) -> object:
        return _FROM_ENV.get(self.kind, _env_text)(text)


def _default(field: attrs.Attribute[Any]) -> object:
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return default.factory()
    return None if default is attrs.NOTHING else default


def _declared() -> tuple[_Field, ...]:
    found: list[_Field] = []
    for field in attrs.fields(RecallConfig):
        setting = field.metadata.get("setting")
        if not isinstance(setting, Setting):
            continue
        if setting.kind == "section":
            assert setting.of is not None
            example = _default(field)
            for part in attrs.fields(setting.of):
                kind = "int" if part.type in (int, "int") else "number"
                found.append(_Field(
                    f"{setting.key}.{part.name}", kind,
                    setting.parts.get(part.name, f"{setting.of.__name__}.{part.name}"),
                    field.name, part.name, getattr(example, part.name)))
        else:
            choices = setting.of if setting.kind == "choice" else None
            found.append(_Field(setting.key, setting.kind, setting.doc, field.name,
                                default=_default(field), choices=choices))
    return tuple(found)


FIELDS: tuple[_Field, ...] = _declared()
"""Every configuration key, in the order ``config show`` prints them (RecallConfig's)."""

_BY_KEY = {f.key: f for f in FIELDS}
_BY_ENV = {f.env: f for f in FIELDS}
_SECTIONS = {f.key.split(".")[0] for f in FIELDS if f.part is not None}


def _unknown(name: str, where: str, known: list[str]) -> ConfigError:
    """The one error for a key nobody declared, with the nearest declared one."""
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return ConfigError(f"unknown setting {name!r} ({where}){hint}")


def _shown(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if callable(value):
        return f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', '?')}"
    return value


def settings_table() -> str:
    """The settings as a Markdown table (key, environment variable, default, meaning)."""
    lines = ["| Key | Environment variable | Default | Meaning |", "|---|---|---|---|"]
    for f in FIELDS:
        default = "(required)" if f.default is None and f.key in ("ledger", "store") else (
            "(unset)" if f.default is None else f"`{json.dumps(_shown(f.default))}`")
        if f.choices is not None:
            meaning = f"{f.doc} One of " + ", ".join(f"`{m.value}`" for m in f.choices) + "."
        else:
            meaning = f.doc
        lines.append(f"| `{f.key}` | `{f.env}` | {default} | {meaning} |")
    return "\n".join(lines) + "\n"


@attrs.frozen(kw_only=True)
class LoadedConfig:
    """The effective configuration: every key's value and where it came from."""

    file: Path | None
    values: Mapping[str, Any]
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
        ledger = self.values["ledger"]
        if ledger is not None:
            try:
                parse_location(ledger)
            except ConfigError as exc:
                raise ConfigError(f"ledger from {self.sources['ledger']}: {exc}") from None
        if ledger is not None and is_ephemeral(ledger) and \
                self.values["allow_ephemeral_ledger"] is not True:
            raise ConfigError(
                f"ledger from {self.sources['ledger']}: {redact(ledger)!r} keeps nothing once "
                f"closed, so "
                f"every open of a run would start a fresh allowance; use a file or a DSN, or "
                f"set allow_ephemeral_ledger = true (for tests only)")
        if self.values["allow_looser_policy"] is not True:
            for key, why in loosened(arguments["policy"], self.values["legacy"]):
                if self.sources[key].kind in ("file", "env"):
                    raise ConfigError(
                        f"{key} from {self.sources[key]}: {why}; a looser allowance needs "
                        f"allow_looser_policy = true ({_BY_KEY['allow_looser_policy'].env}) "
                        f"beside it")

    def looser(self) -> set[str]:
        """The keys whose values loosen the default allowance (``config show`` marks them)."""
        return {key for key, _ in loosened(self._arguments()["policy"], self.values["legacy"])}

    def describe(self) -> list[dict[str, Any]]:
        """One row per key for display: key, value (plain, a DSN's password hidden), source,
        and whether it loosens the default allowance."""
        rows = []
        looser = self.looser()
        for f in FIELDS:
            value = _shown(self.values[f.key])
            if f.key == "ledger" and isinstance(value, str):
                value = redact_location(value)
            source = self.sources[f.key]
            rows.append({"key": f.key, "value": value, "source": source.kind,
                         "where": source.where, "env": f.env, "looser": f.key in looser})
        return rows


def _relative_to(folder: Path, location: object) -> object:
    """A path read from the file, taken relative to the file's folder (a DSN unchanged)."""
    assert isinstance(location, str)  # checked by the field
    if is_postgres(location) or location == ":memory:" or location.startswith("file:"):
        return location
    return str(folder / location)


def _find_file(file: str | os.PathLike[str] | None, env: Mapping[str, str],
               cwd: Path) -> Path | None:
    if file is not None:
        path = cwd / Path(file)
        if not path.is_file():
            raise ConfigError(f"configuration file {str(path)!r} (given explicitly) does not exist")
        return path
    named = env.get(ENV_FILE)
    if named is not None:
        path = cwd / Path(named)
        if not named or not path.is_file():
            raise ConfigError(f"configuration file {named!r} (from {ENV_FILE}) does not exist")
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
                pass  # the MCP server's own table, read and checked by runtime_hooks.mcp.cli
            else:
                raise _unknown(key, f"in {path}", [*_BY_KEY, *_SECTIONS])

    walk(document, "")
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
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_FILE:
            continue
        if name.startswith((TEST_PREFIX, SERVER_PREFIX)) or name in TEST_VARIABLES:
            continue  # the test suite's or the MCP server's, not a setting
        if name not in _BY_ENV:
            raise _unknown(name, "environment variable", [*_BY_ENV, ENV_FILE])
        env_values[_BY_ENV[name].key] = (text, name)
    layers.append(("env", env_values, lambda f, text: f.check(f.from_env(str(text)))))

    explicit: dict[str, tuple[object, str]] = {}
    for key, value in (overrides or {}).items():
        if key not in _BY_KEY:
            raise _unknown(key, "argument", list(_BY_KEY))
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
            if field.path and kind == "file" and path is not None:
                value = _relative_to(path.parent, value)
            values[key] = value
            sources[key] = Source(kind, where)
    loaded = LoadedConfig(file=path, values=values, sources=sources, admission=admission)
    loaded.check()
    return loaded


if __name__ == "__main__":  # pragma: no cover - regenerates the documentation's table
    sys.stdout.write(settings_table())
