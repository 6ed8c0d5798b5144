"""``recallbound evaluate --scenarios FILE --out DIR [--k 5,10] [--semantic ...] [--limit N]``.

The one evaluation command (``python -m plugin.evaluation`` runs the same). Streams the scenario
file (corpora defined once, referenced by many scenarios), runs every scenario through baseline
and task_context on the sparse, semantic and fused arms under one allowance, shows a progress
bar on stderr, prints a table and writes into ``DIR``:

- ``report.json``: every metric per arm, strategy and family, the paired differences, the costs,
  and the provenance (recallbound version, git commit when available, SHA-256 of the scenario
  file, embedding model, date, command line);
- ``report.md``: the tables, a legend of every column and a one-paragraph verdict;
- ``rankings.jsonl``: one line per scenario x arm x strategy (the query text, the top-k ids
  with their scores, the relevant ids), for error analysis;
- ``chart.png``: the per-family recall@5 differences with their 95 % intervals and n (needs
  the ``evaluate`` extra, matplotlib).

``--limit N`` evaluates a seeded sample of N scenarios (``--seed``). ``--determinism N``
evaluates the first N (sampled) scenarios again in a second process with another
``PYTHONHASHSEED`` and checks that the rankings are identical.

Errors print one ``recallbound: ...`` line on stderr: exit 1 for bad input (a malformed scenario
file, a missing model, a failed determinism check), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shlex
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

import anyio

from plugin.control.dsn import redact
from plugin.errors import RecallboundError
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.embedding_choice import load_embedding
from plugin.memory.safe_text import one_line

from .analysis import (
    BOOTSTRAP_RESAMPLES,
    ranking_digest,
)
from .errors import EvaluationError
from .evaluator import (
    Arm,
    Evaluator,
    default_embedding,
)
from .outputs import Outputs
from .report import LEGEND as LEGEND
from .report import WORSE as WORSE
from .report import tables as tables
from .report import verdict as verdict
from .report import write_chart as write_chart
from .runner import DEFAULT_ARMS as DEFAULT_ARMS
from .runner import Progress as Progress
from .runner import cells_for as cells_for
from .runner import count_scenario_lines as count_scenario_lines
from .runner import provenance as provenance
from .runner import ranking_line as ranking_line
from .runner import run as run
from .runner import sample_indices as sample_indices
from .runner import selected_scenarios
from .scenarios import InvalidScenarioError, ScenarioLineTooLongError, bounded_lines

__all__ = ["configure", "main", "provenance", "run", "sample_indices"]

SEMANTIC_CHOICES = ("wordllama", "minilm", "hashing")
"""Below this many paired scenarios no p-value is shown (the report marks it ``n<10``)."""
MAX_RESAMPLES = 1_000_000
"""The most bootstrap resamples ``--resamples`` takes (each is kept in memory)."""


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``evaluate`` options to ``parser`` (the ``recallbound evaluate`` subparser)."""
    parser.add_argument("--scenarios", required=True, type=given_path,
                        help="a JSONL scenario file (one scenario a line; corpora may be shared)")
    parser.add_argument("--out", required=True, type=given_path,
                        help="folder for report.json, report.md and chart.png")
    parser.add_argument("--k", default="5,10", type=_ks,
                        help="comma-separated cut-offs for recall@k and hit@k (default 5,10)")
    parser.add_argument("--semantic", choices=SEMANTIC_CHOICES, default=None,
                        help="the semantic arm's model (default: the best installed, "
                        "as semantic = \"auto\" picks it)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--arms", default=DEFAULT_ARMS, type=_arms,
                        help="comma-separated arms to evaluate, each with baseline and "
                        "task_context: sparse, semantic, fused, hooks (the preparation hook's "
                        "whole turn) (default sparse,semantic,fused)")
    parser.add_argument("--limit", type=_count, default=None, metavar="N",
                        help="evaluate a seeded sample of N scenarios (default: all)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the sample's seed (with --limit; default 0)")
    parser.add_argument("--determinism", type=_count_or_zero, default=20, metavar="N",
                        help="re-run the first N scenarios in a second process with another "
                        "PYTHONHASHSEED and compare rankings (0: skip)")
    parser.add_argument("--digest-only", type=_count_or_zero, default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument("--resamples", type=_at_least(1, MAX_RESAMPLES),
                        default=BOOTSTRAP_RESAMPLES,
                        help=argparse.SUPPRESS)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    # A usage error is one ``recallbound:`` line (the usage on it) and exit status 2.
    setattr(parser, "error", _usage_error(parser))  # noqa: B010 - argparse calls self.error
    return parser


def _usage_error(parser: argparse.ArgumentParser) -> Callable[[str], NoReturn]:
    def error(message: str) -> NoReturn:
        usage = " ".join(parser.format_usage().split())
        # argparse quotes the arguments it could not read: a password among them is hidden.
        print(f"recallbound: {redact(' '.join(message.split()))} ({usage})", file=sys.stderr)
        raise SystemExit(2)

    return error


def _at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum`` (and at most ``maximum``)."""

    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum or (maximum is not None and value > maximum):
            within = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum:,}"
            raise argparse.ArgumentTypeError(
                f"must be an integer {within}, got {text!r}"
            ) from None
        return value

    count.__name__ = "count"  # argparse names the type in its messages
    return count


_count_or_zero = _at_least(0)
_count = _at_least(1)


def given_path(text: str) -> Path:
    """An argparse type: a path, never empty (``Path("")`` would be the working folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return Path(text)


def _arms(text: str) -> tuple[Arm, ...]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    choices = ", ".join(arm.value for arm in Arm)
    try:
        arms = tuple(dict.fromkeys(Arm(name) for name in names))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--arms must name arms among {choices}, got {text!r}") from None
    if not arms:
        raise argparse.ArgumentTypeError(f"--arms must name at least one of {choices}")
    return arms


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k must be integers like 5,10, got {text!r}") from None
    if not ks or ks[0] < 1 or ks[-1] > 20:
        raise argparse.ArgumentTypeError(f"--k values must be between 1 and 20, got {text!r}")
    return ks


def embedding_for(choice: str | None) -> EmbeddingAdapter:
    """The semantic arm's adapter for a ``--semantic`` choice (ImportError when missing)."""
    if choice is None:
        return default_embedding()
    adapter = load_embedding(choice)
    assert adapter is not None  # every --semantic choice names an adapter
    return adapter


def _fail(message: str, status: int = 1) -> int:
    print(f"recallbound: {one_line(redact(message))}", file=sys.stderr)  # a file name cannot forge
    return status


def _forwarded(args: argparse.Namespace) -> list[str]:
    """The options a second process needs to evaluate the same scenarios the same way."""
    forwarded = ["--scenarios", str(args.scenarios), "--out", str(args.out),
                 "--backend", args.backend, "--seed", str(args.seed),
                 "--arms", ",".join(arm.value for arm in args.arms)]
    if args.semantic is not None:
        forwarded += ["--semantic", args.semantic]
    if args.limit is not None:
        forwarded += ["--limit", str(args.limit)]
    return forwarded


def _second_process(args: argparse.Namespace) -> Callable[[int], str]:
    """Runs the first ``n`` scenarios in another process with another ``PYTHONHASHSEED``
    and returns its ranking digest."""

    def digest(n: int) -> str:
        env = dict(os.environ)
        env["PYTHONHASHSEED"] = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
        done = subprocess.run(
            [sys.executable, "-m", "plugin.evaluation", *_forwarded(args),
             "--digest-only", str(n)],
            capture_output=True, text=True, env=env, check=False,
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or ["no output"]
            raise EvaluationError(f"the determinism check's second process failed: {lines[-1]}")
        return done.stdout.strip()

    return digest


def main(args: argparse.Namespace, command_line: Sequence[str] | None = None) -> int:
    """Run ``recallbound evaluate`` with parsed ``args``; returns the exit status.

    ``command_line`` is what the report's provenance records (default: ``sys.argv``, its
    program reduced to its file name).

    Errors print one ``recallbound: ...`` line and return 1 (bad input, a missing model, a
    failed determinism check); a file that cannot be read as lines of scenarios (a line over
    :data:`~plugin.evaluation.scenarios.MAX_LINE_BYTES`, ``/dev/zero``) returns 2, as
    argparse's usage errors do (one line too) before this runs.
    """
    try:
        embedding = embedding_for(args.semantic)
    except (ImportError, FileNotFoundError, ValueError) as exc:
        return _fail(f"the {args.semantic or 'default'} semantic model is not available: {exc}")
    given: Path = args.scenarios
    try:
        path = args.scenarios = _readable_again(given, args.out)
    except ScenarioLineTooLongError as exc:
        return _fail(f"{given} is not a scenario file: {exc}", 2)
    except OSError as exc:
        return _fail(f"cannot use {exc.filename}: {exc.strerror}")
    committed = False
    try:
        status, committed = _evaluate(args, given, path, embedding, command_line)
    finally:
        if path != given and not committed:  # a pipe's copy outlives only a written report
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return status


def _evaluate(args: argparse.Namespace, given: Path, path: Path, embedding: EmbeddingAdapter,
              command_line: Sequence[str] | None) -> tuple[int, bool]:
    """Evaluate ``path`` (what ``given`` named, or its copy); returns the exit status and
    whether the outputs were written."""
    try:
        total = count_scenario_lines(path)
    except ScenarioLineTooLongError as exc:
        return _fail(f"{given} is not a scenario file: {exc}", 2), False
    except OSError as exc:
        return _fail(f"cannot use {exc.filename}: {exc.strerror}"), False
    try:
        keep = sample_indices(total, args.limit, args.seed)
        if args.digest_only is not None:
            return _digest_only(args, path, embedding, keep), False
        args.out.mkdir(parents=True, exist_ok=True)
        origin = provenance(path, embedding.name, list(command_line) if command_line is not None
                            else [Path(sys.argv[0]).name, *sys.argv[1:]])
    except OSError as exc:
        return _fail(f"cannot use {exc.filename}: {exc.strerror}"), False
    progress = None if args.quiet else Progress(len(keep) if keep is not None else total).advance
    # Every output is written beside its place and moved there only once the whole run
    # succeeded: a failed or interrupted run leaves the previous run's files as they were
    # (never a mix of the two), and an input read from the output folder is never truncated.
    with Outputs(args.out) as outputs:
        try:
            with outputs.open("rankings.jsonl") as rankings:
                report = run(path, embedding=embedding, ks=args.k,
                             determinism=args.determinism, resamples=args.resamples,
                             progress=progress, backend=args.backend, keep=keep,
                             rankings=rankings, second_process=_second_process(args),
                             arms=args.arms)
        except InvalidScenarioError as exc:
            return _fail(f"{given}: {exc}"), False
        except (RecallboundError, OSError) as exc:
            return _fail(f"evaluation failed: {exc}"), False
        if not report["scenarios"]:  # nothing to report on: no run leaves an empty report
            return _fail(f"{given} holds no scenario (only blank or corpus lines)"), False
        report = {"provenance": {**origin, "limit": args.limit,
                                 "seed": args.seed if args.limit is not None else None},
                  **report}
        with outputs.open("report.json") as out:
            out.write(json.dumps(report, indent=2) + "\n")
        with outputs.open("report.md") as out:
            out.write("# recallbound evaluate\n\n" + tables(report, markdown=True))
        try:
            write_chart(report, outputs.path("chart.png"))
        except ImportError:
            print("chart.png not written: install the evaluate extra (matplotlib)",
                  file=sys.stderr)
        outputs.commit()
    sys.stdout.write(tables(report, markdown=False))
    if report["determinism"]["identical"] is False:
        return _fail("determinism check failed: a second process ranked differently"), True
    return 0, True


def _readable_again(path: Path, out: Path) -> Path:
    """``path``; for a pipe (``/dev/stdin``, ``<(zcat scenarios.jsonl.gz)``), which can be read
    only once, a copy of what it held, in a new file of ``out`` (``scenarios-*.jsonl``, never
    one that exists): the file is read more than once (counted, hashed, evaluated, and again
    by the determinism check)."""
    try:
        if stat.S_ISREG(path.stat().st_mode):
            return path
    except OSError:
        return path  # counting it names the error
    out.mkdir(parents=True, exist_ok=True)
    with path.open("rb") as source, tempfile.NamedTemporaryFile(
            "wb", dir=out, prefix="scenarios-", suffix=".jsonl", delete=False) as target:
        try:
            for line in bounded_lines(source):  # /dev/zero ends at its first line's bound
                target.write(line)
        except BaseException:
            os.unlink(target.name)
            raise
    return Path(target.name)


def _digest_only(args: argparse.Namespace, path: Path, embedding: EmbeddingAdapter,
                 keep: frozenset[int] | None) -> int:
    """The determinism check's second process: print the ranking digest of the first
    ``--digest-only`` scenarios."""
    evaluator = Evaluator(embedding=embedding, cells=cells_for(args.arms))
    try:
        report = anyio.run(
            lambda: evaluator.evaluate(itertools.islice(selected_scenarios(path, keep),
                                                        args.digest_only)),
            backend=args.backend,
        )
    except InvalidScenarioError as exc:
        return _fail(f"{path}: {exc}")
    except RecallboundError as exc:
        return _fail(f"evaluation failed: {exc}")
    print(ranking_digest(report.rows))
    return 0


def cli(argv: Sequence[str] | None = None, *, prog: str = "recallbound evaluate") -> int:
    """``python -m plugin.evaluation ...``: the same command as ``recallbound evaluate``."""
    parser = configure(argparse.ArgumentParser(prog=prog))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # usage errors: argparse printed them already
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return main(args, [*shlex.split(prog), *(sys.argv[1:] if argv is None else argv)])
    except KeyboardInterrupt:
        return _fail("interrupted")


if __name__ == "__main__":
    sys.exit(cli())
