"""Evidence from a real backend: numpy scores and strings, a list of cites, a str enum tenant.

What a vector database or a data frame hands a retriever is rarely an exact ``float`` or
``str``. ``Evidence`` takes any real number and any string, and keeps exact types (so what
the hooks compare and render is a plain ``str``, and a search in process gives what it gives
through a worker); a value of a wrong type is a ``TypeError`` naming the field when it is
built, never a search that fails later.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugin import Evidence, ManualClock, SearchRequest, SimpleRetriever, WorkingState
from runtime_hooks import ToolCall
from runtime_hooks.bootstrap import RecallConfig, open_hooks

pytestmark = pytest.mark.anyio

P, S = "mara", "notes"


class Tenant(str, enum.Enum):
    MARA = "mara"


class Marked(str):
    """A str subclass that claims to equal anything (a Markup-like wrapper gone wrong)."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


def _backend_item() -> Evidence:
    ids, texts = np.array(["m1"]), np.array(["the cutover is on friday"])
    return Evidence(id=ids[0], text=texts[0], score=np.float32(0.875),
                    created_at=np.float64(1_700_000_000.5), cites=["s1", np.str_("s2")],
                    principal=Tenant.MARA, scope=np.str_(S), arm=np.str_("pgvector"))


def test_evidence_keeps_exact_types_from_numpy_and_str_subclasses() -> None:
    item = _backend_item()
    assert [type(v) for v in (item.id, item.text, item.arm, item.principal, item.scope)] == \
        [str] * 5
    assert (type(item.score), type(item.created_at)) == (float, float)
    assert (item.score, item.created_at, item.cites) == (0.875, 1_700_000_000.5, ("s1", "s2"))
    assert type(item.cites) is tuple and all(type(c) is str for c in item.cites)
    assert item.principal == P and item.scope == S


def test_a_str_subclass_is_compared_by_its_characters() -> None:
    item = Evidence(id="m1", text="x", principal=Marked("someone-else"))
    assert type(item.principal) is str and item.principal != P


@pytest.mark.parametrize(("fields", "named"), [
    ({"score": "high"}, "Evidence.score"),
    ({"score": True}, "Evidence.score"),
    ({"score": None}, "Evidence.score"),
    ({"created_at": "2024-01-01"}, "Evidence.created_at"),
    ({"cites": "s1"}, "Evidence.cites"),
    ({"cites": [1]}, "Evidence.cites"),
    ({"cites": 3}, "Evidence.cites"),
])
def test_a_wrong_type_is_a_type_error_naming_the_field(fields: dict[str, Any],
                                                       named: str) -> None:
    with pytest.raises(TypeError, match=named):
        Evidence(id="m1", text="x", **fields)


@pytest.mark.parametrize("field", ["score", "created_at"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), np.float32("nan"),
                                   np.float64("-inf")])
def test_a_number_that_is_not_finite_is_a_value_error_naming_the_field(
    field: str, value: Any
) -> None:
    # A cosine against a zero vector is NaN: refused where the backend builds the item (as a
    # number no float holds is), never a search whose good items are all lost later.
    with pytest.raises(ValueError, match=f"Evidence.{field} must be finite"):
        Evidence(id="m1", text="x", **{field: value})


async def test_a_search_returning_backend_values_is_evidence(
    tmp_path: Path, clock: ManualClock
) -> None:
    async def search(request: SearchRequest) -> list[Evidence]:
        return [_backend_item()]

    config = RecallConfig(ledger_path=tmp_path / "ledger.db")
    async with open_hooks(config, clock=clock, retriever=SimpleRetriever(search)) as hooks:
        context = await hooks.prepare(WorkingState("when is the cutover"), run_id="r",
                                      scope=S, principal=P)
        (result,) = await hooks.dispatch(
            [ToolCall(call_id="c1", arguments={"query": "cutover date"})],
            run_id="r", scope=S, principal=P)
    assert context.failure is None
    assert [(i.id, i.principal, i.score) for i in context.evidence] == [("m1", P, 0.875)]
    assert result.status == "ok", result.as_dict()
    assert "[memory m1] the cutover is on friday" in result.content
