"""Evidence's kind from a backend, and numbers a float cannot hold or that are not floats.

A str enum or a ``numpy.str_`` kind is a kind like any other string: a search in process keeps
it (as a worker would, whose evidence crosses as JSON). A score too large for a float is a
``ValueError`` naming the field, a ``Decimal`` score (a SQL ``numeric``) a float.
"""

from __future__ import annotations

import enum
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from plugin import Evidence, ManualClock, SearchRequest, SimpleRetriever
from runtime_hooks import ToolCall
from runtime_hooks.bootstrap import RecallConfig, open_hooks

pytestmark = pytest.mark.anyio

P, S = "mara", "notes"


class Kind(str, enum.Enum):
    MEMORY = "memory"


@pytest.mark.parametrize("kind", [Kind.MEMORY, np.str_("memory")])
def test_a_str_subclass_kind_is_kept_as_str(kind: str) -> None:
    item = Evidence(id="m1", text="x", kind=kind)
    assert (type(item.kind), item.kind) == (str, "memory")


def test_a_kind_of_another_type_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"Evidence\.kind"):
        Evidence(id="m1", text="x", kind=1)


@pytest.mark.parametrize("field", ["score", "created_at"])
@pytest.mark.parametrize(
    "value",
    [10**400, -(10**400), Fraction(10**400, 3), Decimal("sNaN")],
    ids=["huge", "-huge", "fraction", "snan"],
)
def test_a_number_too_large_for_a_float_is_a_value_error_naming_the_field(
    field: str, value: object
) -> None:
    with pytest.raises(ValueError, match=rf"Evidence\.{field}"):
        Evidence(id="m1", text="x", **{field: value})


def test_a_decimal_score_is_a_float() -> None:
    item = Evidence(id="m1", text="x", score=Decimal("0.5"), created_at=Decimal(1_700_000_000))
    assert (type(item.score), item.score) == (float, 0.5)
    assert (type(item.created_at), item.created_at) == (float, 1_700_000_000.0)


async def test_a_search_returning_an_enum_kind_is_evidence(
    tmp_path: Path, clock: ManualClock
) -> None:
    async def search(request: SearchRequest) -> list[Evidence]:
        return [Evidence(id="m1", text="the cutover is on friday", kind=Kind.MEMORY)]

    config = RecallConfig(ledger_path=tmp_path / "ledger.db")
    async with open_hooks(config, clock=clock, retriever=SimpleRetriever(search)) as hooks:
        (result,) = await hooks.dispatch(
            [ToolCall(call_id="c1", arguments={"query": "cutover date"})],
            run_id="r",
            scope=S,
            principal=P,
        )
    assert result.status == "ok", result.as_dict()
    assert "[memory m1] the cutover is on friday" in result.content
