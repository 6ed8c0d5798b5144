"""``recallbound demo`` and ``python -m runtime_hooks demo``; ``recallbound evaluate``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from .bootstrap import Semantic
from .demo import run_demo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="recallbound", description="Bounded, durable memory recall for agent runtimes."
    )
    commands = parser.add_subparsers(dest="command")
    demo = commands.add_parser("demo", help="run the scripted end-to-end demo")
    demo.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    demo.add_argument("--data-dir", type=Path, default=None,
                      help="keep the ledger and store here (default: a temporary folder)")
    demo.add_argument("--semantic", choices=[s.value for s in Semantic], default=None,
                      help="embedding for the semantic arm (default: wordllama if installed)")
    from plugin.evaluation import command as evaluation

    evaluation.configure(commands.add_parser(
        "evaluate", help="evaluate query planning and ranking on a scenario file"))
    args = parser.parse_args(argv)
    if args.command == "evaluate":
        return evaluation.main(args)
    if args.command is None:  # plain `python -m runtime_hooks` runs the demo
        args = parser.parse_args(["demo", *(argv or [])])
    semantic = Semantic(args.semantic) if args.semantic else None
    anyio.run(lambda: run_demo(data_dir=args.data_dir, semantic=semantic), backend=args.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
