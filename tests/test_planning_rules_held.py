"""Rules of query planning and its working state that no other test held on its own."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from plugin.errors import InvalidArgumentTypeError
from plugin.memory.planning import QueryPlanner
from plugin.memory.preparation import QueryPreparation, WithheldReason
from plugin.memory.state import WorkingState

from ._loops import VIRTUAL_TIME_LOOPS


@pytest.fixture(params=VIRTUAL_TIME_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


class WordAdapter:
    """One token per whitespace-separated word; 8 hashed dimensions."""

    name = "words-8"
    dimensions = 8

    def __init__(self, token_limit: int) -> None:
        self.token_limit = token_limit
        self.embedded: list[str] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.embedded.extend(texts)
        out = np.zeros((len(texts), 8), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.split():
                out[row, hashlib.sha256(word.encode()).digest()[0] % 8] += 1.0
            out[row] /= max(float(np.linalg.norm(out[row])), 1.0)
        return out


@pytest.mark.anyio
async def test_one_token_over_the_limit_is_withheld_not_embedded() -> None:
    adapter = WordAdapter(token_limit=3)
    prepared = await QueryPreparation(QueryPlanner(), adapter).prepare(
        WorkingState("one two three four"), scope="s", principal="p"
    )
    assert prepared.semantic.tokens == 4
    assert prepared.semantic.vector is None
    assert prepared.semantic.withheld_reason is WithheldReason.TOKEN_LIMIT
    assert adapter.embedded == []


@pytest.mark.parametrize(
    "field", ["open_questions", "constraints", "tasks", "facts"]
)
def test_from_dict_null_list_is_a_type_error_not_empty(field: str) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=rf"^WorkingState\.{field} must be a list"):
        WorkingState.from_dict({"current_request": "r", field: None})


def test_from_dict_null_entities_is_a_type_error_not_empty() -> None:
    with pytest.raises(InvalidArgumentTypeError,
                       match=r"^WorkingState\.facts\[0\]\.entities must be a list"):
        WorkingState.from_dict({"current_request": "r",
                                "facts": [{"text": "t", "entities": None}]})
