"""The README's test command needs nothing the README does not name: every program the test
suite starts by name (not the interpreter running it) is named in README.md, so a reader knows
what the command needs, and what it does to the machine, before running it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTERS = frozenset({"run", "Popen", "call", "check_call", "check_output", "which"})
"""``subprocess``'s ways to start a program, and ``shutil.which`` that looks one up."""
KNOWN = frozenset({"git"})
"""Programs a test uses only when they are there: git lists the files of a checkout, and the
tree on disk is read without it."""


def programs_started(source: str) -> set[str]:
    """The programs ``source`` starts (or looks up) by a literal name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in STARTERS and isinstance(node.func.value, ast.Name)
                and node.func.value.id in {"subprocess", "shutil"} and node.args):
            continue
        first = node.args[0]
        if isinstance(first, ast.List) and first.elts:
            first = first.elts[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            found.add(Path(first.value).name)
    return found


def test_the_readme_names_every_program_the_tests_start() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    started = set().union(*(programs_started(path.read_text(encoding="utf-8"))
                            for path in (ROOT / "tests").rglob("*.py")))
    assert {"pgbouncer", "pg_isready"} <= started  # the scan sees what the tests start
    assert sorted(name for name in started - KNOWN if f"`{name}`" not in readme) == []
