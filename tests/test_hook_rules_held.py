"""Hook-layer rules that no other test held: each test here fails when the rule's code is
changed in one small way (a dropped count, a reason not kept, a key not checked).

Replays go through fresh hooks objects over the same SQLite ledger: what another process or a
restart sees.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from plugin import Evidence, ManualClock, SimpleRetriever
from plugin.control import SqliteLedger
from plugin.control.ledger import MAX_CALL_EVIDENCE
from plugin.errors import RunIdentityError
from plugin.memory.protocol import ContextCaps
from plugin.memory.state import WorkingState
from runtime_hooks import RecallHooks, ToolCall
from runtime_hooks.calls import MAX_CALL_ID_BYTES

from ._calls_env import WALL, Counting, P, S, recall_hooks

pytestmark = pytest.mark.anyio

_MANY = MAX_CALL_EVIDENCE + 6


class _Many(Counting):
    """A retriever that finds more items than a call record keeps ids of."""

    def __init__(self) -> None:
        super().__init__()
        self.items = {f"m{i}": Evidence(id=f"m{i}", text=f"cutover note {i}", principal=P,
                                        scope=S) for i in range(_MANY)}
        self.retriever = SimpleRetriever(self.search, get=self.get)

    async def search(self, request: Any) -> list[Evidence]:
        self.searches += 1
        return list(self.items.values())

    async def get(self, evidence_id: str, *, principal: str, scope: str) -> Evidence | None:
        self.reads += 1
        return self.items.get(evidence_id)


class _Junk(Counting):
    """A retriever that returns what is not evidence."""

    async def search(self, request: Any) -> Any:
        self.searches += 1
        return [object()]

    def __init__(self) -> None:
        super().__init__()
        self.retriever = SimpleRetriever(self.search)


@contextlib.asynccontextmanager
async def _hooks(path: Path, retriever: Counting, **fields: Any) -> AsyncIterator[RecallHooks]:
    clock = ManualClock(wall=WALL, monotonic=1.0)
    async with SqliteLedger(path) as ledger:
        hooks = recall_hooks(ledger, clock, retriever)
        for name, value in fields.items():
            setattr(hooks, name, value)
        yield hooks


def _call(call_id: str = "c1") -> ToolCall:
    return ToolCall(call_id=call_id, arguments={"query": "cutover"})


async def test_a_replay_says_the_items_its_record_could_not_keep(tmp_path: Path) -> None:
    """A search that showed more items than its record keeps ids of: the replay shows those
    it kept and says, in the bounded wording, how many it cannot show again (never a shorter
    list passed off as the whole answer)."""
    caps = ContextCaps(max_items=_MANY, max_bytes=10**6)
    path = tmp_path / "ledger.sqlite3"
    async with _hooks(path, _Many(), caps=caps, validation_limit=10**4,
                      max_retained=10**4) as hooks:
        (ran,) = await hooks.dispatch([_call()], run_id="r", scope=S, principal=P)
    assert ran.status == "ok" and len(ran.evidence) == _MANY
    retriever = _Many()
    async with _hooks(path, retriever, caps=caps, validation_limit=10**4,
                      max_retained=10**4) as hooks:
        (replayed,) = await hooks.dispatch([_call()], run_id="r", scope=S, principal=P)
    assert retriever.searches == 0
    assert replayed.status == "ok" and len(replayed.evidence) == MAX_CALL_EVIDENCE
    (part,) = [part for part in replayed.bounded if part.part == "recheck"]
    assert f"{_MANY - MAX_CALL_EVIDENCE} item(s)" in part.message
    assert part.message in replayed.content


async def test_a_replayed_failure_keeps_its_own_reason(tmp_path: Path) -> None:
    """A call whose retriever returned junk failed with ``bad_evidence``: its replay, in
    another process, fails with that same reason, not a generic one."""
    path = tmp_path / "ledger.sqlite3"
    async with _hooks(path, _Junk()) as hooks:
        (ran,) = await hooks.dispatch([_call()], run_id="r", scope=S, principal=P)
    assert ran.status == "failed" and ran.failure == "bad_evidence"
    retriever = _Junk()
    async with _hooks(path, retriever) as hooks:
        (replayed,) = await hooks.dispatch([_call()], run_id="r", scope=S, principal=P)
    assert retriever.searches == 0
    assert (replayed.status, replayed.failure, replayed.slot, replayed.content) == (
        "failed", "bad_evidence", ran.slot, ran.content)


_OTHERS = pytest.mark.parametrize(("principal", "scope"), [("mallory", S), (P, "other")],
                                  ids=["principal", "scope"])


@_OTHERS
async def test_every_hook_refuses_a_run_under_another_identity(
    tmp_path: Path, principal: str, scope: str,
) -> None:
    """A run id is bound to the principal and scope of its first use: each hook (preparation,
    dispatch, replay, the re-check of retained evidence) used with another one raises
    :class:`RunIdentityError`, in another process too, and answers nothing."""
    path = tmp_path / "ledger.sqlite3"
    async with _hooks(path, Counting()) as hooks:
        (ran,) = await hooks.dispatch([_call()], run_id="r", scope=S, principal=P)
    assert ran.status == "ok"
    retriever = Counting()
    async with _hooks(path, retriever) as hooks:
        with pytest.raises(RunIdentityError):
            await hooks.prepare(WorkingState(current_request="cutover"), run_id="r", scope=scope,
                                principal=principal)
        with pytest.raises(RunIdentityError):
            await hooks.dispatch([_call("c2")], run_id="r", scope=scope, principal=principal)
        with pytest.raises(RunIdentityError):
            await hooks.validate_retained(["m0"], run_id="r", scope=scope, principal=principal)
    assert retriever.searches == retriever.reads == 0


@_OTHERS
async def test_junk_calls_naming_a_run_of_another_identity_are_refused(
    tmp_path: Path, principal: str, scope: str,
) -> None:
    """Calls that are all invalid bind nothing and write nothing; sent under another
    principal or scope for a run these hooks bound, they still raise
    :class:`RunIdentityError`: the run is someone else's, whatever the calls hold."""
    async with _hooks(tmp_path / "ledger.sqlite3", Counting()) as hooks:
        await hooks.prepare(WorkingState(current_request="cutover"), run_id="r", scope=S,
                            principal=P)
        junk = ToolCall(call_id="bad", arguments={"nope": 1})
        with pytest.raises(RunIdentityError):
            await hooks.dispatch([junk], run_id="r", scope=scope, principal=principal)
        (answer,) = await hooks.dispatch([junk], run_id="r", scope=S, principal=P)
        assert answer.status == "invalid"


@_OTHERS
async def test_a_replay_under_another_identity_is_refused(
    tmp_path: Path, principal: str, scope: str,
) -> None:
    """A recorded call (a failure here: no evidence to re-read) replayed under another
    principal or scope raises :class:`RunIdentityError` rather than answer from the record."""
    path = tmp_path / "ledger.sqlite3"
    async with _hooks(path, _Junk()) as hooks:
        await hooks.dispatch([_call()], run_id="r", scope=S, principal=P)
    async with _hooks(path, _Junk()) as hooks:
        with pytest.raises(RunIdentityError):
            await hooks.replay([_call()], run_id="r", scope=scope, principal=principal)
        with pytest.raises(RunIdentityError):
            await hooks.dispatch([_call()], run_id="r", scope=scope, principal=principal)


async def test_a_call_id_one_byte_past_the_bound_is_invalid(tmp_path: Path) -> None:
    """A call id of :data:`MAX_CALL_ID_BYTES` UTF-8 bytes is a call; one byte more is
    ``invalid`` and gets no slot (the bound counts bytes, not characters)."""
    longest = "é" * (MAX_CALL_ID_BYTES // 2)
    retriever = Counting()
    async with _hooks(tmp_path / "ledger.sqlite3", retriever) as hooks:
        over, kept = await hooks.dispatch([_call(longest + "x"), _call(longest)], run_id="r",
                                          scope=S, principal=P)
    assert (over.status, over.slot) == ("invalid", None)
    assert kept.status == "ok" and retriever.searches == 1



async def test_a_retained_item_no_longer_there_is_gone(tmp_path: Path) -> None:
    """Evidence a run retained and the backend no longer has re-checks as ``gone`` (not
    ``valid``), and the one still there as ``valid`` with its evidence."""
    retriever = Counting()
    async with _hooks(tmp_path / "ledger.sqlite3", retriever) as hooks:
        await hooks.dispatch([_call()], run_id="r", scope=S, principal=P)
        lost = _Many()
        lost.items = {"m0": lost.items["m0"]}
        hooks.retriever = lost.retriever
        checks = await hooks.validate_retained(["m0", "m1"], run_id="r", scope=S, principal=P)
    assert [(c.evidence_id, c.status) for c in checks] == [("m0", "valid"), ("m1", "gone")]
    assert checks[0].evidence is not None and checks[1].evidence is None
