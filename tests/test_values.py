"""Policies, clocks, refusals and run ids: validation and meaning."""

from __future__ import annotations

import math
import pickle

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugin import (
    AllowancePolicy,
    BoundedRecallNotice,
    BudgetRefusal,
    ManualClock,
    RecallBudgetExceeded,
    RefusalReason,
    SystemClock,
)
from plugin.control import Clock, validate_run_id
from plugin.errors import InvalidArgumentError, RecallboundError


def test_policy_defaults_are_the_adr_values() -> None:
    policy = AllowancePolicy()
    assert (policy.max_searches, policy.max_rounds, policy.deadline_s) == (4, 2, 10.0)
    assert (policy.automatic_slots, policy.source_read_fallbacks) == (2, 2)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_searches", 0), ("max_searches", -1), ("max_rounds", 0), ("max_rounds", -3),
        ("automatic_slots", 0), ("source_read_fallbacks", 0), ("source_read_fallbacks", -1),
        ("deadline_s", 0.0),
        ("deadline_s", -1.0), ("deadline_s", math.nan), ("deadline_s", math.inf),
        ("max_searches", True), ("max_searches", 2.5), ("deadline_s", "10"),
        ("max_rounds", None),
    ],
)
def test_invalid_policy_values_are_rejected_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field) as info:
        AllowancePolicy(**{field: value})  # type: ignore[arg-type]
    assert isinstance(info.value, InvalidArgumentError)
    assert isinstance(info.value, RecallboundError)


def test_more_automatic_slots_than_searches_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="automatic_slots"):
        AllowancePolicy(max_searches=1, automatic_slots=2)


def test_policy_is_frozen() -> None:
    policy = AllowancePolicy()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        policy.max_searches = 100  # type: ignore[misc]
    with pytest.raises(InvalidArgumentError):
        attrs.evolve(policy, max_searches=0)


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(wall=100.0, monotonic=5.0)
    assert isinstance(clock, Clock)
    assert (clock.wall(), clock.monotonic()) == (100.0, 5.0)
    clock.advance(2.5)
    assert (clock.wall(), clock.monotonic()) == (102.5, 7.5)
    clock.step_wall(-50.0)
    assert (clock.wall(), clock.monotonic()) == (52.5, 7.5)
    clock.step_wall(10.0)
    assert clock.wall() == 62.5
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1.0)
    with pytest.raises(ValueError, match="finite"):
        clock.step_wall(math.nan)
    with pytest.raises(TypeError):
        ManualClock(wall="now")  # type: ignore[arg-type]


def test_system_clock_reads_real_time() -> None:
    clock = SystemClock()
    assert isinstance(clock, Clock)
    first = clock.monotonic()
    assert clock.monotonic() >= first
    assert clock.wall() > 1_600_000_000


@pytest.mark.parametrize("reason", list(RefusalReason))
def test_refusal_message_says_bounded_and_not_evidence(reason: RefusalReason) -> None:
    refusal = BudgetRefusal(reason=reason, run_id="r", reserved=4, executed=3)
    assert "bounded" in refusal.message
    assert "not evidence" in refusal.message
    assert "4 searches reserved, 3 executed" in refusal.message
    notice = BoundedRecallNotice.from_refusal(refusal)
    assert (notice.reason, notice.message) == (reason, refusal.message)
    result = refusal.as_tool_result()
    assert result["reason"] == reason.value and result["status"] == "recall_bounded"


def test_each_reason_is_said_in_plain_words() -> None:
    messages = {
        BudgetRefusal(reason=r, run_id="r", reserved=0, executed=0).message for r in RefusalReason
    }
    assert len(messages) == len(RefusalReason)


def test_recall_budget_exceeded_carries_its_refusal_and_pickles() -> None:
    refusal = BudgetRefusal(reason=RefusalReason.SLOTS, run_id="r", reserved=4, executed=4)
    exc = RecallBudgetExceeded(refusal)
    assert exc.refusal is refusal and exc.reason is RefusalReason.SLOTS
    assert str(exc) == refusal.message
    again = pickle.loads(pickle.dumps(exc))
    assert again.refusal == refusal


@pytest.mark.parametrize(
    "run_id", ["", "   ", 123, None, b"run", "a" * 513, "bad\x00id", "\ud800lonely"]
)
def test_invalid_run_ids_are_rejected(run_id: object) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_run_id(run_id)


@given(st.text(min_size=1, max_size=100).filter(lambda s: s.strip() and "\x00" not in s))
def test_any_printable_run_id_is_accepted(run_id: str) -> None:
    try:
        run_id.encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(InvalidArgumentError):
            validate_run_id(run_id)
    else:
        assert validate_run_id(run_id) == run_id
