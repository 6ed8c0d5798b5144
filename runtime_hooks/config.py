"""Configuration from a TOML file, ``RECALLBOUND_*`` environment variables and arguments.

Precedence, highest first: **explicit arguments > environment variables > the TOML file >
defaults**. The file is the ``file`` argument, else ``$RECALLBOUND_CONFIG``, else
``recallbound.toml`` in the working directory when it exists (a named file that is missing is
an error). Every key has one environment variable: ``RECALLBOUND_`` + the key upper-cased with
dots as underscores (``policy.max_searches`` -> ``RECALLBOUND_POLICY_MAX_SEARCHES``).

Every value is checked for its type and its range, and an error names the key and where the
value came from (``recallbound.toml: policy.max_searches``, ``RECALLBOUND_LEGACY``). Nothing
is coerced: ``legacy = "false"`` in TOML is an error, environment booleans are exactly
``true`` or ``false``, numbers in the environment are plain decimal literals. Unknown keys and
unknown ``RECALLBOUND_*`` variables are errors too (a typo must not fall back to a default).
Relative paths in the file are relative to the file's folder; elsewhere, to the working
directory.
"""

from __future__ import annotations

import enum
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from plugin.control import AllowancePolicy
from plugin.errors import RecallboundError
from plugin.memory.pipeline import ContextCaps
from plugin.memory.planning import Admission, QueryStrategy

from .bootstrap import RecallConfig, Semantic, Telemetry
from .ledgers import redact_location

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

FILE_NAME = "recallbound.toml"
ENV_PREFIX = "RECALLBOUND_"
ENV_FILE = "RECALLBOUND_CONFIG"
PRECEDENCE = ("explicit", "env", "file", "default")
"""Where a value may come from, the one that wins first."""


class ConfigError(RecallboundError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range.

    The message names the key and its source.
    """


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


@attrs.frozen
class _Field:
    key: str
    check: Callable[[object], Any]
    from_env: Callable[[str], object]
    default: object = None
    path: bool = False
    """Relative values from the file are taken relative to the file's folder."""

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper().replace(".", "_")


def _number_field(key: str, default: object, *, integer: bool) -> _Field:
    if integer:
        return _Field(key, _int, _env_int, default)
    return _Field(key, _float, _env_float, default)


_POLICY = AllowancePolicy()
_CAPS = ContextCaps()
_POLICY_KEYS = ("max_searches", "max_rounds", "deadline_s", "automatic_slots",
                "source_read_fallbacks")
_CAPS_KEYS = ("max_items", "max_bytes", "candidates_per_arm", "beliefs_per_person")

FIELDS: tuple[_Field, ...] = (
    _Field("ledger", _text, _env_text, None, path=True),
    _Field("store", _text, _env_text, None, path=True),
    *(_number_field(f"policy.{name}", getattr(_POLICY, name), integer=name != "deadline_s")
      for name in _POLICY_KEYS),
    _Field("query_planning", _choice(QueryStrategy), _env_text, QueryStrategy.BASELINE),
    _number_field("admission_timeout_s", 0.25, integer=False),
    _Field("semantic", _choice(Semantic), _env_text, Semantic.NONE),
    *(_number_field(f"caps.{name}", getattr(_CAPS, name), integer=True) for name in _CAPS_KEYS),
    _Field("legacy", _bool, _env_bool, False),
    _Field("telemetry", _choice(Telemetry), _env_text, Telemetry.NONE),
)
"""Every configuration key, in the order ``config show`` prints them."""

_BY_KEY = {f.key: f for f in FIELDS}
_BY_ENV = {f.env: f for f in FIELDS}


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
        v = self.values
        return RecallConfig(
            ledger_path=v["ledger"],
            store_path=v["store"],
            policy=self._build(AllowancePolicy, "policy", _POLICY_KEYS),
            query_planning=v["query_planning"],
            admission=self.admission,
            admission_timeout_s=v["admission_timeout_s"],
            semantic=v["semantic"],
            caps=self._build(ContextCaps, "caps", _CAPS_KEYS),
            legacy=v["legacy"],
            telemetry=v["telemetry"],
        )

    def _build(self, cls: Callable[..., Any], section: str, names: tuple[str, ...]) -> Any:
        try:
            return cls(**{name: self.values[f"{section}.{name}"] for name in names})
        except (ValueError, TypeError) as exc:
            # Blame the keys the message names (a rule may join two), or all that were set.
            named = [n for n in names if n in str(exc)] or [
                n for n in names if self.sources[f"{section}.{n}"].kind != "default"]
            where = "; ".join(f"{section}.{n} from {self.sources[f'{section}.{n}']}"
                              for n in named)
            raise ConfigError(f"{where}: {exc}") from None

    def check(self) -> None:
        """Validate what :meth:`recall_config` would build, ``ledger``/``store`` aside."""
        self._build(AllowancePolicy, "policy", _POLICY_KEYS)
        self._build(ContextCaps, "caps", _CAPS_KEYS)

    def describe(self) -> list[dict[str, Any]]:
        """One row per key for display: key, value (plain, a DSN's password hidden), source."""
        rows = []
        for f in FIELDS:
            value = self.values[f.key]
            if isinstance(value, enum.Enum):
                value = value.value
            if f.key == "ledger" and value is not None:
                value = redact_location(value)
            source = self.sources[f.key]
            rows.append({"key": f.key, "value": value, "source": source.kind,
                         "where": source.where, "env": f.env})
        return rows


def _relative_to(folder: Path, location: object) -> object:
    """A path read from the file, taken relative to the file's folder (a DSN unchanged)."""
    assert isinstance(location, str)  # checked by the field
    if "://" in location or location == ":memory:" or location.startswith("file:"):
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
            if key in ("policy", "caps"):
                if not isinstance(value, dict):
                    raise ConfigError(f"{path}: {key} must be a table ([{key}]), "
                                      f"got {type(value).__name__}")
                walk(value, key + ".")
            elif key in _BY_KEY:
                found[key] = (value, f"{path}: {key}")
            elif key == "mcp":
                pass  # the MCP server's own table, read and checked by runtime_hooks.mcp.cli
            else:
                known = ", ".join(sorted({f.key.split(".")[0] for f in FIELDS}))
                raise ConfigError(f"{path}: unknown key {key!r} (known: {known})")

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
    ``"ledger"``) to explicit values. ``admission`` (a callable) can only be given here.
    Raises :class:`ConfigError` naming the key and the source of the first bad value.
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
        if name not in _BY_ENV:
            raise ConfigError(f"unknown environment variable {name} "
                              f"(known: {', '.join(sorted(_BY_ENV))}, {ENV_FILE})")
        env_values[_BY_ENV[name].key] = (text, name)
    layers.append(("env", env_values, lambda f, text: f.check(f.from_env(str(text)))))

    explicit: dict[str, tuple[object, str]] = {}
    for key, value in (overrides or {}).items():
        if key not in _BY_KEY:
            raise ConfigError(f"unknown configuration key {key!r} (argument)")
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
    if not math.isfinite(values["admission_timeout_s"]) or values["admission_timeout_s"] <= 0:
        raise ConfigError(f"admission_timeout_s from {sources['admission_timeout_s']}: must be "
                          f"finite and > 0, got {values['admission_timeout_s']!r}")
    loaded = LoadedConfig(file=path, values=values, sources=sources, admission=admission)
    loaded.check()
    return loaded
