"""The settings: :class:`RecallConfig`, each field declared once with how it is set.

Each field's metadata holds its :class:`Setting`: the TOML key (the environment variable is
derived from it), how the value is written, its meaning, and whether a value above its default
*widens a bound* (``widens``). The field's attrs validator or converter is its check. The file
reader, the environment reader, ``config show``, the documentation's table
(:mod:`runtime_hooks.config`) and the looser-policy rule (:func:`loosened`) are all derived from
these declarations; nothing about a setting is written twice.

A setting that widens a bound (more searches, rounds, a later deadline, more source-read
fallbacks, larger context caps, a longer preparation or admission budget, or the legacy mode)
needs ``allow_looser_policy`` when it comes from a file or the environment, and ``config show``
marks it looser. Built in code, the host decides; the hooks log each one at WARNING when they
open.

This module imports neither the readers nor the composition root: both import it.
:meth:`RecallConfig.from_sources` reaches the readers when it is called.
"""

from __future__ import annotations

import enum
import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import attrs

from plugin.control import AllowancePolicy, validate
from plugin.control.dsn import is_connection_string, parse_location, redact
from plugin.control.dsn import shown_location as _displayed
from plugin.control.dsn_text import is_ephemeral, location_problem
from plugin.errors import (
    ConfigError,
    InvalidConfigTypeError,
    LedgerConfigError,
)
from plugin.memory.planning import Admission, QueryStrategy
from plugin.memory.protocol import ContextCaps

if TYPE_CHECKING:
    from .config import LoadedConfig

__all__ = [
    "ADMISSION_ALWAYS", "ENV_PREFIX", "RecallConfig", "Semantic", "Setting", "Telemetry",
    "admit_always", "is_ephemeral", "loosened",
]


class Semantic(enum.Enum):
    """Which embedding adapter the semantic arm uses (:func:`load_embedding` loads it)."""

    NONE = "none"
    """Sparse arm only (the default: the semantic arm is chosen, never switched on by an
    installed package)."""
    AUTO = "auto"
    """The best installed adapter: MiniLM with WordLlama's word match where the ``minilm``
    and ``semantic`` extras are both installed, else WordLlama, else MiniLM, else none."""
    WORDLLAMA = "wordllama"
    """The packaged WordLlama model (the ``semantic`` extra), loaded offline."""
    MINILM = "minilm"
    """all-MiniLM-L6-v2 on onnxruntime (the ``minilm`` extra), loaded offline; it matches
    words in WordLlama's word space where the ``semantic`` extra is installed too."""
    HASHING = "hashing"
    """A deterministic hashing embedding sized like WordLlama (tests and demos without the
    extra)."""


class Telemetry(enum.Enum):
    """Where the allowance reports rounds and attempts."""

    NONE = "none"
    OTEL = "otel"
    """OpenTelemetry through the global providers (the ``otel`` extra)."""


# -- settings: each declared once, beside its RecallConfig field --------------------------------

ENV_PREFIX = "RECALLBOUND_"


@attrs.frozen
class Setting:
    """How one :class:`RecallConfig` field is set from a file and the environment.

    ``key`` is the TOML key, ``kind`` how its value is written (``path``, ``int``,
    ``seconds``, ``bool``, ``choice`` of the enum ``of``, ``admission``, or ``section``: a
    table whose keys are the fields of the attrs class ``of``, ``policy.max_searches``). The
    environment variable is ``RECALLBOUND_`` + the key upper-cased, dots as underscores.
    """

    key: str
    kind: str
    doc: str
    of: type | None = None
    parts: Mapping[str, str] = attrs.field(factory=dict)
    """A section's keys and their meaning (the keys are the fields of ``of``)."""
    widens: bool | tuple[str, ...] = False
    """Whether a value above the default widens a bound (needs ``allow_looser_policy`` from a
    file or the environment); for a section, the names of its parts that do. A bool setting
    widens when it is ``true``."""
    looser: str = ""
    """For a widening bool: what turning it on does, for the warning and the error."""

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper().replace(".", "_")


def _setting(key: str, kind: str, doc: str, of: type | None = None, *,
             widens: bool | tuple[str, ...] = False, looser: str = "",
             **parts: str) -> dict[str, Setting]:
    return {"setting": Setting(key, kind, doc, of, parts, widens, looser)}


_E = TypeVar("_E", bound=enum.Enum)


def _path(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, (str, os.PathLike)):
        raise InvalidConfigTypeError(
            f"RecallConfig.{attribute.name} must be a str or path, got {type(value).__name__}"
        )
    text = os.fsdecode(os.fspath(value))
    problem = location_problem(text, file=not is_connection_string(text))
    if problem is not None:
        raise ConfigError(f"RecallConfig.{attribute.name} {problem}")


def shown_location(value: object) -> str:
    """The ``repr`` of a location (a file path or a DSN) with its password hidden."""
    if not isinstance(value, (str, os.PathLike)):
        return repr(value)
    text = repr(_displayed(value))
    return text if isinstance(value, str) else f"{type(value).__name__}({text})"


def check_store_location(location: str | os.PathLike[str], named: str) -> None:
    """Refuse a store ``location`` (``named`` says whence) that is a connection string."""
    if is_connection_string(location):
        raise ConfigError(
            f"{named} {shown_location(location)} is a connection string, but the reference "
            f"memory store is a SQLite file: give its path (only the ledger runs on PostgreSQL)")


def _instance(kind: type) -> Any:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, kind):
            raise InvalidConfigTypeError(
                f"RecallConfig.{attribute.name} must be a {kind.__name__}, "
                f"got {type(value).__name__}"
            )
    return check


def _choice(kind: type[_E], name: str, value: object) -> _E:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(member.value) for member in kind)
        raise ConfigError(
            f"RecallConfig.{name} must be one of {choices}, got {value!r}"
        ) from None


def _query_planning(value: object) -> QueryStrategy:
    return _choice(QueryStrategy, "query_planning", value)


def _semantic(value: object) -> Semantic:
    return _choice(Semantic, "semantic", value)


async def admit_always(experiment: str) -> bool:
    """The admission ``admission = "always"`` names: every experiment is admitted."""
    return True


ADMISSION_ALWAYS = "always"


def _admission(value: object) -> Admission | None:
    """``None``, an async callable, ``"always"``, or ``"module:function"`` (imported now)."""
    if value is None or (callable(value) and not isinstance(value, str)):
        return value
    if not isinstance(value, str):
        raise InvalidConfigTypeError(
            f"RecallConfig.admission must be an async callable, 'always', 'module:function' "
            f"or None, got {type(value).__name__}"
        )
    if value == ADMISSION_ALWAYS:
        return admit_always
    module_name, colon, name = value.partition(":")
    if not colon or not module_name.strip() or not name.strip():
        raise InvalidConfigTypeError(  # a ConfigError too: also a ValueError
            f"RecallConfig.admission must be an async callable, 'always' or 'module:function', "
            f"got {value!r}")
    try:
        found: object = importlib.import_module(module_name)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"RecallConfig.admission {value!r} cannot be imported: {exc}") from None
    if not callable(found):
        raise ConfigError(
            f"RecallConfig.admission {value!r} is a {type(found).__name__}, not a callable")
    return cast(Admission, found)


def _seconds(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    validate.seconds(value, field=f"RecallConfig.{attribute.name}", error=ConfigError,
                     type_error=InvalidConfigTypeError)


def _flag(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    # Only the bool itself: "false", "0" or 1 must never switch a safeguard off (or on).
    if value is not True and value is not False:
        raise InvalidConfigTypeError(
            f"RecallConfig.{attribute.name} must be the bool True or False, got {value!r}"
        )


def _telemetry_choice(value: object) -> Telemetry:
    return _choice(Telemetry, "telemetry", value)


@attrs.frozen(kw_only=True)
class RecallConfig:
    """What the host decides; everything else has a default.

    Every field is checked at construction: a wrong type raises
    :class:`~plugin.errors.InvalidConfigTypeError` (a ``TypeError``), a bad value
    :class:`~plugin.errors.ConfigError` (a ``ValueError``), both naming the field.
    Each field's ``setting`` metadata (:class:`Setting`) is its key in ``recallbound.toml``
    and its environment variable; :mod:`runtime_hooks.config` reads them from there.

    Built in code, the host decides: a policy looser than the defaults, or the legacy mode,
    needs no ``allow_looser_policy`` but is logged at WARNING when the hooks open (from a
    file or the environment it needs ``allow_looser_policy = true``). An ephemeral ledger
    (``":memory:"``) needs ``allow_ephemeral_ledger=True`` wherever it comes from.
    """

    ledger_path: str | os.PathLike[str] = attrs.field(
        validator=_path, repr=shown_location, metadata=_setting(
        "ledger", "path", "The durable ledger: a SQLite file, a postgresql:// DSN "
        "(?schema=NAME), or a libpq key=value connection string."))
    store_path: str | os.PathLike[str] | None = attrs.field(
        default=None, validator=attrs.validators.optional(_path), repr=shown_location,
        metadata=_setting(
            "store", "path", "The reference memory store's SQLite file (a file path: a "
            "connection string is an error)."))
    """Not needed when :func:`~runtime_hooks.bootstrap.open_hooks` is given a retriever."""
    policy: AllowancePolicy = attrs.field(
        factory=AllowancePolicy, validator=_instance(AllowancePolicy), metadata=_setting(
            "policy", "section", "The allowance per run.", AllowancePolicy,
            widens=("max_searches", "max_rounds", "deadline_s", "source_read_fallbacks"),
            max_searches="Searches per run, over all its rounds (looser than 4 needs "
                         "allow_looser_policy).",
            max_rounds="Rounds per run (looser than 2 needs allow_looser_policy).",
            deadline_s="Seconds from a run's first round to its deadline (looser than 10 needs "
                       "allow_looser_policy).",
            automatic_slots="Slots an automatic round reserves.",
            source_read_fallbacks="Source reads one round may add after its searches (more "
                                  "than 2 needs allow_looser_policy)."))
    allow_looser_policy: bool = attrs.field(default=False, validator=_flag, metadata=_setting(
        "allow_looser_policy", "bool", "Required (from a file or the environment) for any "
        "setting that widens a bound past its default, or the legacy mode."))
    query_planning: QueryStrategy = attrs.field(
        default=QueryStrategy.BASELINE, converter=_query_planning, metadata=_setting(
            "query_planning", "choice", "The query composer: baseline or the task_context "
            "experiment.", QueryStrategy))
    admission: Admission | None = attrs.field(default=None, converter=_admission,
                                              metadata=_setting(
        "admission", "admission", "Who admits the task_context experiment: 'always' or "
        "'module:function' (an async callable); unset, the experiment is never admitted."))
    admission_timeout_s: float = attrs.field(default=0.25, validator=_seconds, metadata=_setting(
        "admission_timeout_s", "seconds", "How long one admission may take (longer than 0.25 "
        "needs allow_looser_policy).", widens=True))
    semantic: Semantic = attrs.field(default=Semantic.NONE, converter=_semantic,
                                     metadata=_setting(
        "semantic", "choice", "The semantic arm's embedding: none, auto (the best installed), "
        "wordllama, minilm or hashing.", Semantic))
    caps: ContextCaps = attrs.field(factory=ContextCaps, validator=_instance(ContextCaps),
                                    metadata=_setting(
        "caps", "section", "What one search hands the model.", ContextCaps,
        widens=("max_items", "max_bytes", "candidates_per_arm", "beliefs_per_person"),
        max_items="Most evidence items rendered (more than 8 needs allow_looser_policy).",
        max_bytes="Most UTF-8 bytes of rendered evidence (more than 4096 needs "
                  "allow_looser_policy).",
        candidates_per_arm="How many candidates each arm contributes to ranking; with "
                           "max_items it sets how many items of a read are examined (more "
                           "than 20 needs allow_looser_policy).",
        beliefs_per_person="Most beliefs rendered per person named (more than 3 needs "
                           "allow_looser_policy)."))
    legacy: bool = attrs.field(default=False, validator=_flag, metadata=_setting(
        "legacy", "bool", "The unenforced legacy mode (needs allow_looser_policy from a file "
        "or the environment).", widens=True, looser="the legacy mode enforces no allowance"))
    """The explicit legacy mode: no enforcement, every attempt traced as legacy. Only the
    bool ``True`` turns it on."""
    preparation_budget_s: float = attrs.field(default=2.0, validator=_seconds, metadata=_setting(
        "preparation_budget_s", "seconds", "How long one hook call may spend preparing its "
        "queries (longer than 2 needs allow_looser_policy).", widens=True))
    """How long one hook call may spend preparing its queries before the round."""
    telemetry: Telemetry = attrs.field(default=Telemetry.NONE, converter=_telemetry_choice,
                                       metadata=_setting(
        "telemetry", "choice", "Where rounds and attempts are reported: none or otel.",
        Telemetry))
    allow_ephemeral_ledger: bool = attrs.field(default=False, validator=_flag,
                                               metadata=_setting(
        "allow_ephemeral_ledger", "bool", "Accept a ledger that keeps nothing once closed "
        "(':memory:'): for tests only."))
    sources: Mapping[str, str] = attrs.field(factory=dict, eq=False, repr=False)
    """Where each setting not left at its default came from (``{"policy.max_searches":
    "env (RECALLBOUND_POLICY_MAX_SEARCHES)"}``), for the warnings; empty when built in code."""

    def __attrs_post_init__(self) -> None:
        try:
            parse_location(self.ledger_path)
        except LedgerConfigError as exc:
            raise LedgerConfigError(f"RecallConfig.ledger_path: {exc}") from None
        if self.store_path is not None:
            check_store_location(self.store_path, "RecallConfig.store_path")
        if is_ephemeral(self.ledger_path) and not self.allow_ephemeral_ledger:
            raise ConfigError(
                f"RecallConfig.ledger_path {redact(self.ledger_path)!r} keeps nothing once "
                f"closed, so every open of a run would start a fresh allowance; use a file or "
                f"a DSN, or set allow_ephemeral_ledger (for tests only)")

    def loosened(self) -> list[tuple[str, str]]:
        """``(key, why)`` for each setting that widens a bound past its default."""
        return loosened({f.name: getattr(self, f.name) for f in attrs.fields(RecallConfig)})

    @classmethod
    def from_sources(
        cls,
        file: str | os.PathLike[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, object] | None = None,
        admission: Admission | None = None,
    ) -> RecallConfig:
        """Read ``recallbound.toml`` (or ``file``), ``RECALLBOUND_*`` and ``overrides``.

        See :mod:`runtime_hooks.config` (explicit > environment > file > defaults); raises
        :class:`~plugin.errors.ConfigError` naming the key and its source.
        """
        return cls.load(file, env=env, overrides=overrides, admission=admission).recall_config()

    @staticmethod
    def load(
        file: str | os.PathLike[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, object] | None = None,
        admission: Admission | None = None,
    ) -> LoadedConfig:
        """:meth:`from_sources`, keeping where each value came from."""
        from .config import load_config

        return load_config(file, env=env, overrides=overrides, admission=admission)


def default_of(field: attrs.Attribute[Any]) -> Any:
    """A field's default value (a factory called), or None when it has none."""
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return default.factory()
    return None if default is attrs.NOTHING else default


def loosened(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(key, why)`` for each setting in ``values`` (RecallConfig field name -> value, a
    section as its built value) that widens a bound past its default, as declared."""
    found: list[tuple[str, str]] = []
    for field in attrs.fields(RecallConfig):
        setting = field.metadata.get("setting")
        if not isinstance(setting, Setting) or not setting.widens or field.name not in values:
            continue
        value, default = values[field.name], default_of(field)
        if setting.kind == "section":
            assert isinstance(setting.widens, tuple)
            for part in setting.widens:
                mine, usual = getattr(value, part), getattr(default, part)
                if mine > usual:
                    found.append((f"{setting.key}.{part}",
                                  f"{mine!r} is looser than the default {usual!r}"))
        elif setting.kind == "bool":
            if value is True:
                found.append((setting.key, setting.looser or f"{setting.key} is on"))
        elif value > default:
            found.append((setting.key, f"{value!r} is looser than the default {default!r}"))
    return found
