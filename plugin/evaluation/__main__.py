"""``python -m plugin.evaluation --scenarios FILE --out DIR ...``: the evaluation command.

The same command, options and output as ``recallbound evaluate``
(:mod:`plugin.evaluation.command`).
"""

from __future__ import annotations

import sys

from .command import cli

if __name__ == "__main__":
    sys.exit(cli(prog="python -m plugin.evaluation"))
