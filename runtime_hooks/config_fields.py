"""The configuration keys as the readers see them, derived from :mod:`runtime_hooks.settings`.

One :class:`_Field` per key (a section's parts are keys of their own, ``policy.max_searches``),
with its environment variable, its typed check and its text check for the environment, its
default and whether it widens a bound. :data:`FIELDS` is the one table the file reader, the
environment reader, ``config show`` and the documentation's table (:func:`settings_table`) use.
"""

from __future__ import annotations

import difflib
import enum
import json
import os
import re
from collections.abc import Callable
from typing import Any

import attrs

from plugin.errors import ConfigError

from .settings import ENV_PREFIX, RecallConfig, Setting, default_of

__all__ = ["FIELDS", "settings_table"]


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
    # The value itself is never repeated: a location may hold a password, in a form (a list,
    # bytes, a NUL) that no redaction reads.
    if not isinstance(value, str):
        raise _Bad(f"must be a string, got {type(value).__name__}")
    if not value.strip():
        raise _Bad("must be a non-empty string")
    if "\x00" in value:
        raise _Bad("must be a string with no NUL character")
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


INT_TEXT = re.compile(r"[+-]?[0-9]+")
FLOAT_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _env_int(text: str) -> object:
    if not INT_TEXT.fullmatch(text) or len(text) > 20:  # past 64 bits: no setting takes it
        raise _Bad(f"must be a decimal integer of at most 20 digits, got {text[:40]!r}")
    return int(text)


def _env_float(text: str) -> object:
    if not FLOAT_TEXT.fullmatch(text):
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
    widens: bool = False
    """A value above the default widens a bound (declared on the field's Setting)."""

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


def _declared() -> tuple[_Field, ...]:
    found: list[_Field] = []
    for field in attrs.fields(RecallConfig):
        setting = field.metadata.get("setting")
        if not isinstance(setting, Setting):
            continue
        if setting.kind == "section":
            assert setting.of is not None
            example = default_of(field)
            for part in attrs.fields(setting.of):
                kind = "int" if part.type in (int, "int") else "number"
                widens = isinstance(setting.widens, tuple) and part.name in setting.widens
                found.append(_Field(
                    f"{setting.key}.{part.name}", kind,
                    setting.parts.get(part.name, f"{setting.of.__name__}.{part.name}"),
                    field.name, part.name, getattr(example, part.name), widens=widens))
        else:
            choices = setting.of if setting.kind == "choice" else None
            found.append(_Field(setting.key, setting.kind, setting.doc, field.name,
                                default=default_of(field), choices=choices,
                                widens=setting.widens is True))
    return tuple(found)


FIELDS: tuple[_Field, ...] = _declared()
"""Every configuration key, in the order ``config show`` prints them (RecallConfig's)."""

_BY_KEY = {f.key: f for f in FIELDS}
_BY_ENV = {f.env: f for f in FIELDS}
_SECTIONS = {f.key.split(".")[0] for f in FIELDS if f.part is not None}


def unknown_setting(name: str, where: str, known: list[str]) -> ConfigError:
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
