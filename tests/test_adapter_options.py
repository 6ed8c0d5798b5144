"""Adapter options: one name per concept, the old names as deprecated aliases; a missing extra
is named; ``store_path`` is optional beside your own retriever."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from plugin import Evidence, SimpleRetriever, WorkingState
from plugin.errors import ConfigError, InvalidArgumentError
from runtime_hooks import RecallHooks
from runtime_hooks.bootstrap import RecallConfig, open_hooks

pytestmark = [pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the adapters are asyncio-only


@pytest.fixture
async def hooks(tmp_path: Path) -> AsyncIterator[RecallHooks]:
    config = RecallConfig(ledger_path=tmp_path / "ledger.db", store_path=tmp_path / "memory.db")
    async with open_hooks(config) as hooks:
        yield hooks


def _identity(context: object) -> Any:
    from runtime_hooks.adapters.langchain import RecallContext

    return RecallContext(run_id="r", scope="s", principal="p")


async def test_langchain_identify_is_a_deprecated_alias_of_identity(hooks: RecallHooks) -> None:
    from runtime_hooks.adapters.langchain import LangChainRecall, RecallMiddleware

    with pytest.warns(DeprecationWarning, match=r"identify= is deprecated: use identity="):
        middleware = RecallMiddleware(hooks, identify=_identity)
    assert middleware.recall.identity is _identity
    with pytest.warns(DeprecationWarning, match=r"identify="):
        recall = LangChainRecall(hooks, identify=_identity)
    assert recall.identity is _identity
    assert RecallMiddleware(hooks, identity=_identity).recall.identity is _identity


async def test_langchain_both_names_at_once_is_an_error(hooks: RecallHooks) -> None:
    from runtime_hooks.adapters.langchain import LangChainRecall, RecallMiddleware

    with pytest.raises(InvalidArgumentError, match="identity="):
        RecallMiddleware(hooks, identity=_identity, identify=_identity)
    with pytest.raises(InvalidArgumentError, match="identity="):
        LangChainRecall(hooks, identity=_identity, identify=_identity)


async def test_agents_state_is_a_deprecated_alias_of_working_state(hooks: RecallHooks) -> None:
    from runtime_hooks.adapters.openai_agents import agents_recall

    def mine(data: Any) -> WorkingState:
        return WorkingState("Continue")

    with pytest.warns(DeprecationWarning, match=r"state= is deprecated: use working_state="):
        recall = agents_recall(hooks, state=mine)
    assert recall.input_filter is not None and recall.input_filter.state is mine
    assert agents_recall(hooks, working_state=mine).input_filter.state is mine  # type: ignore[union-attr]
    with pytest.raises(InvalidArgumentError, match="working_state="):
        agents_recall(hooks, state=mine, working_state=mine)


def test_every_adapter_takes_identity_and_working_state_by_these_names() -> None:
    import inspect

    from runtime_hooks.adapters.langchain import RecallMiddleware
    from runtime_hooks.adapters.openai_agents import agents_recall
    from runtime_hooks.adapters.pydantic_ai import RecallCapability

    for options in (inspect.signature(RecallCapability).parameters,
                    inspect.signature(RecallMiddleware).parameters):
        assert {"identity", "working_state", "automatic"} <= set(options)
    # The Agents SDK adapter takes the identity per run: run(..., run_id=, scope=, principal=).
    assert {"working_state", "automatic"} <= set(inspect.signature(agents_recall).parameters)


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("runtime_hooks.adapters.openai_agents", "agents", "openai-agents"),
    ("runtime_hooks.adapters.pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ("runtime_hooks.adapters.langchain", "langchain", "langchain"),
    ("runtime_hooks.testing.openai_agents", "agents", "openai-agents"),
    ("runtime_hooks.testing.pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ("runtime_hooks.testing.langchain", "langchain_core", "langchain"),
])
def test_a_missing_extra_names_the_extra_to_install(module: str, blocked: str, extra: str) -> None:
    code = (
        "import sys\n"
        f"sys.modules[{blocked!r}] = None  # as if the extra were not installed\n"
        "from plugin.errors import RecallboundError\n"
        "try:\n"
        f"    __import__({module!r})\n"
        "except ModuleNotFoundError as exc:\n"
        "    assert isinstance(exc, RecallboundError)\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('imported')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert f"pip install 'recallbound[{extra}]'" in done.stdout
    assert f"missing module '{blocked}" in done.stdout


async def _nothing(request: Any) -> list[Evidence]:
    return []


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_store_path_is_optional_beside_a_retriever(tmp_path: Path) -> None:
    config = RecallConfig(ledger_path=tmp_path / "ledger.db")
    assert config.store_path is None
    async with open_hooks(config, retriever=SimpleRetriever(_nothing)) as hooks:
        context = await hooks.prepare(WorkingState("Continue"), run_id="r1", scope="s",
                                      principal="p")
        assert "bounded" not in context.render()
    assert [path.name for path in tmp_path.iterdir()] == ["ledger.db"]  # no store file


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_without_store_path_or_retriever_nothing_opens(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="store_path"):
        async with open_hooks(RecallConfig(ledger_path=tmp_path / "ledger.db")):
            pass
    assert list(tmp_path.iterdir()) == []  # refused before the ledger was opened
