"""WorkingState, Task and Fact: frozen values that reject malformed input, naming the field."""

from __future__ import annotations

import attrs
import pytest

from plugin.errors import InvalidArgumentError, InvalidArgumentTypeError
from plugin.memory.state import Fact, Task, WorkingState


def test_defaults_and_positional_signatures() -> None:
    state = WorkingState("Continue")
    assert state.current_request == "Continue"
    assert state.objective == ""
    assert state.next_action == ""
    assert state.tasks == ()
    assert state.open_questions == ()
    assert state.constraints == ()
    assert state.facts == ()
    assert Task("x") == Task(text="x", done=False)
    assert Task("x", True).done is True
    assert Fact("x") == Fact(text="x", entities=())
    assert Fact("x", ["A"]).entities == ("A",)


def test_sequences_become_tuples() -> None:
    state = WorkingState(
        "r",
        tasks=[Task("a")],
        open_questions=["q"],
        constraints=["c"],
        facts=[Fact("f", ["E"])],
    )
    assert state.tasks == (Task("a"),)
    assert state.open_questions == ("q",)
    assert state.constraints == ("c",)
    assert state.facts == (Fact("f", ("E",)),)
    assert all(
        type(v) is tuple
        for v in (state.tasks, state.open_questions, state.constraints, state.facts)
    )


def test_frozen_and_evolve() -> None:
    state = WorkingState("r", objective="o")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        state.objective = "x"  # type: ignore[misc]
    changed = attrs.evolve(state, objective="p")
    assert changed.objective == "p"
    assert state.objective == "o"
    assert hash(state) == hash(WorkingState("r", objective="o"))


def test_nul_and_large_text_are_allowed() -> None:
    big = "x" * 1_000_000
    state = WorkingState("a\x00b", objective=big, open_questions=["\x00"])
    assert state.current_request == "a\x00b"
    assert len(state.objective) == 1_000_000


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"current_request": None}, "WorkingState.current_request must be str, got NoneType"),
        ({"objective": None}, "WorkingState.objective must be str, got NoneType"),
        ({"next_action": 3}, "WorkingState.next_action must be str, got int"),
        ({"tasks": [Task("a"), "b"]}, "WorkingState.tasks[1] must be Task, got str"),
        ({"tasks": [{"text": "a"}]}, "WorkingState.tasks[0] must be Task, got dict"),
        ({"tasks": "abc"}, "WorkingState.tasks must be a sequence of Task, got str"),
        ({"tasks": None}, "WorkingState.tasks must be a sequence of Task, got NoneType"),
        ({"facts": [Fact("a"), 3]}, "WorkingState.facts[1] must be Fact, got int"),
        ({"facts": [{"text": "a"}]}, "WorkingState.facts[0] must be Fact, got dict"),
        (
            {"open_questions": "abc"},
            "WorkingState.open_questions must be a sequence of str, got str",
        ),
        ({"open_questions": ["a", b"b"]}, "WorkingState.open_questions[1] must be str, got bytes"),
        ({"constraints": {"a"}}, "WorkingState.constraints must be a sequence of str, got set"),
        ({"constraints": b"ab"}, "WorkingState.constraints must be a sequence of str, got bytes"),
        (
            {"constraints": (c for c in "ab")},
            "WorkingState.constraints must be a sequence of str, got generator",
        ),
    ],
)
def test_type_errors_name_the_field(kwargs: dict[str, object], message: str) -> None:
    args = {"current_request": "r", **kwargs}
    with pytest.raises(InvalidArgumentTypeError) as info:
        WorkingState(**args)  # type: ignore[arg-type]
    assert str(info.value) == message
    assert isinstance(info.value, TypeError)


def test_task_and_fact_type_errors() -> None:
    with pytest.raises(InvalidArgumentTypeError, match=r"^Task\.text must be str, got int$"):
        Task(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match=r"^Task\.done must be bool, got int$"):
        Task("a", 1)  # type: ignore[arg-type]
    with pytest.raises(
        InvalidArgumentTypeError, match=r"^Fact\.entities must be a sequence of str, got str$"
    ):
        Fact("a", "Alice")
    with pytest.raises(
        InvalidArgumentTypeError, match=r"^Fact\.entities\[1\] must be str, got NoneType$"
    ):
        Fact("a", ["Alice", None])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentTypeError, match=r"^Fact\.text must be str"):
        Fact(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: WorkingState("a\ud800b"), "WorkingState.current_request"),
        (lambda: WorkingState("r", objective="\udfff"), "WorkingState.objective"),
        (
            lambda: WorkingState("r", open_questions=["ok", "x\ud83d"]),
            "WorkingState.open_questions[1]",
        ),
        (lambda: Task("\ud800"), "Task.text"),
        (lambda: Fact("ok", ["\udc80"]), "Fact.entities[0]"),
    ],
)
def test_lone_surrogates_are_rejected(build: object, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        build()  # type: ignore[operator]
    assert str(info.value).startswith(f"{field} is not valid Unicode text: lone surrogate")
    assert isinstance(info.value, ValueError)


def test_paired_surrogate_free_astral_text_is_fine() -> None:
    assert WorkingState("🦀 e\u0301 漢字").current_request == "🦀 e\u0301 漢字"


def test_from_dict_full() -> None:
    state = WorkingState.from_dict(
        {
            "current_request": "Continue",
            "objective": "o",
            "next_action": "n",
            "tasks": [{"text": "t1", "done": True}, {"text": "t2"}],
            "open_questions": ["q"],
            "constraints": ["c"],
            "facts": [{"text": "f", "entities": ["Alice"]}, {"text": "g"}],
        }
    )
    assert state == WorkingState(
        "Continue",
        objective="o",
        next_action="n",
        tasks=(Task("t1", True), Task("t2")),
        open_questions=("q",),
        constraints=("c",),
        facts=(Fact("f", ("Alice",)), Fact("g")),
    )
    assert WorkingState.from_dict({"current_request": "r"}) == WorkingState("r")


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        ([], InvalidArgumentTypeError, "WorkingState must be a mapping"),
        ({}, InvalidArgumentError, "missing required key(s) current_request"),
        ({"current_request": "r", "goal": "x"}, InvalidArgumentError, "unknown key(s) 'goal'"),
        ({"current_request": None}, InvalidArgumentTypeError, "current_request must be str"),
        ({"current_request": "r", "objective": None}, InvalidArgumentTypeError, "objective"),
        (
            {"current_request": "r", "tasks": "x"},
            InvalidArgumentTypeError,
            "tasks must be a list",
        ),
        (
            {"current_request": "r", "tasks": ["t"]},
            InvalidArgumentTypeError,
            "WorkingState.tasks[0] must be a mapping",
        ),
        (
            {"current_request": "r", "tasks": [{"text": "a"}, {"txt": "b"}]},
            InvalidArgumentError,
            "WorkingState.tasks[1] has unknown key(s) 'txt'",
        ),
        (
            {"current_request": "r", "tasks": [{"done": True}]},
            InvalidArgumentError,
            "WorkingState.tasks[0] is missing required key(s) text",
        ),
        (
            {"current_request": "r", "tasks": [{"text": "a", "done": "no"}]},
            InvalidArgumentTypeError,
            "WorkingState.tasks[0].done must be bool, got str",
        ),
        (
            {"current_request": "r", "facts": [{"text": "a", "entities": "Alice"}]},
            InvalidArgumentTypeError,
            "WorkingState.facts[0].entities must be a list of str, got str",
        ),
        (
            {"current_request": "r", "facts": [{"text": "a", "entities": ["A", 1]}]},
            InvalidArgumentTypeError,
            "WorkingState.facts[0].entities[1] must be str, got int",
        ),
        (
            {"current_request": "r", "facts": [{"text": 1}]},
            InvalidArgumentTypeError,
            "WorkingState.facts[0].text must be str, got int",
        ),
        (
            {"current_request": "r", "open_questions": ["a", 2]},
            InvalidArgumentTypeError,
            "WorkingState.open_questions[1] must be str, got int",
        ),
        (
            {"current_request": "r", "constraints": ["\ud800"]},
            InvalidArgumentError,
            "WorkingState.constraints[0] is not valid Unicode text",
        ),
    ],
)
def test_from_dict_errors(data: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        WorkingState.from_dict(data)  # type: ignore[arg-type]
    assert message in str(info.value)
