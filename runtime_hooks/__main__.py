"""The ``recallbound`` command: ``demo``, ``evaluate``, ``ledger runs|show|prune|check``,
``memory add|import|list|forget``, ``config show``, ``mcp``.

Bad input (a missing file, a foreign database, an unknown run, a bad setting) prints one
``recallbound: ...`` line on stderr and exits 1; a usage error exits 2 (argparse). No
traceback reaches the operator.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

import anyio

from plugin.control import Clock, SystemClock
from plugin.control.dsn import redact
from plugin.errors import RecallboundError

from . import config_cli, ledger_cli, memory_cli
from .bootstrap import Semantic
from .demo import run_demo


def version() -> str:
    """The installed distribution's version (``unknown`` when run from an uninstalled tree)."""
    try:
        return importlib.metadata.version("recallbound")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors never show a password: they quote the command
    line (``unrecognized arguments: --ledger postgresql://app:secret@...``). Its subcommands'
    parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {redact(message)}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="recallbound", description="Bounded, durable memory recall for agent runtimes."
    )
    parser.add_argument("--version", action="store_true",
                        help="print the installed version and exit")
    parser.add_argument("--store", metavar="PATH", dest="top_store", default=None,
                        help="for the memory command: the store file (as after `memory`)")
    from plugin.evaluation import command as evaluation

    commands = parser.add_subparsers(dest="command")
    demo = commands.add_parser("demo", help="run the scripted end-to-end demo")
    demo.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    demo.add_argument("--data-dir", type=evaluation.given_path, default=None,
                      help="keep the ledger and store here (default: a temporary folder)")
    demo.add_argument("--semantic", choices=[s.value for s in Semantic], default=None,
                      help="embedding for the semantic arm (default: auto, the best "
                           "installed: minilm with wordllama's words, else wordllama, else "
                           "minilm, else none)")
    evaluation.configure(commands.add_parser(
        "evaluate", help="evaluate query planning and ranking on a scenario file"))
    ledger_cli.add_commands(commands)
    memory_cli.add_commands(commands)
    config_cli.add_commands(commands)
    from .mcp import cli as mcp_cli  # the mcp extra; imported only to register the command

    mcp_cli.add_command(commands)
    return parser


def _tolerant(stream: TextIO) -> TextIO:
    """``stream``, writing what its encoding cannot hold (an emoji on a cp1252 console)
    escaped rather than failing after the command did its work."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        with contextlib.suppress(Exception):  # a stream that cannot change: left as it is
            reconfigure(errors="backslashreplace")
    return stream


def _open_closed_streams() -> None:
    """A process started with standard output or error closed (``recallbound ... >&-``) has
    ``sys.stdout`` or ``sys.stderr`` None: what would be written there is discarded, as into a
    pipe nobody reads, rather than failing every command with a traceback."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the process's own)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the process's own)


def _reader_gone(out: TextIO) -> int:
    """The reader of the output went away (``| head``): no error, nor one when Python flushes
    the closed pipe at exit; the status a shell reports for a command ended by SIGPIPE."""
    if out is sys.stdout:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


def main(
    argv: Sequence[str] | None = None,
    *,
    clock: Clock | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run one command; return its exit status (``clock``/``stdout``/``stderr`` for tests)."""
    _open_closed_streams()
    out = _tolerant(sys.stdout) if stdout is None else stdout
    err = _tolerant(sys.stderr) if stderr is None else stderr
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        if args.version:
            out.write(f"recallbound {version()}\n")
            return 0
        if args.top_store is not None:
            if args.command != "memory":
                parser.error("--store before the command is for the memory command only")
            if args.store is None:
                args.store = args.top_store
        if args.command is None:  # plain `python -m runtime_hooks` runs the demo
            args = parser.parse_args(["demo", *(argv or [])])
    except SystemExit as exit_:  # usage errors: argparse printed them already
        return exit_.code if isinstance(exit_.code, int) else 2
    except BrokenPipeError:  # ``--version`` into a closed pipe
        return _reader_gone(out)
    try:
        if args.command == "ledger":
            return ledger_cli.run(args, out, clock if clock is not None else SystemClock())
        if args.command == "memory":
            return memory_cli.run(args, out, err)
        if args.command == "config":
            return config_cli.run(args, out)
        if args.command == "mcp":
            from .mcp import cli as mcp_cli

            return mcp_cli.run(args, err)
        if args.command == "evaluate":
            from plugin.evaluation import command as evaluation

            return evaluation.main(args)
        semantic = Semantic(args.semantic) if args.semantic else None
        anyio.run(lambda: run_demo(data_dir=args.data_dir, semantic=semantic),
                  backend=args.backend)
        return 0
    except BrokenPipeError:
        return _reader_gone(out)
    except (RecallboundError, OSError) as exc:
        err.write(f"recallbound: {redact(ledger_cli.safe(exc))}\n")
        return 1
    except KeyboardInterrupt:
        err.write("recallbound: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
