"""``python -m plugin.evaluation SCENARIOS.jsonl [--json OUT] [--semantic wordllama|hashing]``.

Prints the report table; ``--json`` also writes the full report (every scenario row). Exits 2
for a malformed scenario file or bad arguments, 1 when an environment cannot be built.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio

from plugin.errors import RecallboundError
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.embedding_choice import load_embedding

from .evaluator import Evaluator, Report, default_embedding
from .scenarios import InvalidScenarioError, load_scenarios


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m plugin.evaluation",
        description="Run the isolated evaluator: baseline and task_context query planning on "
        "the sparse, semantic and fused arms, under one recall allowance.",
    )
    parser.add_argument("scenarios", help="a JSONL scenario file (one JSON object a line)")
    parser.add_argument("--json", metavar="OUT", help="also write the full report as JSON")
    parser.add_argument(
        "--semantic",
        choices=("wordllama", "hashing"),
        help="the semantic arm's adapter (default: wordllama when installed, else hashing)",
    )
    parser.add_argument(
        "--backend", choices=("asyncio", "trio"), default="asyncio", help="the event loop"
    )
    return parser


def _embedding(choice: str | None) -> EmbeddingAdapter:
    if choice is None:
        return default_embedding()
    adapter = load_embedding(choice)
    assert adapter is not None  # every --semantic choice names an adapter
    return adapter


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        scenarios = load_scenarios(args.scenarios)
    except InvalidScenarioError as exc:
        print(f"{args.scenarios}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"cannot read {args.scenarios}: {exc}", file=sys.stderr)
        return 2
    try:
        embedding = _embedding(args.semantic)
    except (ImportError, FileNotFoundError) as exc:
        print(f"the {args.semantic} adapter is not available: {exc}", file=sys.stderr)
        return 2
    evaluator = Evaluator(embedding=embedding)

    async def run() -> Report:
        return await evaluator.evaluate(scenarios)

    try:
        report = anyio.run(run, backend=args.backend)
    except RecallboundError as exc:
        print(f"evaluation failed: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(report.format_table())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            file.write(report.to_json() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
