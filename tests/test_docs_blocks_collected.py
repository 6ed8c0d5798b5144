"""Every Python block of README.md and docs/ is one the docs suite runs, whole.

``tests/test_docs_examples.py`` runs the blocks pytest-examples finds. This module reads every
fence of every page with a parser of its own (CommonMark's rule: a run of three or more
backticks or tildes, any indent, closed by a run of the same character at least as long) and
checks the runner against it, so a Python block the runner would miss (a ``~~~python`` fence,
a fence of four backticks, a block cut short by three backticks inside it, an interactive
``>>>`` session) fails here instead of going unrun. A block that must not run is fenced as
``text``, and the paragraph above it says it is not run by the test suite and why.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pytest_examples import find_examples

from .test_docs_examples import BLOCKS, PAGES, ROOT

PYTHON = frozenset({"python", "py", "python3", "py3", "pycon", "ipython", "python-repl"})
"""The fence languages that mean Python (highlighters' names for it)."""
NOT_RUN = "not run by the test suite"
"""What the paragraph above a Python program fenced as something else says."""

_OPEN = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Fence:
    line: int
    """The 1-based line of the opening fence."""
    language: str
    body: str
    """The lines between the fences, without the opening fence's indent."""
    above: str
    """The paragraph just above the block."""


def fences(text: str) -> Iterator[Fence]:
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        opening = _OPEN.match(lines[number])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            number += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}} *$")
        end = next((n for n in range(number + 1, len(lines)) if closing.match(lines[n])),
                   len(lines))
        words = opening["info"].strip().lstrip("{").lstrip(".").split()
        above = []
        for line in reversed(lines[:number]):
            if above and not line.strip():
                break
            above.insert(0, line)
        margin = " " * indent  # a line indented less keeps what indent it has
        body = [line.removeprefix(margin) if line.startswith(margin) else line.lstrip()
                for line in lines[number + 1:end]]
        yield Fence(number + 1, words[0].lower().rstrip("}") if words else "",
                    "".join(f"{line}\n" for line in body), " ".join(above))
        number = end + 1


def _is_program(source: str) -> bool:
    """Python that imports something: a program, not a line of output or a shell command."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(node, ast.Import | ast.ImportFrom) for node in ast.walk(tree))


def unrun(page: Path, collected: list[tuple[int, str]]) -> list[str]:
    """The Python blocks of ``page`` that the runner would not run whole, each with why.
    ``collected`` is what the runner found on the page: (opening line, source)."""
    found = dict(collected)
    missing = []
    for fence in fences(page.read_text(encoding="utf-8")):
        where = f"{page.name}:{fence.line}"
        if fence.language in PYTHON:
            if fence.body.lstrip().startswith(">>>"):
                missing.append(f"{where}: an interactive session, which no runner runs: "
                               f"write it as a program")
            elif fence.line not in found:
                missing.append(f"{where}: a ```{fence.language} block the runner did not "
                               f"collect: fence it with three backticks")
            elif textwrap.dedent(found[fence.line]) != textwrap.dedent(fence.body):
                missing.append(f"{where}: the runner collected only part of the block")
        elif _is_program(fence.body) and NOT_RUN not in " ".join(fence.above.split()):
            missing.append(f"{where}: a Python program fenced as {fence.language or 'plain'} "
                           f"whose paragraph above does not say it is {NOT_RUN}")
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_the_runner_runs_every_python_block_of_a_page_whole(page: Path) -> None:
    collected = [(block.start_line, block.source) for block in BLOCKS if block.path == page]
    assert unrun(page, collected) == []


def test_a_python_block_the_runner_would_miss_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent('''\
        ```python title="runs.py"
        print(1)
        ```

        !!! note
            ```py
            print(2)
            ```

        ~~~python
        print(3)
        ~~~

        ````python
        print(4)
        ````

        ```python
        print(5)
        FENCE = "```"
        print(6)
        ```

        ```pycon
        >>> print(7)
        7
        ```

        ```text
        import os
        ```

        This one is not run by the test suite: it needs a model provider's key.

        ```text
        import openai
        ```
        '''), encoding="utf-8")
    collected = [(block.start_line, block.source) for block in find_examples(page)]
    assert [entry.split(":")[1] for entry in unrun(page, collected)] == [
        "10", "14", "18", "24", "29"]
