"""The main job: a scripted agent on an embedded SQLite store, end to end.

It seeds a memory store, then shows (1) what a bare "Continue" retrieves under the baseline
query and under the task-context query, (2) a turn of six parallel search calls on a four-slot
allowance, (3) the bounded-recall notice once the allowance is spent, with corrections and the
validation of retained evidence still available, and (4) the ledger's reserved and executed
counts.
"""

from __future__ import annotations

import tempfile
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from plugin.control import Clock, Ledger, SystemClock
from plugin.errors import RecallboundError
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.planning import QueryStrategy
from plugin.memory.state import Fact, Task, WorkingState
from plugin.memory.store import Evidence, MemoryRecord, MemoryStore
from plugin.memory.store.errors import MemoryConflictError

from .bootstrap import (
    RecallConfig,
    Semantic,
    best_installed,
    load_embedding,
    open_hooks,
    required_store_path,
)
from .hooks import PreparedContext, RecallHooks, ToolCall
from .loop import AgentLoop, Dispatch, ModelStep, Preparation, ScriptedModel

PRINCIPAL = "ana"
SCOPE = "atlas"

STATE = WorkingState(
    "Continue",
    objective="Ship the Atlas billing migration",
    next_action="Run the invoice backfill dry-run against the staging ledger",
    tasks=(
        Task("Write the rollback runbook for the cutover", done=True),
        Task("Confirm currency rounding rules with Priya"),
        Task("Backfill historical invoices into the new schema"),
    ),
    open_questions=("When is the cutover date?",),
    constraints=("No deploys during EU business hours",),
    facts=(Fact("Priya owns the finance rules", entities=("Priya",)),),
)

MEMORIES = (
    ("m-backfill", "Invoice backfill dry-run: run scripts/backfill_invoices.py --dry-run "
     "against the staging ledger snapshot; expect about 1.2M rows.", ("src-backfill",)),
    ("m-rounding", "Currency rounding rule: round half-even per line item, not per invoice.", ()),
    ("m-runbook", "Rollback runbook for the cutover is drafted and reviewed.", ()),
    ("m-kickoff", "Atlas billing migration kickoff: move billing from the legacy system to "
     "the new schema in Postgres.", ()),
    ("m-cutover", "Cutover date: finance prefers a date after the quarter close.", ()),
    ("m-deploy", "Deploy window: never during EU business hours (08:00-18:00 CET).", ()),
    ("m-lunch", "Team lunch is on Thursday at the noodle place.", ()),
)


async def seed_once(store: MemoryStore) -> bool:
    """:func:`seed`, unless the store holds the demo's memories already (a re-run on the same
    ``--data-dir``); True when it seeded. A re-run with another semantic arm embeds what the
    earlier run stored without that arm's vectors, so the arm it names searches them."""
    try:
        await seed(store)
    except MemoryConflictError:
        await store.embed_missing()
        return False
    return True


async def run_tag(allowance_ledger: Ledger) -> str:
    """``""`` on a fresh ledger, else ``"-N"``: the first suffix whose run ids are unused, so
    a re-run on the same ``--data-dir`` starts its runs with a fresh allowance."""
    n = 1
    while True:
        tag = "" if n == 1 else f"-{n}"
        usage = await allowance_ledger.usage(f"parallel{tag}")
        if usage.rounds == 0 and usage.legacy_attempts == 0:
            return tag
        n += 1


async def seed_store(config: RecallConfig, *, clock: Clock | None = None) -> None:
    """Seed the demo's memories into the reference store ``config`` names, through the store
    itself (the hooks reach memory only through their retriever)."""
    async with MemoryStore(required_store_path(config), embedding=load_embedding(config.semantic),
                           clock=clock if clock is not None else SystemClock()) as store:
        await seed(store)


async def seed(store: MemoryStore) -> None:
    """The demo's memories, people, beliefs, corrections and sources (and some foreign rows)."""
    base = 1_760_000_000.0
    await store.add_memories(
        MemoryRecord(id=mid, text=text, principal=PRINCIPAL, scope=SCOPE,
                     created_at=base + i * 3600, cites=cites)
        for i, (mid, text, cites) in enumerate(MEMORIES)
    )
    await store.add_memories([
        MemoryRecord(id="m-foreign", text="Bo's private note on the backfill dry-run budget.",
                     principal="bo", scope=SCOPE, created_at=base),
        MemoryRecord(id="m-personal", text="Ana's dentist appointment is before the backfill.",
                     principal=PRINCIPAL, scope="personal", created_at=base),
    ])
    await store.add_belief("b-priya", "Priya", "Priya believes rounding must follow the EU "
                           "invoicing directive.", principal=PRINCIPAL, scope=SCOPE)
    await store.add_source("src-backfill", "backfill_invoices.py usage: --dry-run writes a "
                           "diff report to /tmp/backfill.csv and touches nothing.",
                           principal=PRINCIPAL, scope=SCOPE)
    await store.add_correction("c-snapshot", "The staging ledger snapshot is Monday's, not "
                               "Friday's.", principal=PRINCIPAL, scope=SCOPE)


def _say(out: Callable[[str], None], text: str = "", indent: int = 0) -> None:
    pad = " " * indent
    for line in text.splitlines() or [""]:
        if len(line) + indent <= 100:
            out(pad + line if line else "")
            continue
        hang = " " * (2 if line.startswith("- ") else 0)
        for part in textwrap.wrap(line, 100 - indent, subsequent_indent=hang):
            out(pad + part)


def _heading(out: Callable[[str], None], text: str) -> None:
    out("")
    out(text)
    out("=" * len(text))


def _show_context(out: Callable[[str], None], context: PreparedContext) -> None:
    query = context.query
    reason = f" ({query.baseline_reason.value})" if query.baseline_reason else ""
    _say(out, f"query [{query.strategy.value}{reason}], fingerprint {query.fingerprint[:12]}:", 2)
    for fragment in query.fragments:
        _say(out, f"| {fragment}", 4)
    if context.slots:
        _say(out, f"searched on slot(s) {', '.join(map(str, context.slots))}", 2)
    _say(out, "context for the model:", 2)
    _say(out, context.render() or "(nothing)", 4)


def _placed(evidence: Sequence[Evidence]) -> str:
    """Where the next action's memory stands in what the model reads."""
    ids = [item.id for item in evidence]
    if "m-backfill" not in ids:
        return f"NOT retrieved ({len(ids)} items shown)"
    return f"retrieved, item {ids.index('m-backfill') + 1} of {len(ids)} shown"


async def _compare(
    out: Callable[[str], None],
    config: RecallConfig,
    clock: Clock | None,
    embedding: EmbeddingAdapter | None,
    tag: str = "",
) -> None:
    _heading(out, "1. The user says \"Continue\": baseline vs task_context")
    _say(out, f"working state: next action = {STATE.next_action!r}")
    _say(out, f"               unfinished  = {[t.text for t in STATE.tasks if not t.done]}")

    async def admitted(experiment: str) -> bool:
        return experiment == "task_context"

    for strategy in (QueryStrategy.BASELINE, QueryStrategy.TASK_CONTEXT):
        cfg = attrs.evolve(config, query_planning=strategy, admission=admitted)
        async with open_hooks(cfg, clock=clock, embedding=embedding) as hooks:
            with hooks.bind_run():
                context = await hooks.prepare(
                    STATE, run_id=f"compare-{strategy.value}{tag}", scope=SCOPE,
                    principal=PRINCIPAL
                )
        out("")
        _say(out, f"{strategy.value}:")
        _show_context(out, context)
        _say(out, f"-> next-action memory (m-backfill): {_placed(context.evidence)}", 2)


def _calls(*queries: str) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(call_id=f"call-{i + 1}", arguments={"query": q})
                 for i, q in enumerate(queries))


async def _parallel(out: Callable[[str], None], hooks: RecallHooks, tag: str = "") -> None:
    _heading(out, "2. One turn, six parallel search calls, a four-search allowance")
    run_id = f"parallel{tag}"
    model = ScriptedModel([
        ModelStep(tool_calls=_calls(
            "invoice backfill dry-run", "currency rounding rule", "cutover date",
            "deploy window", "rollback runbook", "kickoff notes",
        )),
        ModelStep(tool_calls=_calls("staging ledger snapshot")),
        ModelStep(answer="Running the backfill dry-run against Monday's snapshot."),
    ])
    # This host installs only the tool-dispatch hook at first, so the whole allowance is open
    # to the model's calls; the preparation hook comes in below.
    loop = AgentLoop(hooks, model, automatic_recall=False, max_steps=1)
    transcript = await loop.run(STATE, run_id=run_id, scope=SCOPE, principal=PRINCIPAL)
    dispatch = transcript.events[0]
    assert isinstance(dispatch, Dispatch)
    for call, result in zip(dispatch.calls, dispatch.results, strict=True):
        query = call.arguments["query"] if isinstance(call.arguments, dict) else "?"
        if result.status == "ok":
            ids = ", ".join(item.id for item in result.evidence) or "nothing"
            _say(out, f"{call.call_id} {query!r:32} slot {result.slot}: {ids}", 2)
        else:
            reason = result.refusal.reason.value if result.refusal else result.status
            _say(out, f"{call.call_id} {query!r:32} refused ({reason})", 2)
    refused = next(r for r in dispatch.results if r.refusal is not None)
    _say(out, "a refused call's result, as the model reads it:", 2)
    _say(out, textwrap.fill(refused.content, 88), 4)

    _heading(out, "3. The allowance is spent")
    rest = AgentLoop(hooks, model, automatic_recall=True, max_steps=3)
    transcript = await rest.run(STATE, run_id=run_id, scope=SCOPE, principal=PRINCIPAL)
    for event in transcript.events:
        if isinstance(event, Preparation):
            _say(out, "preparation (automatic round) before the model's call:", 2)
            _say(out, event.context.render(), 4)
        else:
            for result in event.results:
                _say(out, f"model's search {result.call_id}: {result.status} "
                     f"({result.refusal.reason.value if result.refusal else ''})", 2)
    retained = [item.id for item in dispatch.results[0].evidence][:2]
    checks = await hooks.validate_retained(
        retained, run_id=run_id, scope=SCOPE, principal=PRINCIPAL
    )
    _say(out, "validation of evidence retained from earlier deliberate searches "
         "(its own bound, no slot):", 2)
    for check in checks:
        _say(out, f"{check.evidence_id}: {check.status}", 4)
    _say(out, f"answer: {transcript.answer}", 2)


async def _usage(out: Callable[[str], None], hooks: RecallHooks, run_ids: list[str]) -> None:
    _heading(out, "4. The ledger: reserved (conservative) vs executed (observed)")
    out(f"  {'run':24} {'rounds':>6} {'reserved':>8} {'executed':>8} {'refused':>7}")
    ledger = hooks.allowance.ledger
    for run_id in run_ids:
        usage = await ledger.usage(run_id)
        out(f"  {run_id:24} {usage.rounds:>6} {usage.reserved:>8} {usage.executed:>8} "
            f"{usage.refused:>7}")
    traces = await ledger.attempts(run_ids[-1])
    out("")
    _say(out, f"attempt traces of run {run_ids[-1]!r}:", 2)
    for trace in traces:
        query = trace.fingerprint[:12] if trace.fingerprint else "-"
        _say(out, f"round {trace.round_index} slot {trace.slot} {trace.kind:10} "
             f"{trace.outcome.value:9} query {query}", 4)


class DemoFolderError(RecallboundError, ValueError):
    """The demo's ``--data-dir`` cannot hold its files (a file, a device, no permission)."""


async def run_demo(
    out: Callable[[str], None] = print,
    *,
    data_dir: Path | None = None,
    semantic: Semantic | None = None,
    clock: Clock | None = None,
) -> None:
    """Run the whole demo, printing through ``out``."""
    if semantic is None:
        semantic = best_installed()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(data_dir) if data_dir is not None else Path(tmp)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DemoFolderError(f"cannot keep the demo's files in {str(folder)!r}: "
                                  f"{exc.strerror or exc}") from None
        config = RecallConfig(ledger_path=folder / "ledger.db",
                              store_path=folder / "memory.db", semantic=semantic)
        embedding = load_embedding(semantic)
        out("recallbound demo")
        out(f"  ledger and memory store: {folder} (embedded SQLite)")
        out(f"  semantic arm: {semantic.value}; allowance: 4 searches, 2 rounds, 10 s deadline")
        async with MemoryStore(required_store_path(config), embedding=embedding,
                               clock=clock if clock is not None else SystemClock()) as store:
            if not await seed_once(store):
                out("  (the memories were seeded by an earlier run on this folder)")
        async with open_hooks(config, clock=clock, embedding=embedding) as hooks:
            tag = await run_tag(hooks.allowance.ledger)
        await _compare(out, config, clock, embedding, tag)
        async with open_hooks(config, clock=clock, embedding=embedding) as hooks:
            await _parallel(out, hooks, tag)
            await _usage(out, hooks, [f"compare-baseline{tag}", f"compare-task_context{tag}",
                                      f"parallel{tag}"])

