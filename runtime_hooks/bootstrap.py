"""The composition root: the one place that picks concrete classes and the system clock.

``async with open_hooks(RecallConfig(...)) as hooks:`` opens the SQLite ledger and the
reference memory store, builds the planner, the preparation and the retriever, and hands back
:class:`~runtime_hooks.hooks.RecallHooks`. Tests and replays pass a ``clock``; production gets
:class:`~plugin.SystemClock`.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from plugin.control import AllowancePolicy, Clock, RecallAllowance, SystemClock, observe
from plugin.errors import InvalidConfigError, InvalidConfigTypeError
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


class Semantic(enum.Enum):
    """Which embedding adapter the semantic arm uses."""

    NONE = "none"
    """Sparse arm only."""
    WORDLLAMA = "wordllama"
    """The packaged WordLlama model (the ``semantic`` extra), loaded offline."""
    HASHING = "hashing"
    """A deterministic hashing embedding sized like WordLlama (tests and demos without the
    extra)."""


class Telemetry(enum.Enum):
    """Where the allowance reports rounds and attempts."""

    NONE = "none"
    OTEL = "otel"
    """OpenTelemetry through the global providers (the ``otel`` extra)."""


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


def _admission(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not callable(value):
        raise InvalidConfigTypeError(
            f"RecallConfig.admission must be an async callable or None, got "
            f"{type(value).__name__}"
        )


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


def _legacy(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    # Only the bool itself: "false", "0" or 1 must never switch enforcement off (or on).
    if value is not True and value is not False:
        raise InvalidConfigTypeError(
            f"RecallConfig.legacy must be the bool True or False, got {value!r}; the "
            f"unenforced legacy mode is chosen only by an explicit legacy=True"
        )


def _telemetry_choice(value: object) -> Telemetry:
    return _choice(Telemetry, "telemetry", value)


@attrs.frozen(kw_only=True)
class RecallConfig:
    """What the host decides; everything else has a default.

    Every field is checked at construction: a wrong type raises
    :class:`~plugin.errors.InvalidConfigTypeError` (a ``TypeError``), a bad value
    :class:`~plugin.errors.InvalidConfigError` (a ``ValueError``), both naming the field.
    """

    ledger_path: str | os.PathLike[str] = attrs.field(validator=_path)
    store_path: str | os.PathLike[str] = attrs.field(validator=_path)
    policy: AllowancePolicy = attrs.field(factory=AllowancePolicy,
                                          validator=_instance(AllowancePolicy))
    query_planning: QueryStrategy = attrs.field(
        default=QueryStrategy.BASELINE, converter=_query_planning
    )
    admission: Admission | None = attrs.field(default=None, validator=_admission)
    admission_timeout_s: float = attrs.field(default=0.25, validator=_seconds)
    semantic: Semantic = attrs.field(default=Semantic.NONE, converter=_semantic)
    caps: ContextCaps = attrs.field(factory=ContextCaps, validator=_instance(ContextCaps))
    legacy: bool = attrs.field(default=False, validator=_legacy)
    """The explicit legacy mode: no enforcement, every attempt traced as legacy. Only the
    bool ``True`` turns it on."""
    preparation_budget_s: float = attrs.field(default=2.0, validator=_seconds)
    """How long one hook call may spend preparing its queries before the round."""
    telemetry: Telemetry = attrs.field(default=Telemetry.NONE, converter=_telemetry_choice)

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
        :class:`~runtime_hooks.config.ConfigError` naming the key and its source.
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


def load_embedding(choice: Semantic) -> EmbeddingAdapter | None:
    """The adapter for ``choice``; WordLlama needs the ``semantic`` extra."""
    if choice is Semantic.WORDLLAMA:
        from plugin.memory.wordllama_adapter import WordLlamaAdapter

        return WordLlamaAdapter.load()
    if choice is Semantic.HASHING:
        from plugin.memory.hashing import HashingEmbedding

        return HashingEmbedding.like_wordllama()
    return None


@asynccontextmanager
async def _telemetry(choice: Telemetry) -> AsyncIterator[None]:
    """Install the OpenTelemetry observer for the block unless one is installed already."""
    if choice is not Telemetry.OTEL or observe.current_observer() is not None:
        yield
        return
    try:
        from . import telemetry  # the `otel` extra, imported only when configured
    except ImportError as exc:
        from .config import ConfigError

        raise ConfigError(f"telemetry = 'otel' needs the otel extra "
                          f"(pip install 'recallbound[otel]'): {exc}") from None
    observer = telemetry.install()
    try:
        yield
    finally:
        telemetry.uninstall(observer)


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
    the hooks search it instead of the reference store, which is then not opened; the
    configuration, telemetry and context caps apply the same. A ``retriever`` that does not
    implement the protocol raises :class:`~plugin.errors.RetrieverProtocolError` (a
    ``TypeError`` naming the method) before anything is opened.
    """
    if retriever is not None:
        retriever = check_retriever(retriever)
    clock = clock if clock is not None else SystemClock()
    if embedding is None:
        embedding = load_embedding(config.semantic)
    async with AsyncExitStack() as stack:
        ledger = await stack.enter_async_context(open_ledger(config.ledger_path))
        if retriever is None:
            store = await stack.enter_async_context(
                MemoryStore(config.store_path, embedding=embedding, clock=clock))
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
