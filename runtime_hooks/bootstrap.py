"""The composition root: the one place that picks concrete classes and the system clock.

``async with open_hooks(RecallConfig(...)) as hooks:`` opens the ledger and the
reference memory store, builds the planner, the preparation and the retriever, and hands back
:class:`~runtime_hooks.hooks.RecallHooks`. Tests and replays pass a ``clock``; production gets
:class:`~plugin.SystemClock`. The settings themselves (:class:`RecallConfig`) are declared in
:mod:`runtime_hooks.settings` and importable from here.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio

from plugin.control import Clock, RecallAllowance, SystemClock, observe
from plugin.control.logs import log_event
from plugin.errors import ConfigError, LedgerError
from plugin.memory import embedding_choice
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.pipeline import MemoryRetriever
from plugin.memory.planning import QueryPlanner, QueryStrategy
from plugin.memory.preparation import QueryPreparation
from plugin.memory.protocol import Retriever, check_retriever
from plugin.memory.store import MemoryStore

from ._extras import missing_extra
from .hooks import RecallHooks
from .ledgers import open_ledger
from .settings import ADMISSION_ALWAYS as ADMISSION_ALWAYS
from .settings import ENV_PREFIX as ENV_PREFIX
from .settings import RecallConfig as RecallConfig
from .settings import Semantic as Semantic
from .settings import Setting as Setting
from .settings import Telemetry as Telemetry
from .settings import admit_always as admit_always
from .settings import is_ephemeral as is_ephemeral
from .settings import loosened as loosened

_log = logging.getLogger("recallbound.config")
_memory_log = logging.getLogger("recallbound.memory")


def load_embedding(choice: Semantic) -> EmbeddingAdapter | None:
    """The adapter for ``choice`` (:mod:`plugin.memory.embedding_choice` loads it).

    WordLlama needs the ``semantic`` extra, MiniLM the ``minilm`` extra; ``AUTO`` takes the
    best installed (see :class:`Semantic`). A missing extra is a
    :class:`~runtime_hooks._extras.MissingExtraError` naming it.
    """
    chosen = Semantic(choice)
    extra = "minilm" if chosen is Semantic.MINILM else "semantic"
    with missing_extra(extra, f"the {chosen.value} embedding"):
        return embedding_choice.load_embedding(chosen.value)


def best_installed() -> Semantic:
    """What ``semantic = "auto"`` loads (see :class:`Semantic`)."""
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


async def _warn_about_vectors(store: MemoryStore) -> None:
    """WARNING when stored memories have no vector for the configured model (written while
    ``semantic`` named another model, or none): the semantic arm does not see them."""
    if store.embedding is None or not await store.unembedded(probe=64):
        return
    missing = await store.unembedded()
    if missing:
        log_event(_memory_log, logging.WARNING, "store.unembedded", model=store.embedding.name,
                  memories=missing,
                  detail="the semantic arm does not see these memories until their vectors "
                         "are computed: run `recallbound memory embed`")


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


@asynccontextmanager
async def _owed_written(allowance: RecallAllowance) -> AsyncIterator[None]:
    """On the way out, before the ledger closes, write what rounds still owe
    (:meth:`RecallAllowance.flush`): its error is raised, unless the block raised first."""
    try:
        yield
    except BaseException:
        with anyio.CancelScope(shield=True), contextlib.suppress(LedgerError):
            await allowance.flush()
        raise
    with anyio.CancelScope(shield=True):
        await allowance.flush()


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
    ``TypeError`` naming the method) before anything is opened. A retriever you pass stays
    yours: the hooks never close it, so one :class:`~plugin.ProcessRetriever` can serve
    several ``open_hooks`` blocks, and you close it (``async with`` or ``aclose()``).
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
            await _warn_about_vectors(store)
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
        await stack.enter_async_context(_owed_written(allowance))
        yield RecallHooks(
            allowance=allowance,
            preparer=QueryPreparation(planner, embedding),
            retriever=retriever,
            caps=config.caps,
            preparation_budget_s=config.preparation_budget_s,
        )
