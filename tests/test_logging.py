"""Structured logging: one logger per layer, fields on the record, nothing printed; both loops."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from plugin import AttemptKind, ManualClock, RecallAllowance, RecallBudgetExceeded, RoundKind
from plugin.control.logs import log_event
from runtime_hooks.bootstrap import RecallConfig, open_hooks
from runtime_hooks.demo import PRINCIPAL, SCOPE, STATE, seed
from runtime_hooks.hooks import ToolCall

from ._fakes import MemoryLedger

pytestmark = pytest.mark.anyio


def _events(caplog: pytest.LogCaptureFixture, logger: str) -> list[dict[str, object]]:
    return [r.recallbound for r in caplog.records  # type: ignore[attr-defined]
            if r.name == logger and hasattr(r, "recallbound")]


async def test_control_logs_granted_and_refused_rounds(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="recallbound")
    allowance = RecallAllowance(MemoryLedger(), clock=ManualClock(wall=1e9, monotonic=1.0))
    async with allowance.round("r1", RoundKind.AUTOMATIC) as permit:
        async with permit.attempt(AttemptKind.BASE):
            pass
    async with allowance.round("r1", RoundKind.DELIBERATE, slots=2):
        pass
    with pytest.raises(RecallBudgetExceeded):
        async with allowance.round("r1", RoundKind.DELIBERATE, slots=1):
            pass  # pragma: no cover
    assert _events(caplog, "recallbound.control") == [
        {"event": "round.granted", "run_id": "r1", "round": 1, "kind": "automatic",
         "slots": 2, "legacy": False},
        {"event": "round.granted", "run_id": "r1", "round": 2, "kind": "deliberate",
         "slots": 2, "legacy": False},
        {"event": "round.refused", "run_id": "r1", "kind": "deliberate", "reason": "rounds",
         "reserved": 4, "executed": 1},
    ]
    refused = [r for r in caplog.records if r.getMessage().startswith("round.refused")]
    assert refused[0].levelno == logging.INFO
    assert refused[0].getMessage() == (
        "round.refused run_id='r1' kind='deliberate' reason='rounds' reserved=4 executed=1")
    assert capsys.readouterr() == ("", "")


async def test_hooks_log_on_their_own_logger_without_query_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="recallbound")
    config = RecallConfig(ledger_path=tmp_path / "l.db", store_path=tmp_path / "m.db")
    async with open_hooks(config, clock=ManualClock(wall=1.8e9, monotonic=1.0)) as hooks:
        await seed(hooks.retriever.store)  # type: ignore[attr-defined]
        await hooks.prepare(STATE, run_id="r", scope=SCOPE, principal=PRINCIPAL)
        await hooks.dispatch(
            [ToolCall(call_id="bad", arguments={"query": "secret plans", "when": "now"}),
             ToolCall(call_id="c1", arguments={"query": "secret plans"}),
             ToolCall(call_id="c2", arguments={"query": "secret plans"}),
             ToolCall(call_id="c3", arguments={"query": "secret plans"})],
            run_id="r", scope=SCOPE, principal=PRINCIPAL)
        await hooks.dispatch([ToolCall(call_id="c4", arguments={"query": "more secrets"})],
                             run_id="r", scope=SCOPE, principal=PRINCIPAL)
    hooks_events = _events(caplog, "recallbound.hooks")
    assert [e["event"] for e in hooks_events] == ["search_call.invalid", "deliberate.refused"]
    assert hooks_events[1] == {"event": "deliberate.refused", "run_id": "r", "calls": 1,
                               "reason": "rounds"}
    assert {r.name for r in caplog.records} <= {
        "recallbound.control", "recallbound.memory", "recallbound.hooks"}
    assert not any("secret" in r.getMessage() for r in caplog.records)
    assert capsys.readouterr() == ("", "")


def test_log_event_builds_nothing_when_the_level_is_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="recallbound")

    class Loud:
        def __repr__(self) -> str:
            raise AssertionError("formatted although the level is off")

    log_event(logging.getLogger("recallbound.control"), logging.DEBUG, "x", value=Loud())
    assert caplog.records == []


def test_an_application_that_configured_no_logging_gets_nothing_printed(tmp_path: Path) -> None:
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent('''
        import anyio
        from plugin import SimpleRetriever, WorkingState
        from runtime_hooks.bootstrap import RecallConfig, open_hooks

        async def search(request):
            raise RuntimeError("backend down")  # logged at WARNING

        async def main():
            config = RecallConfig(ledger_path="ledger.db")
            async with open_hooks(config, retriever=SimpleRetriever(search)) as hooks:
                await hooks.prepare(WorkingState("hello"), run_id="r", scope="s", principal="p")

        anyio.run(main)
    ''')
    done = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True,
                          text=True, check=True)
    assert done.stderr == ""
