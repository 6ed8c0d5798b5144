"""The repository speaks of itself alone, and its two documented commands stay the ones CI runs.

Every tracked text file is read: code, comments, docstrings, tests, examples, benches, the
README and the documentation site. None may send a reader to a file or a document that is not
in the repository (a sibling folder, a design or style file kept elsewhere, a tracker's issue,
a decision record). The rule is stated where it applies instead.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
THIS_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()

# Each pattern names one way a text points outside the repository.
OUTSIDE = {
    "a sibling folder (../shared)": re.compile(r"\.\./shared\b"),
    "a design or style file kept elsewhere": re.compile(
        r"\b(?:DESIGN|STYLE)\b|(?i:\b(?:design|style)\.md\b)"
    ),
    "a decision record": re.compile(r"\bADRs?\b|\bADR-\d+"),
    "a tracker's issue by number": re.compile(r"\bissues?\s*(?:#|no\.?\s*)?\d+", re.IGNORECASE),
    "a tracker's issue": re.compile(
        r"\b(?:the|an|this|each)\s+issue(?:'s)?\b"
        r"|\(issue\b",
        re.IGNORECASE,
    ),
    "the person who merges branches": re.compile(r"\bthe\s+integrator\b", re.IGNORECASE),
}


def _tracked_files() -> list[str]:
    """The repository's files: git's index when this is a checkout, else the tree on disk."""
    if (ROOT / ".git").exists():
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        return [name for name in out.decode().split("\0") if name]
    skip = {".git", ".venv", ".tox", "site", "build", "dist", "__pycache__"}
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
        for name in files:
            found.append((Path(folder) / name).relative_to(ROOT).as_posix())
    return found


def _text(name: str) -> str | None:
    data = (ROOT / name).read_bytes()
    if b"\0" in data:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def outside_references(text: str) -> list[str]:
    """Every place in ``text`` that points outside the repository, with what it points at."""
    found = []
    for what, pattern in OUTSIDE.items():
        for match in pattern.finditer(text):  # whole text: a phrase may span a line break
            number = text.count("\n", 0, match.start()) + 1
            found.append(f"{number}: {what}: {match.group(0)!r}")
    return sorted(found, key=lambda entry: int(entry.split(":", 1)[0]))


@pytest.mark.parametrize(
    "line",
    [
        "Where ../shared/DESIGN.md left a choice",
        "see DESIGN's public API",
        "one contract suite per interface (STYLE.md)",
        "Query planning (ADR-0193): one query",
        "in ADR order",
        "Target (issue #10): semantic p50",
        "The hooks against hostile input (issue 7), on both loops.",
        "runs the issue's size",
        "the sizes the issue names",
        "the default, the\nissue's full size",
        "a figure an issue set a bound on",
        "Attacks on the boundary (issue: harden the enforcement boundary).",
        "ask the integrator",
    ],
)
def test_each_kind_of_outside_reference_is_caught(line: str) -> None:
    assert outside_references(line), line


@pytest.mark.parametrize(
    "line",
    [
        "Secret rollover for the sync daemon: issue new keys in the vault",
        "Root cause of the refund worker memory leak issue: a race",
        "Only RecallAllowance.round() issues one, after its reservation committed.",
        "The recall allowance: durable rounds that issue permits.",
        "the monotonic time elapsed since issue exceeds what was left at issue",
        "the full design document",
        "a shared, loaded machine",
    ],
)
def test_ordinary_words_are_not_outside_references(line: str) -> None:
    assert outside_references(line) == []


def test_no_tracked_file_refers_outside_the_repository() -> None:
    offending = {}
    for name in _tracked_files():
        if name == THIS_FILE or not (ROOT / name).is_file():
            continue
        text = _text(name)
        if text is None:
            continue
        found = outside_references(text)
        if found:
            offending[name] = found
    assert offending == {}


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```sh\n(.*?)```", readme, re.DOTALL)
    assert block is not None, "README.md opens with a ```sh block holding its two commands"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_the_two_commands() -> None:
    demo, tests = _readme_commands()
    assert demo.startswith("python3 -m venv .venv && .venv/bin/pip install -e '.[")
    assert demo.endswith(" && .venv/bin/recallbound demo")
    assert tests == (
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
    )


def test_ci_ends_with_exactly_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").rstrip("\n").splitlines()
    assert ci[-1] == _readme_commands()[1]


def test_ci_builds_the_documentation_strictly() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install --quiet -e '.[docs]'" in ci
    assert re.search(r"^(?:\w+=\S* )*\.venv/bin/mkdocs build --strict\b", ci, re.MULTILINE)


def test_readme_is_a_landing_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250


# The pages whose examples this module keeps honest (other pages keep their own).
EXAMPLE_PAGES = ("README.md", "docs/index.md", "docs/getting-started.md", "docs/behaviour.md",
                 "docs/performance.md")


@pytest.mark.parametrize("page", EXAMPLE_PAGES)
def test_python_examples_are_valid_python(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    for number, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.DOTALL)):
        # Examples may use `async with` and `await` at the top level, as in an async REPL.
        compile(block, f"{page} example {number}", "exec",
                flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)


def test_the_readme_example_brings_its_own_retriever() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (example,) = [block for block in re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
                  if "SimpleRetriever" in block]
    tree = ast.parse(example)
    imported = {(node.module, alias.name) for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert {("plugin", "SimpleRetriever"), ("plugin", "Evidence"),
            ("runtime_hooks.bootstrap", "RecallConfig"),
            ("runtime_hooks.bootstrap", "open_hooks")} <= imported
    search = next(node for node in ast.walk(tree)
                  if isinstance(node, ast.AsyncFunctionDef) and node.name == "search")
    assert [arg.arg for arg in search.args.args] == ["request"]
    assert len(example.splitlines()) <= 25


def test_the_readme_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (example,) = [block for block in re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
                  if "SimpleRetriever" in block]
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env = {name: value for name, value in env.items()
           if not name.startswith("RECALLBOUND_") or name.startswith("RECALLBOUND_TEST_")}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "[memory m1]" in done.stdout and "[memory m2]" in done.stdout
    assert (tmp_path / "recall-ledger.db").exists()
    assert not (tmp_path / "unused.db").exists()  # your own retriever: the store is not opened


MAX_SOURCE_LINES = 400


def test_no_source_file_is_over_the_line_limit() -> None:
    # One question per module: a file that outgrows the limit is split along its seams.
    over = sorted(
        (path.relative_to(ROOT).as_posix(), lines)
        for package in ("plugin", "runtime_hooks")
        for path in (ROOT / package).rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_SOURCE_LINES
    )
    assert not over, f"over {MAX_SOURCE_LINES} lines: " + ", ".join(
        f"{name} ({lines})" for name, lines in over
    )
