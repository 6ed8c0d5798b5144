"""Evaluation scenarios: the evaluator's input, one JSON object a line (the
format is documented on the evaluation page).

:func:`load_scenarios` reads any such file: UTF-8 text, one scenario a line, blank lines
skipped. Everything is checked when read, so a malformed file fails here with an
:class:`InvalidScenarioError` naming the line and the field, never later inside a search.
Beyond the JSON shape, a scenario must be coherent: ids unique within it, every ``relevant``
and ``must_not`` id naming one of its items, no relevant item that the scenario's principal
could never see, no item both relevant and forbidden.

A file may define a corpus once and reference it from many scenarios: a line
``{"corpus": "c1", "memories": [...], "people": [...]}`` defines corpus ``c1``, and a scenario
line with ``"corpus": "c1"`` (and no ``memories`` of its own, or only extra ones) uses its
memories and people. A corpus is defined before the lines that use it, so
:func:`iter_scenarios` reads a file line by line and never holds more than its corpora and
the current scenario. The old form (every scenario carrying its memories) stays readable.
"""
from __future__ import annotations

import os
from collections.abc import Generator, Iterable, Iterator, Mapping
from typing import BinaryIO

from .scenario_parsing import corpus_of, decode, scenario_of
from .scenario_values import GRADES as GRADES
from .scenario_values import InvalidScenarioError as InvalidScenarioError
from .scenario_values import Scenario as Scenario
from .scenario_values import ScenarioBelief as ScenarioBelief
from .scenario_values import ScenarioCorpus as ScenarioCorpus
from .scenario_values import ScenarioCorrection as ScenarioCorrection
from .scenario_values import ScenarioMemory as ScenarioMemory
from .scenario_values import ScenarioPerson as ScenarioPerson

__all__ = [
    "MAX_LINE_BYTES", "ScenarioLineTooLongError", "bounded_lines",
    "InvalidScenarioError",
    "Scenario",
    "ScenarioCorpus",
    "ScenarioBelief",
    "ScenarioCorrection",
    "ScenarioMemory",
    "ScenarioPerson",
    "iter_scenarios",
    "load_scenarios",
    "parse_scenarios",
    "stream_scenarios",
]

class ScenarioLineTooLongError(InvalidScenarioError):
    """A line of the scenario file is longer than :data:`MAX_LINE_BYTES` (``/dev/zero`` is one
    endless line): the file cannot be read as a scenario file at all."""


MAX_LINE_BYTES = 64 * 1024 * 1024
"""The longest line of a scenario file (a corpus line holds many memories); longer is an error,
read no further than the bound."""


def bounded_lines(file: BinaryIO) -> Iterator[bytes]:
    """The lines of a binary file, each read no further than :data:`MAX_LINE_BYTES` + 1 bytes;
    a longer one raises :class:`ScenarioLineTooLongError` naming its line."""
    limit = MAX_LINE_BYTES
    number = 0
    while True:
        line = file.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) > limit and not (len(line) == limit + 1 and line.endswith(b"\n")):
            raise ScenarioLineTooLongError(
                f"the line is longer than {limit:,} bytes", line=number)
        yield line


def parse_scenarios(text: bytes | str, *, first_line: int = 1) -> list[Scenario]:
    """Parse JSONL text: one scenario (or corpus) a non-blank line; see :func:`iter_scenarios`.

    ``bytes`` are decoded line by line, so bytes that are not UTF-8 are reported with their
    line number. A UTF-8 byte-order mark at the start is ignored.
    """
    raw_lines: list[bytes | str]
    if isinstance(text, (bytes, bytearray)):
        raw_lines = list(bytes(text).split(b"\n"))
    elif isinstance(text, str):
        raw_lines = list(text.split("\n"))
    else:
        raise TypeError(f"text must be bytes or str, got {type(text).__name__}")
    return list(iter_scenarios(raw_lines, first_line=first_line))


def iter_scenarios(
    lines: Iterable[bytes | str], *, first_line: int = 1
) -> Iterator[Scenario]:
    """Scenarios from JSONL lines, one at a time, resolving corpus references.

    Scenario ids are unique across the lines, corpus ids too; a corpus is defined before the
    scenarios that name it. A byte-order mark on the first line is ignored. Raises
    :class:`InvalidScenarioError` naming the line for anything malformed.
    """
    corpora: dict[str, ScenarioCorpus] = {}
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=first_line):
        if number == first_line:
            raw = (
                raw.removeprefix(b"\xef\xbb\xbf")
                if isinstance(raw, bytes)
                else raw.removeprefix("\ufeff")
            )
        if not raw.strip():
            continue
        try:
            data = decode(raw)
            if isinstance(data, Mapping) and "corpus" in data and "id" not in data:
                corpus = corpus_of(data)
                if corpus.id in corpora:
                    raise InvalidScenarioError(
                        f"corpus {corpus.id!r} is already defined", field="corpus"
                    )
                corpora[corpus.id] = corpus
                continue
            scenario = scenario_of(data, corpora)
        except InvalidScenarioError as exc:
            raise exc.at_line(number) from None
        if scenario.id in seen:
            raise InvalidScenarioError(
                f"scenario id {scenario.id!r} was already used on line {seen[scenario.id]}",
                field="id",
                line=number,
            )
        seen[scenario.id] = number
        yield scenario


def load_scenarios(path: str | os.PathLike[str]) -> list[Scenario]:
    """Read a whole scenario file (JSONL, UTF-8); see :func:`stream_scenarios` for large ones.

    Raises :class:`InvalidScenarioError` for a malformed line and ``OSError`` when the file
    cannot be read.
    """
    return list(stream_scenarios(path))


def stream_scenarios(path: str | os.PathLike[str]) -> Generator[Scenario, None, None]:
    """Read a scenario file line by line (see :func:`iter_scenarios`); the file stays open
    while the iterator is consumed."""
    with open(path, "rb") as file:
        yield from iter_scenarios(bounded_lines(file))
