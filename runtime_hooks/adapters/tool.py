"""The memory-search tool, defined once and rendered by each framework adapter.

The schema matches what :meth:`RecallHooks.dispatch <runtime_hooks.hooks.RecallHooks.dispatch>`
validates: a ``query`` string (at most :data:`~runtime_hooks.hooks.MAX_QUERY_BYTES` UTF-8
bytes, with searchable words) and an optional ``scope`` that must equal the run's own; nothing
else. The scope and the principal always come from the host, never from the model.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import attrs

from runtime_hooks.hooks import MAX_QUERY_BYTES


@attrs.frozen(kw_only=True)
class SearchTool:
    """A tool's name, description and JSON schema (framework-neutral)."""

    name: str
    description: str
    parameters: Mapping[str, Any]

    def json_schema(self) -> dict[str, Any]:
        """A fresh, mutable copy of the parameters' JSON schema."""
        return copy.deepcopy(dict(self.parameters))

    def openai_function(self) -> dict[str, Any]:
        """The tool in the OpenAI function-calling shape (``{"type": "function", ...}``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.json_schema(),
            },
        }


SEARCH_TOOL = SearchTool(
    name="search_memory",
    description=(
        "Search the user's long-term memory for facts, decisions and work in progress. "
        "Give one focused query per call; several calls in one response run in parallel. "
        "Recall is bounded: when the allowance for this run is spent, the tool answers with a "
        "refusal that says recall was bounded. Such a refusal is not evidence that no memory "
        "exists."
    ),
    parameters={
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": f"What to look for, in plain words (at most {MAX_QUERY_BYTES} "
                               "UTF-8 bytes).",
                "minLength": 1,
                # JSON Schema counts characters: a necessary bound; the bytes are checked too.
                "maxLength": MAX_QUERY_BYTES,
            },
            "scope": {
                "type": "string",
                "description": "Optional; must be the current project's scope if given.",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    },
)
