"""Properties of the composers over arbitrary Unicode working state (hypothesis).

Surrogate code points are excluded from the text strategies: WorkingState rejects them at
construction (see ``test_state.py``), so they can never reach a composer.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from itertools import islice
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.memory.planning import (
    BaselineReason,
    QueryStrategy,
    RecallQuery,
    compose_baseline,
    compose_task_context,
)
from plugin.memory.state import Fact, Task, WorkingState

ROOT = Path(__file__).resolve().parent.parent

_SPECIAL = list(
    "aZ \t\n\u00a0\u3000\u2028\x00"  # ASCII, assorted whitespace, NUL
    "e\u0301\u0308\u20dd"  # combining marks
    "漢字かなカナ한국어"  # CJK
    "ßſİıΣσς"  # tricky case folding
)
_SPECIAL += ["🦀", "👩\u200d👩\u200d👧", "🇫🇷", "👍🏽"]  # emoji, ZWJ sequences, flags, modifiers

texts = st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(_SPECIAL), max_size=60).map("".join),
    st.builds(
        lambda unit, n: unit * n,
        st.sampled_from(["a", "é", "漢", "🦀", " ", "A b "]),
        st.integers(0, 700),
    ),
    st.sampled_from(["Continue", "continue", "  CONTINUE ", "Ship it", "ship  IT"]),
)
small = st.lists(texts, max_size=12)
states = st.builds(
    WorkingState,
    current_request=texts,
    objective=texts,
    next_action=texts,
    tasks=st.lists(st.builds(Task, texts, st.booleans()), max_size=12),
    open_questions=small,
    constraints=small,
    facts=st.lists(st.builds(Fact, texts, small), max_size=12),
)
max_bytes = st.one_of(st.just(512), st.integers(1, 1200))


def _key(fragment: str) -> str:
    return " ".join(fragment.casefold().split())


def _task_context_candidates(state: WorkingState) -> list[str]:
    """The documented candidates, in order, before stripping and filtering."""
    unfinished = [t.text for t in state.tasks[:8] if not t.done]
    entities: dict[str, str] = {}  # the first of each distinct, non-blank name
    names = [name for fact in state.facts[:8] for name in fact.entities][:64]
    for name in names:
        if _key(name):
            entities.setdefault(_key(name), name)
    return [
        state.current_request,
        state.next_action,
        *unfinished[:2],
        *state.open_questions[:2],
        state.objective,
        *state.constraints[:2],
        *list(entities.values())[:8],
    ]


def _check_selection(fragments: tuple[str, ...], candidates: list[str], bound: int | None) -> None:
    """Fragments are exactly the greedy, whole, in-order pick the documentation describes."""
    kept: list[str] = []
    used = 0
    position = 0
    for raw in candidates:
        fragment = raw.strip()
        is_kept = position < len(fragments) and fragments[position] == fragment and bool(fragment)
        if is_kept:
            kept.append(fragment)
            used += len(fragment.encode()) + (1 if len(kept) > 1 else 0)
            position += 1
            continue
        # Left out: blank, a duplicate of a kept fragment, or too large for what is left.
        size = len(fragment.encode()) + (1 if kept else 0)
        assert (
            not fragment
            or _key(fragment) in {_key(k) for k in kept}
            or (bound is not None and used + size > bound)
        ), f"{fragment!r} was left out without reason"
    assert position == len(fragments), "a fragment is not a whole, in-order candidate"
    assert len({_key(f) for f in fragments}) == len(fragments)
    if bound is not None:
        assert used <= bound


@settings(max_examples=300)
@given(state=states, bound=max_bytes)
def test_task_context_properties(state: WorkingState, bound: int) -> None:
    snapshot = copy.deepcopy(state)
    tuples = (state.tasks, state.open_questions, state.constraints, state.facts)

    query = compose_task_context(state, max_bytes=bound, scope="s", principal="p")

    assert query.text == "\n".join(query.fragments)
    request = state.current_request.strip()
    if len(request.encode()) > bound:
        assert query.strategy is QueryStrategy.BASELINE
        assert query.baseline_reason is BaselineReason.REQUEST_TOO_LARGE
        assert query.fragments == compose_baseline(state, scope="s", principal="p").fragments
    else:
        assert query.strategy is QueryStrategy.TASK_CONTEXT
        assert len(query.text.encode("utf-8")) <= bound
        if request:
            assert query.fragments[0] == request
        _check_selection(query.fragments, _task_context_candidates(state), bound)

    again = compose_task_context(state, max_bytes=bound, scope="s", principal="p")
    assert again == query
    assert again.fingerprint == query.fingerprint
    assert state == snapshot
    assert (state.tasks, state.open_questions, state.constraints, state.facts) == tuples
    assert all(
        a is b
        for a, b in zip(
            (state.tasks, state.open_questions, state.constraints, state.facts), tuples, strict=True
        )
    )
    assert (query.scope, query.principal) == ("s", "p")


@given(state=states)
def test_baseline_properties(state: WorkingState) -> None:
    snapshot = copy.deepcopy(state)
    query = compose_baseline(state)
    assert query.strategy is QueryStrategy.BASELINE
    assert query.baseline_reason is BaselineReason.DEFAULT
    candidates = [state.objective, *state.open_questions, state.current_request]
    _check_selection(query.fragments, candidates, None)
    assert compose_baseline(state) == query
    assert state == snapshot


@given(state=states)
def test_default_bound_is_512_bytes(state: WorkingState) -> None:
    query = compose_task_context(state)
    if query.strategy is QueryStrategy.TASK_CONTEXT:
        assert len(query.text.encode()) <= 512
    assert query == compose_task_context(state, max_bytes=512)


@given(state=states)
def test_only_the_first_eight_tasks_and_facts_matter(state: WorkingState) -> None:
    truncated = WorkingState(
        state.current_request,
        objective=state.objective,
        next_action=state.next_action,
        tasks=tuple(islice(state.tasks, 8)),
        open_questions=state.open_questions,
        constraints=state.constraints,
        facts=tuple(islice(state.facts, 8)),
    )
    assert compose_task_context(truncated) == compose_task_context(state)


def _canonical_fingerprint(query: RecallQuery) -> str:
    """The documented encoding, written out independently of the implementation."""
    payload = {
        "strategy": query.strategy.value,
        "fragments": list(query.fragments),
        "scope": query.scope,
        "principal": query.principal,
    }
    text = json.dumps(payload, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


@given(state=states, scope=st.none() | texts, principal=st.none() | texts)
def test_fingerprint_is_the_documented_encoding(
    state: WorkingState, scope: str | None, principal: str | None
) -> None:
    for query in (
        compose_baseline(state, scope=scope, principal=principal),
        compose_task_context(state, scope=scope, principal=principal),
    ):
        assert query.fingerprint == _canonical_fingerprint(query)


_FIXED_STATES: list[dict[str, Any]] = [
    {"current_request": "Continue"},
    {
        "current_request": "  Weiter mit 🦀 und e\u0301  ",
        "objective": "漢字のテスト",
        "next_action": "NUL\x00inside",
        "tasks": [{"text": "Straße", "done": False}, {"text": "done", "done": True}],
        "open_questions": ["👩\u200d👩\u200d👧?", "\u3000"],
        "constraints": ["İstanbul"],
        "facts": [{"text": "f", "entities": ["Ωmega", "ß"]}],
    },
    {"current_request": "x" * 600, "objective": "o"},
]

_CHILD = """
import json, sys
from plugin.memory.planning import compose_baseline, compose_task_context
from plugin.memory.state import WorkingState
out = []
for data in json.load(sys.stdin):
    state = WorkingState.from_dict(data)
    for compose in (compose_baseline, compose_task_context):
        out.append(compose(state, scope="proj", principal="u1").fingerprint)
        out.append(compose(state).fingerprint)
print(json.dumps(out))
"""


def test_fingerprint_is_stable_across_processes() -> None:
    expected = []
    for data in _FIXED_STATES:
        state = WorkingState.from_dict(data)
        for compose in (compose_baseline, compose_task_context):
            expected.append(compose(state, scope="proj", principal="u1").fingerprint)
            expected.append(compose(state).fingerprint)
    env = {**os.environ, "PYTHONHASHSEED": "4242", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=json.dumps(_FIXED_STATES),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert json.loads(result.stdout) == expected
    assert len(set(expected)) == len(expected) - 2  # the oversized request's baselines agree
