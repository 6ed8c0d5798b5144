"""Every ``recallbound`` command shown in a shell block of README.md or docs/ is one the
command's own parser accepts, as shown: a renamed or removed option fails here, not for the
reader who pastes it.

A synopsis line (``recallbound ledger [--ledger LOCATION] runs [--limit 20]``) is checked
twice: with none of its optional parts, and with all of them (the first of ``a|b``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from runtime_hooks.__main__ import _parser

from .test_docs_blocks_collected import fences
from .test_docs_examples import PAGES, ROOT

SHELL = frozenset({"", "sh", "bash", "console", "shell", "shell-session", "zsh"})
"""The fence languages of commands (a plain fence holds the command synopsis)."""
_PROGRAM = re.compile(r"^(?:\S*/)?recallbound$")
_RUNS_IT = re.compile(r"(?:^|[|&;]) *(?:\$ +)?(?:\S*/)?recallbound(?: |$)")
"""A line that runs the command (not one of its messages, ``recallbound: ...``)."""
_OPTIONAL = re.compile(r"\[([^\[\]]*)\]")


def _with_optionals(line: str) -> str:
    return _OPTIONAL.sub(lambda m: m.group(1).split("|")[0], line)


def _commands(line: str) -> list[list[str]]:
    """The argument lists of the ``recallbound`` commands on one shell line."""
    lexer = shlex.shlex(line.removeprefix("$ "), posix=True, punctuation_chars="|&;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in {"|", "||", "&&", ";", "&"}:
            commands.append([])
        else:
            commands[-1].append(token)
    return [command[1:] for command in commands if command and _PROGRAM.match(command[0])]


def documented_commands(page: Path) -> list[tuple[str, list[str]]]:
    shown = []
    for fence in fences(page.read_text(encoding="utf-8")):
        if fence.language not in SHELL:
            continue
        for offset, line in enumerate(fence.body.splitlines(), start=1):
            where = f"{page.relative_to(ROOT)}:{fence.line + offset}"
            if not _RUNS_IT.search(line) or "..." in line or "…" in line:
                continue  # not a command, or an elided one: nothing to parse
            variants = ([_OPTIONAL.sub("", line), _with_optionals(line)] if "[" in line
                        else [line])
            shown.extend((where, argv) for variant in variants for argv in _commands(variant))
    return shown


COMMANDS = [shown for page in PAGES for shown in documented_commands(page)]


def test_the_pages_show_commands() -> None:
    shown = {tuple(argv[:1]) for _, argv in COMMANDS}
    assert {("demo",), ("memory",), ("ledger",), ("mcp",), ("evaluate",), ("config",)} <= shown


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_documented_command_parses(where: str, argv: list[str]) -> None:
    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):
            parsed = _parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: recallbound {shlex.join(argv)}\n{usage.getvalue()}")
    assert isinstance(parsed, argparse.Namespace)


def test_a_command_the_parser_refuses_is_caught() -> None:
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        _parser().parse_args(_commands("recallbound memory lsit --principal u1 --scope p")[0])
    assert _commands("a | .venv/bin/recallbound demo --backend trio  # under trio") == [
        ["demo", "--backend", "trio"]]
