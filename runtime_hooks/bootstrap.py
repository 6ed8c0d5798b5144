"""The composition root: the one place that picks concrete classes and the system clock.

``async with open_hooks(RecallConfig(...)) as hooks:`` opens the SQLite ledger and the
reference memory store, builds the planner, the preparation and the retriever, and hands back
:class:`~runtime_hooks.hooks.RecallHooks`. Tests and replays pass a ``clock``; production gets
:class:`~plugin.SystemClock`.
"""

from __future__ import annotations

import enum
import importlib
import logging
import math
import os
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

import attrs

from plugin.control import AllowancePolicy, Clock, RecallAllowance, SystemClock, observe
from plugin.control.logs import log_event
from plugin.errors import ConfigError, InvalidConfigError, InvalidConfigTypeError
from plugin.memory import embedding_choice
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.pipeline import ContextCaps, MemoryRetriever
from plugin.memory.planning import Admission, QueryPlanner, QueryStrategy
from plugin.memory.preparation import QueryPreparation
from plugin.memory.protocol import Retriever, check_retriever
from plugin.memory.store import MemoryStore

from .hooks import RecallHooks
from .ledgers import open_ledger

if TYPE_CHECKING:
    from .config import LoadedConfig

_log = logging.getLogger("recallbound.config")


class Semantic(enum.Enum):
    """Which embedding adapter the semantic arm uses (:func:`load_embedding` loads it)."""

    NONE = "none"
    """Sparse arm only (the default: the semantic arm is chosen, never switched on by an
    installed package)."""
    AUTO = "auto"
    """The best installed adapter: WordLlama (the ``semantic`` extra; the pipeline's semantic
    thresholds are calibrated on it), else MiniLM (the ``minilm`` extra), else none."""
    WORDLLAMA = "wordllama"
    """The packaged WordLlama model (the ``semantic`` extra), loaded offline."""
    MINILM = "minilm"
    """all-MiniLM-L6-v2 on onnxruntime (the ``minilm`` extra), loaded offline."""
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

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper().replace(".", "_")


def _setting(key: str, kind: str, doc: str, of: type | None = None,
             **parts: str) -> dict[str, Setting]:
    return {"setting": Setting(key, kind, doc, of, parts)}


_E = TypeVar("_E", bound=enum.Enum)


def _path(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, (str, os.PathLike)):
        raise InvalidConfigTypeError(
            f"RecallConfig.{attribute.name} must be a str or path, got {type(value).__name__}"
        )
    if not os.fspath(value):
        raise InvalidConfigError(f"RecallConfig.{attribute.name} must not be empty")


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
        raise InvalidConfigError(
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
        raise InvalidConfigError(
            f"RecallConfig.admission {value!r} cannot be imported: {exc}") from None
    if not callable(found):
        raise InvalidConfigError(
            f"RecallConfig.admission {value!r} is a {type(found).__name__}, not a callable")
    return cast(Admission, found)


def _seconds(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidConfigTypeError(
            f"RecallConfig.{attribute.name} must be a number of seconds, got "
            f"{type(value).__name__}"
        )
    if not (math.isfinite(value) and value > 0):
        raise InvalidConfigError(
            f"RecallConfig.{attribute.name} must be finite and > 0, got {value!r}"
        )


def _flag(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    # Only the bool itself: "false", "0" or 1 must never switch a safeguard off (or on).
    if value is not True and value is not False:
        raise InvalidConfigTypeError(
            f"RecallConfig.{attribute.name} must be the bool True or False, got {value!r}"
        )


def _telemetry_choice(value: object) -> Telemetry:
    return _choice(Telemetry, "telemetry", value)


def is_ephemeral(location: str | os.PathLike[str]) -> bool:
    """Whether a ledger location keeps nothing once closed (an in-memory SQLite database)."""
    text = os.fspath(location)
    if text == ":memory:":
        return True
    if text.startswith("file:"):
        query = urllib.parse.urlsplit(text).query
        return text.startswith("file::memory:") or "memory" in urllib.parse.parse_qs(
            query).get("mode", [])
    return False


@attrs.frozen(kw_only=True)
class RecallConfig:
    """What the host decides; everything else has a default.

    Every field is checked at construction: a wrong type raises
    :class:`~plugin.errors.InvalidConfigTypeError` (a ``TypeError``), a bad value
    :class:`~plugin.errors.InvalidConfigError` (a ``ValueError``), both naming the field.
    Each field's ``setting`` metadata (:class:`Setting`) is its key in ``recallbound.toml``
    and its environment variable; :mod:`runtime_hooks.config` reads them from there.

    Built in code, the host decides: a policy looser than the defaults, or the legacy mode,
    needs no ``allow_looser_policy`` but is logged at WARNING when the hooks open (from a
    file or the environment it needs ``allow_looser_policy = true``). An ephemeral ledger
    (``":memory:"``) needs ``allow_ephemeral_ledger=True`` wherever it comes from.
    """

    ledger_path: str | os.PathLike[str] = attrs.field(validator=_path, metadata=_setting(
        "ledger", "path", "The durable ledger: a SQLite file, or a postgresql:// DSN "
        "(?schema=NAME)."))
    store_path: str | os.PathLike[str] | None = attrs.field(
        default=None, validator=attrs.validators.optional(_path), metadata=_setting(
            "store", "path", "The reference memory store's SQLite file."))
    policy: AllowancePolicy = attrs.field(
        factory=AllowancePolicy, validator=_instance(AllowancePolicy), metadata=_setting(
            "policy", "section", "The allowance per run.", AllowancePolicy,
            max_searches="Searches per run, over all its rounds (looser than 4 needs "
                         "allow_looser_policy).",
            max_rounds="Rounds per run (looser than 2 needs allow_looser_policy).",
            deadline_s="Seconds from a run's first round to its deadline (looser than 10 needs "
                       "allow_looser_policy).",
            automatic_slots="Slots an automatic round reserves.",
            source_read_fallbacks="Source reads one round may add after its searches."))
    allow_looser_policy: bool = attrs.field(default=False, validator=_flag, metadata=_setting(
        "allow_looser_policy", "bool", "Required (from a file or the environment) for a "
        "policy looser than the defaults or the legacy mode."))
    query_planning: QueryStrategy = attrs.field(
        default=QueryStrategy.BASELINE, converter=_query_planning, metadata=_setting(
            "query_planning", "choice", "The query composer: baseline or the task_context "
            "experiment.", QueryStrategy))
    admission: Admission | None = attrs.field(default=None, converter=_admission,
                                              metadata=_setting(
        "admission", "admission", "Who admits the task_context experiment: 'always' or "
        "'module:function' (an async callable); unset, the experiment is never admitted."))
    admission_timeout_s: float = attrs.field(default=0.25, validator=_seconds, metadata=_setting(
        "admission_timeout_s", "seconds", "How long one admission may take."))
    semantic: Semantic = attrs.field(default=Semantic.NONE, converter=_semantic,
                                     metadata=_setting(
        "semantic", "choice", "The semantic arm's embedding: none, auto (the best installed), "
        "wordllama, minilm or hashing.", Semantic))
    caps: ContextCaps = attrs.field(factory=ContextCaps, validator=_instance(ContextCaps),
                                    metadata=_setting(
        "caps", "section", "What one search hands the model.", ContextCaps,
        max_items="Most evidence items rendered.",
        max_bytes="Most UTF-8 bytes of rendered evidence.",
        candidates_per_arm="How many candidates each arm contributes to ranking.",
        beliefs_per_person="Most beliefs rendered per person named."))
    legacy: bool = attrs.field(default=False, validator=_flag, metadata=_setting(
        "legacy", "bool", "The unenforced legacy mode (needs allow_looser_policy from a file "
        "or the environment)."))
    """The explicit legacy mode: no enforcement, every attempt traced as legacy. Only the
    bool ``True`` turns it on."""
    preparation_budget_s: float = attrs.field(default=2.0, validator=_seconds, metadata=_setting(
        "preparation_budget_s", "seconds", "How long one hook call may spend preparing its "
        "queries."))
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
        if is_ephemeral(self.ledger_path) and not self.allow_ephemeral_ledger:
            raise InvalidConfigError(
                f"RecallConfig.ledger_path {os.fspath(self.ledger_path)!r} keeps nothing once "
                f"closed, so every open of a run would start a fresh allowance; use a file or "
                f"a DSN, or set allow_ephemeral_ledger (for tests only)")

    def loosened(self) -> list[tuple[str, str]]:
        """``(key, why)`` for each setting looser than the default allowance."""
        return loosened(self.policy, self.legacy)

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


LOOSENING = ("max_searches", "max_rounds", "deadline_s")
"""The policy fields whose raise loosens the allowance (the defaults: 4 searches, 2 rounds,
10 s)."""


def loosened(policy: AllowancePolicy, legacy: bool) -> list[tuple[str, str]]:
    """``(key, why)`` for each setting of ``policy``/``legacy`` looser than the defaults."""
    default = AllowancePolicy()
    found = [
        (f"policy.{name}", f"{getattr(policy, name)!r} is looser than the default "
                           f"{getattr(default, name)!r}")
        for name in LOOSENING if getattr(policy, name) > getattr(default, name)
    ]
    if legacy is True:
        found.append(("legacy", "the legacy mode enforces no allowance"))
    return found


def load_embedding(choice: Semantic) -> EmbeddingAdapter | None:
    """The adapter for ``choice`` (:mod:`plugin.memory.embedding_choice` loads it).

    WordLlama needs the ``semantic`` extra, MiniLM the ``minilm`` extra; ``AUTO`` takes the
    best installed (see :class:`Semantic`).
    """
    return embedding_choice.load_embedding(Semantic(choice).value)


def best_installed() -> Semantic:
    """What ``semantic = "auto"`` loads: WordLlama, else MiniLM, else none."""
    return Semantic(embedding_choice.best_installed())


def _warn_about(config: RecallConfig) -> None:
    """WARNING for each loosened setting (named, with its source) and an unadmittable
    experiment, when the hooks open."""
    for key, why in config.loosened():
        source = config.sources.get(key, "code (RecallConfig)")
        log_event(_log, logging.WARNING, "config.looser_policy", setting=key, source=source,
                  detail=why)
    if config.query_planning is QueryStrategy.TASK_CONTEXT and config.admission is None:
        log_event(_log, logging.WARNING, "config.never_admitted", setting="query_planning",
                  source=config.sources.get("query_planning", "code (RecallConfig)"),
                  detail="task_context is configured but no admission is: every query is "
                         "the baseline (set admission)")


@asynccontextmanager
async def _telemetry(choice: Telemetry) -> AsyncIterator[None]:
    """Install the OpenTelemetry observer for the block unless one is installed already."""
    if choice is not Telemetry.OTEL or observe.current_observer() is not None:
        yield
        return
    try:
        from . import telemetry  # the `otel` extra, imported only when configured
    except ImportError as exc:
        raise ConfigError(f"telemetry = 'otel' needs the otel extra "
                          f"(pip install 'recallbound[otel]'): {exc}") from None
    observer = telemetry.install()
    try:
        yield
    finally:
        telemetry.uninstall(observer)


def required_store_path(config: RecallConfig) -> str | os.PathLike[str]:
    """The reference store's path; :class:`~plugin.errors.ConfigError` when it is not set."""
    if config.store_path is None:
        raise ConfigError(
            "RecallConfig.store_path is not set: the reference memory store needs it (or "
            "give open_hooks your own retriever=, which opens no store)"
        )
    return config.store_path


@asynccontextmanager
async def open_hooks(
    config: RecallConfig,
    *,
    clock: Clock | None = None,
    embedding: EmbeddingAdapter | None = None,
    retriever: Retriever | None = None,
) -> AsyncIterator[RecallHooks]:
    """Open the ledger (and the reference store) and wire the hooks; close them on exit.

    With ``retriever`` (your own memory backend, e.g. a :class:`~plugin.SimpleRetriever`),
    the hooks search it instead of the reference store, which is then not opened (and
    ``config.store_path`` may be left unset; without a retriever it is required); the
    configuration, telemetry and context caps apply the same. A ``retriever`` that does not
    implement the protocol raises :class:`~plugin.errors.RetrieverProtocolError` (a
    ``TypeError`` naming the method) before anything is opened.
    """
    if retriever is not None:
        retriever = check_retriever(retriever)
    else:
        required_store_path(config)  # checked before anything is opened
    clock = clock if clock is not None else SystemClock()
    if embedding is None:
        embedding = load_embedding(config.semantic)
    _warn_about(config)
    async with AsyncExitStack() as stack:
        ledger = await stack.enter_async_context(open_ledger(config.ledger_path))
        if retriever is None:
            store = await stack.enter_async_context(
                MemoryStore(required_store_path(config), embedding=embedding, clock=clock))
            retriever = MemoryRetriever(store)
        await stack.enter_async_context(_telemetry(config.telemetry))
        if config.legacy is True:
            allowance = RecallAllowance.legacy(ledger, clock=clock)
        else:
            allowance = RecallAllowance(ledger, policy=config.policy, clock=clock)
        planner = QueryPlanner(
            config.query_planning,
            admission=config.admission,
            admission_timeout_s=config.admission_timeout_s,
        )
        yield RecallHooks(
            allowance=allowance,
            preparer=QueryPreparation(planner, embedding),
            retriever=retriever,
            caps=config.caps,
            preparation_budget_s=config.preparation_budget_s,
        )
