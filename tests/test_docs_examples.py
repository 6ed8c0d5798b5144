"""Every Python block in README.md and docs/*.md, and every example in examples/, is a program
that runs: twice in a row (each run mints its own run id, or says why its id is fixed), printing
the same both times but for run ids, times and durations, from an empty temporary folder (so
nothing is written into the repository), in a fresh interpreter as a user who pasted it would
run it.

The blocks are found by pytest-examples (``find_examples``): every ``py``/``python`` fence of
every page, a page added to docs/ included; ``tests/test_docs_blocks_collected.py`` checks,
reading every fence itself, that none is missed or cut short. A block that must not run is
fenced as ``text``, and the paragraph above it says it is not run by the test suite and why.
A block that needs PostgreSQL says so, and runs against the test server
(``RECALLBOUND_TEST_PG_DSN``, given to the block as ``DATABASE_URL``, with a fresh schema as
``LEDGER_SCHEMA``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_examples import CodeExample, find_examples

from ._pg import DSN, fresh_schema

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md",
         *sorted(p for p in (ROOT / "docs").rglob("*.md") if not p.name.startswith("_"))]
"""README and every page of the documentation site (drafts, ``_*.md``, are not published)."""
BLOCKS = list(find_examples(*PAGES))
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
NEEDS_PYTHON_311 = ("pydantic_ai", "langchain", "langgraph", "llama_index")
"""What the test extra installs on Python 3.11+ only (see setup.cfg)."""


def _installed_here(source: str) -> bool:
    """Whether a program's frameworks are installed on this interpreter (the test extra
    brings pydantic-ai, LangChain, LangGraph and LlamaIndex on Python 3.11+ only)."""
    return sys.version_info >= (3, 11) or not any(
        f"from {name}" in source or f"import {name}" in source for name in NEEDS_PYTHON_311)


RUNNABLE_BLOCKS = [block for block in BLOCKS if _installed_here(block.source)]
RUNNABLE_EXAMPLES = [p for p in EXAMPLES if _installed_here(p.read_text(encoding="utf-8"))]
RUNS = 2
VARYING = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\d+\.\d+")
"""What may differ between two runs' output: a fresh run id (a uuid), a time or a duration."""


def _env(tmp_path: Path, schema: str | None = None) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("RECALLBOUND_") or name.startswith("RECALLBOUND_TEST_")}
    # The configuration a block reads is its own (nothing from the machine's environment), and
    # no run may reach the network. PATH is left as it is: a block that needs the
    # `recallbound` command by name would fail for a user whose environment is not activated.
    env["DATABASE_URL"] = DSN
    if schema is not None:
        env["LEDGER_SCHEMA"] = schema
    env["OPENAI_API_KEY"] = ""
    env["HOME"] = str(tmp_path)
    return env


def _run(argv: list[str], folder: Path, what: str, schema: str | None = None) -> str:
    outputs = []
    for attempt in range(1, RUNS + 1):
        done = subprocess.run(argv, cwd=folder, env=_env(folder, schema), capture_output=True,
                              text=True, timeout=300, check=False)
        assert done.returncode == 0, f"{what}, run {attempt}:\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    first, *again = (VARYING.sub("#", output) for output in outputs)
    assert again == [first] * len(again), f"{what} printed something else when run again:\n" + \
        "\n----\n".join(outputs)
    return outputs[-1]


def _repository_files() -> set[Path]:
    """The files where a program run from the wrong folder would leave its ledger or store."""
    return {path for folder in (ROOT, ROOT / "docs", ROOT / "examples")
            for path in folder.iterdir()}


def _block_id(block: CodeExample) -> str:
    return f"{block.path.relative_to(ROOT)}:{block.start_line}"


@pytest.mark.parametrize("block", RUNNABLE_BLOCKS, ids=_block_id)
def test_a_documented_program_runs_twice(block: CodeExample, tmp_path: Path) -> None:
    before = _repository_files()
    script = tmp_path / "example.py"
    script.write_text(block.source, encoding="utf-8")
    what = f"{block.path.name}:{block.start_line}"
    if "DATABASE_URL" in block.source:  # it needs PostgreSQL: a schema of its own, dropped after
        with fresh_schema("docs") as schema:
            _run([sys.executable, str(script)], tmp_path, what, schema)
    else:
        _run([sys.executable, str(script)], tmp_path, what)
    assert _repository_files() <= before  # it wrote nothing into the repository


@pytest.mark.parametrize("example", RUNNABLE_EXAMPLES, ids=lambda p: p.name)
def test_an_example_runs_twice(example: Path, tmp_path: Path) -> None:
    before = _repository_files()
    _run([sys.executable, str(example)], tmp_path, example.name)
    assert _repository_files() <= before


def test_every_example_makes_a_fresh_run_id_or_says_why_not() -> None:
    for source in [*(p.read_text(encoding="utf-8") for p in EXAMPLES),
                   *(block.source for block in BLOCKS)]:
        if "run_id" not in source:
            continue
        assert "uuid" in source or "fixed run id" in source, source[:300]
