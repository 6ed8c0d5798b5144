"""Run every benchmark module: ``python -m bench [control|round|stress|...]``.

Each module runs with its default (CI-sized) options; the heavier sizes are flags of the
module itself, e.g. ``python -m bench.bench_round --sizes 1000,10000,100000 --keep DIR``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import time
import traceback

import anyio

MODULES = (
    "bench_control", "bench_group_commit", "bench_planning", "bench_hooks", "bench_telemetry",
    "bench_store", "bench_round", "bench_stress", "bench_postgres", "bench_adapter_pydantic_ai",
    "bench_adapter_langchain", "bench_adapter_openai_agents", "bench_mcp", "bench_words",
    "bench_minilm", "bench_embed_missing", "bench_containment", "bench_listing",
)


def run(name: str) -> bool:
    """Run one bench module's ``main()``; False if it failed (the others still run)."""
    qualified = f"bench.{name}"
    try:
        module = importlib.import_module(qualified)
    except ModuleNotFoundError as exc:
        if exc.name != qualified:
            raise  # the module exists but something it imports is missing: say so
        print(f"({qualified}: not present, skipped)")
        return True
    main = getattr(module, "main", None)
    if main is None:
        print(f"({qualified}: no main(), skipped)")
        return True
    # The load average beside every module's figures: the machine may be shared.
    print(f"== {qualified}   (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    start = time.perf_counter()
    argv, sys.argv = sys.argv, [qualified]  # a module parsing sys.argv sees no options
    try:
        if inspect.iscoroutinefunction(main):
            anyio.run(main)
        else:
            main()
    except Exception:
        traceback.print_exc()
        print(f"   ({qualified} FAILED)\n")
        return False
    finally:
        sys.argv = argv
    print(f"   ({time.perf_counter() - start:.1f} s)\n")
    return True


def main(argv: list[str]) -> None:
    wanted = [a if a.startswith("bench_") else f"bench_{a}" for a in argv] or list(MODULES)
    unknown = [name for name in wanted if name not in MODULES]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; choose from {list(MODULES)}")
    failed = [name for name in wanted if not run(name)]
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
