"""The seeded development-set generator: ``python examples/devset.py [--seed 9] [--out FILE]``.

Writes the development set the ranking was tuned on (``examples/devset.jsonl``, committed):
ten principals, each with one corpus (defined once, referenced by its scenarios) of three
projects' memories, and 33 scenarios per principal in six families (continuation, anaphoric,
self_contained, topic_switch, long_request, self_contained_in_flight).

What makes it hard, on purpose:

- gold memories are *paraphrased*: the state says "Rotate the billing service credentials",
  the memory says "Secret rollover for the billing service: ..."; a self-contained request
  asks in a third wording;
- distractors share words with the state: trivia about the same subjects ("The billing
  service dashboard moved to Grafana"), and the same operation on subjects nobody works on;
- every state has more than eight tasks and more than eight facts, so the composer's windows
  matter;
- other principals' look-alikes (a near copy of a gold memory under another principal, or the
  same principal in another scope) are ``must_not`` items.

The same seed always writes the same bytes. Tuning used this file only, never a held-out set.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SEED = 9
DEFAULT_OUT = Path(__file__).resolve().parent / "devset.jsonl"
SCENARIOS_PER_FAMILY_PER_CORPUS = {
    "continuation": 6, "anaphoric": 5, "self_contained": 6, "topic_switch": 5,
    "long_request": 5, "self_contained_in_flight": 6,
}
CORPORA = 10


@dataclass(frozen=True)
class Operation:
    """One kind of work, in four wordings: the state's, two memories', a question's."""

    key: str
    task: tuple[str, ...]
    """How the state names the work (task, next action)."""
    gold: tuple[str, str]
    """Two memories needed to do it, worded differently from ``task``."""
    ask: tuple[str, ...]
    """A self-contained request about it, in a third wording."""
    targets: tuple[str, ...]
    side: str
    """The same operation on a subject nobody works on (a near miss)."""


OPERATIONS = (
    Operation(
        "migrate",
        ("Migrate the {s} to {t}", "Finish moving the {s} over to {t}"),
        ("Moving the {s} onto {t}: dual-write for a week, then switch the reads over.",
         "Row counts must match after copying the {s} tables to {t}; compare checksums."),
        ("How were we going to move the {s} onto {t}?",
         "What is the cut-over approach for putting the {s} on {t}?"),
        ("Postgres", "the new cluster", "Kubernetes", "the EU region"),
        "Moving the {s} onto {t} was postponed until next year.",
    ),
    Operation(
        "loadtest",
        ("Load-test the {s} at {t}", "Run the {s} load test at {t}"),
        ("Stress run for the {s}: ramp up to {t} with k6 from the perf box and watch p99.",
         "Last quarter the {s} fell over at half of {t}: the connection pool ran dry."),
        ("What is the procedure for stress testing the {s}?",
         "How do we find out whether the {s} survives {t}?"),
        ("5k requests per second", "peak traffic", "twice the holiday volume"),
        "Stress run results for the {s} are archived in the perf wiki.",
    ),
    Operation(
        "rotate",
        ("Rotate the {s} credentials", "Rotate the keys of the {s}"),
        ("Secret rollover for the {s}: issue new keys in the vault, deploy, revoke the old "
         "pair after a day.",
         "The {s} caches its secrets for an hour, so revoking early breaks it."),
        ("How do we roll over the secrets of the {s}?",
         "What are the steps to replace the {s} keys safely?"),
        ("",),
        "Secret rollover for the {s} is automated by the platform team.",
    ),
    Operation(
        "backfill",
        ("Backfill the {s} history for {t}", "Backfill {t} into the {s}"),
        ("Historical reload of the {s}: replay {t} from the archive bucket in daily batches.",
         "Each {s} reload batch takes about forty minutes; run them overnight."),
        ("How should the historical reload of the {s} be done?",
         "What's the way to replay old data into the {s}?"),
        ("2023", "the last quarter", "March"),
        "A historical reload of the {s} was done once, in 2021.",
    ),
    Operation(
        "upgrade",
        ("Upgrade the {s} to {t}", "Bump the {s} to {t}"),
        ("Version bump of the {s} to {t}: read the breaking changes first, then canary on one "
         "node.",
         "The {s} pins an old client library that {t} drops."),
        ("What do we need to know before bumping the {s} version?",
         "Which risks come with a new release of the {s}?"),
        ("version 3", "the LTS release", "Python 3.12"),
        "The {s} release notes are posted in #releases.",
    ),
    Operation(
        "alert",
        ("Add alerting for the {s} {t}", "Set up alerts on the {s} {t}"),
        ("Pager rule for the {s}: fire when the {t} stays above threshold for ten minutes.",
         "Pages for the {s} go to the ops-alerts channel, never to email."),
        ("How should paging be set up for the {s}?",
         "Who gets woken up when the {s} misbehaves, and when?"),
        ("error rate", "latency", "queue depth"),
        "Pager noise from the {s} was reviewed in the retro.",
    ),
    Operation(
        "bugfix",
        ("Fix the {s} {t} bug", "Fix the {t} problem in the {s}"),
        ("Root cause of the {s} {t} issue: a race between the retry loop and the cache "
         "refresh.",
         "Repro for the {s} defect: run the integration suite with RACE=1."),
        ("What caused the {t} problem in the {s}?",
         "Why does the {s} misbehave with {t}s?"),
        ("timeout", "duplicate", "memory leak"),
        "The {s} had a similar defect in 2022, closed as won't fix.",
    ),
    Operation(
        "runbook",
        ("Write the runbook for the {s}", "Document how to operate the {s}"),
        ("Operations guide for the {s}: restart order, health checks, who to call.",
         "The {s} guide belongs in the wiki under Platform/Runbooks."),
        ("Where does the operations guide for the {s} go and what does it cover?",
         "What should on-call read before touching the {s}?"),
        ("",),
        "An old operations guide for the {s} is outdated.",
    ),
    Operation(
        "cost",
        ("Cut the {s} cloud bill by {t}", "Reduce what the {s} costs by {t}"),
        ("Spend reduction for the {s}: move batch jobs to spot instances, shrink idle "
         "replicas.",
         "The {s} costs about 14k dollars a month, mostly storage."),
        ("How can we make the {s} cheaper to run?",
         "Where does the money for the {s} go?"),
        ("20%", "a third", "half"),
        "Spend for the {s} is reported monthly to finance.",
    ),
    Operation(
        "sunset",
        ("Retire the legacy {s} endpoint", "Turn off the old {s} API"),
        ("Sunset plan for the old {s} interface: announce, add a deprecation header, switch "
         "off after ninety days.",
         "Three partners still call the old {s} interface every day."),
        ("What's the deprecation plan for the old {s} interface?",
         "Who still depends on the old {s} interface?"),
        ("",),
        "Deprecation headers are standard on every {s} response.",
    ),
)

PROJECTS = (
    ("Atlas", "payments", ("billing service", "invoice exporter", "payment gateway",
                            "ledger database", "refund worker", "tax engine")),
    ("Borealis", "search", ("search index", "query parser", "ranking service", "web crawler",
                             "autocomplete API", "synonym store")),
    ("Cobalt", "mobile", ("push notifier", "sync daemon", "login service", "flag store",
                           "crash reporter", "media uploader")),
    ("Dune", "data", ("event pipeline", "data warehouse", "ETL scheduler", "metrics exporter",
                       "report generator", "schema registry")),
    ("Ember", "infrastructure", ("DNS resolver", "load balancer", "artifact cache",
                                  "build farm", "container registry", "VPN gateway")),
    ("Fjord", "support", ("ticket router", "chat widget", "email parser", "SLA tracker",
                           "knowledge base", "survey service")),
)

TRIVIA = (
    "The {s} dashboard moved to Grafana last sprint.",
    "On-call for the {s} rotates weekly on Mondays.",
    "The {s} standup moved to 9:30.",
    "{P} planning notes mention the {s} twice.",
    "The {s} team celebrated its anniversary with cake.",
    "A new logo for the {s} was proposed and rejected.",
)

PEOPLE = ("Priya", "Tomas", "Aiko", "Femi", "Lena", "Marco", "Sade", "Yusuf", "Greta", "Ravi")
PRINCIPALS = ("ana", "bo", "chen", "dara", "eli", "fay", "gus", "hana", "ivo", "jun")

GENERIC_TASKS = (
    "Review open pull requests", "Update the team wiki", "Prepare the sprint demo",
    "Answer the security questionnaire", "Clean up stale feature branches",
    "Book the offsite room", "Triage the inbox",
)
CONSTRAINTS = (
    "No deploys on Fridays", "Keep public APIs backwards compatible",
    "Changes need two reviewers", "Stay within the quarterly budget",
    "Nothing customer-visible before the launch freeze ends",
)

CONTENT_FREE = ("Continue", "go on", "do that", "yes", "ok, next", "Continue please",
                "sounds good, go ahead", "ok")
ANAPHORIC = (
    "Let's do that now, the one {p} raised",
    "Can you pick that up again?",
    "Same as we said before, do it now",
    "Let's tackle the thing {p} mentioned",
    "ok do it like we discussed with {p}",
    "Do the next one",
)
CHATTER = (
    "I've been thinking about this since yesterday's meeting and I want to be sure we get it "
    "right, because the last time something like this came up we lost most of a day chasing "
    "the wrong lead and the people waiting on us were not happy about it.",
    "Quick context before the actual question: the team is stretched, two people are out, "
    "and the roadmap review is next week, so whatever we do has to be cheap to undo and easy "
    "to explain to the people who will ask about it afterwards.",
    "Sorry for the long message. I read through the old threads, the notes from the planning "
    "session and a couple of the tickets, and I still could not find a straight answer, so I "
    "am asking here again with everything I know.",
)


@dataclass(frozen=True)
class Item:
    """A piece of work in a corpus: a subject, an operation and its two gold memories."""

    project: str
    subject: str
    op: Operation
    target: str
    owner: str
    gold: tuple[str, str]
    """The ids of its two gold memories."""
    lookalikes: tuple[str, ...]

    def fill(self, template: str) -> str:
        text = template.format(s=self.subject, t=self.target, P=self.project)
        return " ".join(text.split()).replace(" ?", "?")

    def task(self, rng: random.Random) -> str:
        return self.fill(rng.choice(self.op.task))

    def ask(self, rng: random.Random) -> str:
        return self.fill(rng.choice(self.op.ask))


@dataclass
class Corpus:
    corpus_id: str
    principal: str
    scope: str
    memories: list[dict[str, str]]
    people: list[dict[str, object]]
    items: dict[str, list[Item]]
    """Work items by project."""
    subjects: dict[str, tuple[str, ...]]


def _corpus(index: int, rng: random.Random) -> Corpus:
    principal = PRINCIPALS[index]
    scope = "work"
    other = PRINCIPALS[(index + 1) % len(PRINCIPALS)]
    projects = [PROJECTS[(index + j) % len(PROJECTS)] for j in range(3)]
    corpus_id = f"c{index:02d}"
    memories: list[dict[str, str]] = []
    counter = iter(range(1, 10_000))

    def add(text: str, *, owner: str = principal, in_scope: str = scope) -> str:
        memory_id = f"{corpus_id}-m{next(counter):03d}"
        memories.append({"id": memory_id, "text": text, "principal": owner, "scope": in_scope})
        return memory_id

    items: dict[str, list[Item]] = {}
    people: dict[str, list[dict[str, str]]] = {}
    subjects: dict[str, tuple[str, ...]] = {}
    for name, _area, project_subjects in projects:
        subjects[name] = project_subjects
        ops = rng.sample(OPERATIONS, len(project_subjects))
        project_items: list[Item] = []
        for subject, op in zip(project_subjects, ops, strict=True):
            target = rng.choice(op.targets)
            owner = rng.choice(PEOPLE)
            probe = Item(name, subject, op, target, owner, ("", ""), ())
            gold = (add(probe.fill(op.gold[0])), add(probe.fill(op.gold[1])))
            look = (
                add(probe.fill(op.gold[0]) + " (my own notes)", owner=other),
                add(probe.fill(op.gold[1]), owner=principal, in_scope="personal"),
            )
            project_items.append(Item(name, subject, op, target, owner, gold, look))
            people.setdefault(owner, []).append(
                {"id": f"{corpus_id}-b{next(counter):03d}",
                 "text": f"{owner} thinks the {subject} work should wait for the review."}
            )
        items[name] = project_items
        for subject in project_subjects:
            for template in rng.sample(TRIVIA, 2):
                add(template.format(s=subject, P=name))
            own = next(it.op for it in project_items if it.subject == subject)
            spare = rng.choice([op for op in OPERATIONS if op is not own])
            add(spare.side.format(s=subject, t=rng.choice(spare.targets)).replace(" .", "."))
    rng.shuffle(memories)  # file order is creation order: no family is "the newest"
    return Corpus(
        corpus_id, principal, scope, memories,
        [{"name": n, "beliefs": b} for n, b in sorted(people.items())], items, subjects,
    )


def _state(corpus: Corpus, project: str, focus: Item | None, pending: list[Item],
           rng: random.Random, request: str) -> dict[str, object]:
    """A busy working state in ``project``: more than eight tasks and eight facts."""
    others = [it for it in corpus.items[project] if it is not focus and it not in pending]
    tasks: list[dict[str, object]] = []
    done = rng.sample(others, min(2, len(others)))
    for item in done:
        tasks.append({"text": item.task(rng), "done": True})
    for item in pending:
        tasks.append({"text": item.task(rng), "done": False})
    for text in rng.sample(GENERIC_TASKS, 9 - len(tasks) + rng.randrange(3)):
        tasks.append({"text": text, "done": rng.random() < 0.3})
    facts: list[dict[str, object]] = []
    for item in corpus.items[project]:
        facts.append({"text": f"{item.owner} owns the {item.subject}",
                      "entities": [item.owner, item.subject]})
    facts += [{"text": f"{p} is on leave next week", "entities": [p]}
              for p in rng.sample(PEOPLE, 3)]
    rng.shuffle(facts)
    if focus is not None:  # the owner of the work in flight is among the first facts
        facts.insert(0, {"text": f"{focus.owner} asked for the {focus.subject} change",
                         "entities": [focus.owner]})
    subject = rng.choice(corpus.subjects[project])
    return {
        "current_request": request,
        "objective": f"Finish the {project} hardening milestone",
        "next_action": focus.task(rng) if focus is not None else "",
        "tasks": tasks,
        "open_questions": [f"Who signs off on the {subject} change?",
                           "Is the milestone date still realistic?"],
        "constraints": rng.sample(CONSTRAINTS, 3),
        "facts": facts,
    }


def _scenarios(corpus: Corpus, rng: random.Random, start: int) -> Iterator[dict[str, object]]:
    number = start
    projects = list(corpus.items)
    plan = [family for family, count in SCENARIOS_PER_FAMILY_PER_CORPUS.items()
            for _ in range(count)]
    for family in plan:
        project = rng.choice(projects)
        pool = list(corpus.items[project])
        rng.shuffle(pool)
        focus, task_a, task_b, asked = pool[0], pool[1], pool[2], pool[3]
        relevant: dict[str, int] = {}
        pending = [task_a, task_b]
        state_focus: Item | None = focus
        if family == "continuation":
            request = rng.choice(CONTENT_FREE)
            target = focus
        elif family == "anaphoric":
            request = rng.choice(ANAPHORIC).format(p=focus.owner)
            target = focus
        elif family == "self_contained":
            target = asked
            request = asked.ask(rng)
            state_focus = None
        elif family == "self_contained_in_flight":
            target = asked
            request = asked.ask(rng)
        elif family == "topic_switch":
            elsewhere = rng.choice([p for p in projects if p != project])
            target = rng.choice(corpus.items[elsewhere])
            question = target.ask(rng)
            request = "Switching topics: " + question[0].lower() + question[1:]
        else:  # long_request
            target = asked
            request = " ".join([rng.choice(CHATTER), asked.ask(rng),
                                *rng.sample(CHATTER, rng.randrange(0, 2))])
            state_focus = rng.choice([focus, None])
        for memory_id in target.gold:
            relevant[memory_id] = 2
        if family in ("continuation", "anaphoric"):
            relevant[task_a.gold[0]] = 1  # the pending work is context too
        state = _state(corpus, project, state_focus, pending, rng, request)
        yield {
            "id": f"dev-{number:04d}",
            "family": family,
            "principal": corpus.principal,
            "scope": corpus.scope,
            "corpus": corpus.corpus_id,
            "state": state,
            "relevant": relevant,
            "must_not": list(target.lookalikes),
        }
        number += 1


def generate(seed: int = DEFAULT_SEED) -> Iterator[dict[str, object]]:
    """The development set's lines, in file order: each corpus, then its scenarios."""
    rng = random.Random(seed)
    number = 1
    for index in range(CORPORA):
        corpus = _corpus(index, rng)
        yield {"corpus": corpus.corpus_id, "memories": corpus.memories,
               "people": corpus.people}
        for scenario in _scenarios(corpus, rng, number):
            number += 1
            yield scenario


def write(path: Path, seed: int = DEFAULT_SEED) -> int:
    """Write the set to ``path``; returns the number of scenarios."""
    count = 0
    with path.open("w", encoding="utf-8", newline="\n") as file:
        for line in generate(seed):
            count += "id" in line
            file.write(json.dumps(line, ensure_ascii=False, sort_keys=False) + "\n")
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    count = write(args.out, args.seed)
    print(f"{count} scenarios written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
