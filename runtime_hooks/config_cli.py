"""``recallbound config show``: the effective configuration and where each value came from."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, TextIO

from .config import PRECEDENCE, load_config
from .ledger_cli import safe


def add_commands(commands: Any) -> None:
    """Register ``config show`` on the top-level subparsers."""
    config = commands.add_parser("config", help="the effective configuration")
    sub = config.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    show = sub.add_parser("show", help="print every setting and its source")
    show.add_argument("--config", metavar="FILE", default=None,
                      help="configuration file (default: $RECALLBOUND_CONFIG, then "
                           "recallbound.toml if present)")
    show.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Print the effective configuration; a bad value is a ConfigError (exit 1)."""
    loaded = load_config(args.config)
    from .mcp.shown import describe

    rows = [*loaded.describe(), *describe(loaded.file, os.environ)]
    file = None if loaded.file is None else str(loaded.file)
    if args.json:
        out.write(json.dumps({"file": file, "precedence": list(PRECEDENCE),
                              "settings": rows}, indent=2) + "\n")
        return 0
    out.write(f"configuration file: {safe(file) if file else '(none)'}\n"
              f"precedence: {' > '.join(PRECEDENCE)}\n")
    width = max(len(row["key"]) for row in rows)
    for row in rows:
        value = "(unset)" if row["value"] is None else json.dumps(row["value"])
        where = f"  [{safe(row['where'])}]" if row["where"] else ""
        mark = "  ! LOOSER than the default allowance" if row["looser"] else ""
        out.write(f"  {row['key']:<{width}}  {value:<24} {safe(row['source'])}{where}{mark}\n")
    return 0
