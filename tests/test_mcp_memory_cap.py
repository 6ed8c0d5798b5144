"""``[mcp] max_memory_bytes`` is a cap the server keeps: a value larger than the reference
store holds (:data:`~plugin.memory.store.values.MAX_MEMORY_TEXT_BYTES`) would make ``remember``
advertise texts it then refuses, so the configuration refuses it and so does the server, while
the store's own cap itself is accepted, exactly."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from mcp import Client

from plugin.errors import ConfigError
from plugin.memory.store.values import MAX_MEMORY_TEXT_BYTES
from runtime_hooks.mcp import RecallServer, cli

from ._mcp_env import ANA, recall_server, structured

pytestmark = pytest.mark.anyio


def _parser() -> argparse.ArgumentParser:
    from runtime_hooks.__main__ import _parser

    return _parser()


def _settings(env: dict[str, str]) -> cli.McpSettings:
    return cli.settings(_parser().parse_args(["mcp"]), env)


def test_a_cap_past_what_the_store_holds_is_a_configuration_error(tmp_path: Path) -> None:
    config = tmp_path / "recallbound.toml"
    config.write_text(f"[mcp]\nmax_memory_bytes = {MAX_MEMORY_TEXT_BYTES + 1}\n")
    with pytest.raises(ConfigError, match=rf"mcp\.max_memory_bytes.*{MAX_MEMORY_TEXT_BYTES}"):
        _settings({"RECALLBOUND_CONFIG": str(config)})
    with pytest.raises(ConfigError, match=rf"MAX_MEMORY_BYTES.*{MAX_MEMORY_TEXT_BYTES}"):
        _settings({"RECALLBOUND_MCP_MAX_MEMORY_BYTES": str(MAX_MEMORY_TEXT_BYTES + 1)})
    config.write_text(f"[mcp]\nmax_memory_bytes = {MAX_MEMORY_TEXT_BYTES}\n")
    assert _settings({"RECALLBOUND_CONFIG": str(config)}).max_memory_bytes == \
        MAX_MEMORY_TEXT_BYTES


async def test_the_server_refuses_a_cap_its_store_cannot_keep(tmp_path: Path) -> None:
    async with recall_server(tmp_path) as plain:
        with pytest.raises(ValueError, match="max_memory_bytes"):
            RecallServer(plain.hooks, caller=ANA, max_memory_bytes=MAX_MEMORY_TEXT_BYTES + 1)
        server = RecallServer(plain.hooks, caller=ANA, max_memory_bytes=MAX_MEMORY_TEXT_BYTES)
        async with Client(server.server) as client:
            at_cap = "é" * (MAX_MEMORY_TEXT_BYTES // 2)  # two bytes each: exactly the cap
            stored = structured(await client.call_tool("remember", {"text": at_cap}))
            assert stored["status"] == "ok", stored
            over = structured(await client.call_tool("remember", {"text": at_cap + "a"}))
            assert over["status"] == "invalid"
            assert f"at most {MAX_MEMORY_TEXT_BYTES}" in over["content"]
