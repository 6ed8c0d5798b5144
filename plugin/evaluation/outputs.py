"""The files of one evaluation run, written beside their places and moved there together."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


class Outputs:
    """The files one run writes in ``folder``, each first under a name of its own beside its
    place (``.report.partial-<token>.json``). :meth:`commit` moves them all into place, and
    removes an earlier run's file this run did not write (a chart without matplotlib); leaving
    the block without a commit removes what was written, so the folder keeps the earlier run's
    files as they were: never a mix of two runs, and an input read from the folder is never
    truncated while it is read."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._token = secrets.token_hex(4)
        self._written: dict[str, Path] = {}

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for partial in self._written.values():
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()

    def path(self, name: str) -> Path:
        """Where ``name`` is written until the commit (its suffix kept: a chart's format)."""
        final = Path(name)
        partial = self.folder / f".{final.stem}.partial-{self._token}{final.suffix}"
        self._written[name] = partial
        return partial

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[TextIO]:
        """``name`` open for writing text, until the commit under its partial name."""
        with self.path(name).open("w", encoding="utf-8") as file:
            yield file

    def commit(self) -> None:
        """Move every file written into place; an earlier run's file of a name this run
        registered but did not write is removed."""
        for name, partial in self._written.items():
            if partial.exists():
                os.replace(partial, self.folder / name)
            else:
                with contextlib.suppress(FileNotFoundError):
                    (self.folder / name).unlink()
        self._written.clear()
