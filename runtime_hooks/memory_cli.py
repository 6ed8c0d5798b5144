"""``recallbound memory add|import|list|forget|embed``: write and manage memories from a shell.

The store is ``--store PATH`` (before the subcommand; before ``memory`` or after the
subcommand work too), else the configured ``store``, else
the default store, ``$XDG_DATA_HOME/recallbound/memory.db`` (``~/.local/share/...``), whose
folder is created on first use. A store given explicitly must sit in an existing folder;
``list``, ``forget`` and ``embed`` never create a store.
With a configured ``semantic`` embedding, writes compute their vectors too, and ``embed``
computes the vectors that model lacks: for memories written while ``semantic`` named another
model, or none (the semantic arm does not see them until then). It prints how many it
embedded; it is safe to interrupt and run again (each batch is committed).

``import FILE`` reads JSONL (``-`` is standard input): one ``{"text", "principal", "scope",
"id"?}`` object a line, blank lines skipped, each line read to a bound of 64 MiB (so
``/dev/zero`` is an error, never a ``MemoryError``). It is all or nothing: the first bad line
(longer than the bound, not UTF-8, not JSON or nested too deeply, a key repeated, not an
object, a bad or missing field, an id repeated in the file or held by another principal or
scope) is named with its number and nothing is written.

Bad input prints one ``recallbound: ...`` line on stderr and exits 2; ``forget`` of an id
that is not there exits 1. Stored text is printed escaped (no control or bidi character
reaches the terminal).
"""

from __future__ import annotations

import argparse
import codecs
import itertools
import json
import os
import sys
from collections.abc import Callable, Coroutine, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import anyio

from plugin import strict_json
from plugin.control import validate
from plugin.control.dsn import is_connection_string, redact, shown_location
from plugin.errors import RecallboundError
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.store import (
    InvalidMemoryError,
    MemoryIdTakenError,
    MemoryOwnershipError,
    MemoryStore,
    MemoryWrite,
)

from .ledger_cli import safe, safe_json

__all__ = ["add_commands", "default_store", "run"]

#: Exit status of bad input (a usage error's, as argparse gives it).
BAD_INPUT = 2
#: Exit status of ``forget`` when the memory was not there.
NOT_FOUND = 1
#: The longest line ``import`` reads (a memory's text is at most 64 KiB, escaped or not).
MAX_IMPORT_LINE_BYTES = 64 * 1024 * 1024


class MemoryInputError(RecallboundError, ValueError):
    """A ``memory`` command was given input it cannot use (the message says which and why)."""


def default_store() -> Path:
    """``$XDG_DATA_HOME/recallbound/memory.db``, or ``~/.local/share/recallbound/memory.db``
    (:func:`~runtime_hooks.mcp.cli.data_folder`: the folder the MCP server keeps its store
    in)."""
    from .mcp.cli import data_folder

    return data_folder(os.environ) / "memory.db"


def add_commands(commands: Any) -> None:
    """Register ``memory`` and its subcommands on the top-level subparsers."""
    memory = commands.add_parser(
        "memory", help="write, import, list, forget and embed memories",
        description="Write, import, list, forget and embed memories in the memory store.")
    memory.add_argument("--store", metavar="PATH", default=None,
                        help="the store file (default: the configured store, else "
                             f"{default_store()})")
    memory.add_argument("--config", metavar="FILE", default=None,
                        help="configuration file (default: $RECALLBOUND_CONFIG, then "
                             "recallbound.toml if present)")
    sub = memory.add_subparsers(dest="memory_command", required=True, metavar="COMMAND")

    add = sub.add_parser("add", help="remember one memory; prints its id")
    add.add_argument("text", metavar="TEXT")
    add.add_argument("--id", default=None, help="replace (or create) the memory with this id")
    importing = sub.add_parser(
        "import", help="remember every memory of a JSONL file, or none of them")
    importing.add_argument("file", metavar="FILE",
                           help='JSONL, one {"text", "principal", "scope", "id"?} a line; '
                                "- reads standard input")
    listing = sub.add_parser("list", help="the memories of one principal and scope, newest first")
    listing.add_argument("--json", action="store_true", help="print a JSON array")
    forget = sub.add_parser("forget", help="delete one memory from every index")
    forget.add_argument("id", metavar="ID")
    embed = sub.add_parser(
        "embed", help="compute the vectors the configured semantic model lacks")
    for parser in (add, listing, forget):
        parser.add_argument("--principal", required=True)
        parser.add_argument("--scope", required=True)
    for parser in (add, importing, listing, forget, embed):  # after the subcommand too
        parser.add_argument("--store", metavar="PATH", default=argparse.SUPPRESS,
                            help="the store file (as before the subcommand)")
        parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                            help="configuration file (as before the subcommand)")


def _store_path(args: argparse.Namespace, values: dict[str, Any]) -> Path:
    given = args.store if args.store is not None else values.get("store")
    if given is not None:
        # Checked before it becomes a Path, which would fold a URI's "//" and hide what it is.
        if isinstance(given, str) and is_connection_string(given):
            raise MemoryInputError(
                f"the memory store {shown_location(given)!r} is a connection string; the store "
                f"is a SQLite file: give its path")
        text = os.fspath(given)
        if text == ":memory:" or text.startswith("file:"):  # kept by no command, or folded
            raise MemoryInputError(
                f"the memory store {text[:40]!r} is not a file path; the command needs the "
                f"store's file: give its path")
        return Path(text)
    path = default_store()
    if args.memory_command in ("list", "forget", "embed"):  # never create a store or a folder
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MemoryInputError(f"cannot create the default store's folder "
                               f"{str(path.parent)!r}: {exc.strerror or exc}") from None
    return path


def _embedding(values: dict[str, Any]) -> EmbeddingAdapter | None:
    choice = values.get("semantic")
    if choice is None or str(getattr(choice, "value", choice)) == "none":
        return None
    from .bootstrap import Semantic, load_embedding

    return load_embedding(Semantic(getattr(choice, "value", choice)))


def _read_lines(name: str) -> list[tuple[int, MemoryWrite]]:
    """The file's memories with their line numbers; the first bad line raises."""
    if name == "-":
        if sys.stdin is None:  # started with standard input closed
            raise MemoryInputError("cannot read standard input: it is closed")
        return _parse_lines(sys.stdin.buffer, "standard input")
    try:
        with open(name, "rb") as stream:
            return _parse_lines(stream, name)
    except OSError as exc:
        raise MemoryInputError(f"cannot read {name!r}: {exc.strerror or exc}") from exc


def _bounded_lines(stream: BinaryIO, where: str) -> Iterator[tuple[int, bytes]]:
    """The stream's lines with their numbers, each read no further than
    :data:`MAX_IMPORT_LINE_BYTES` (``/dev/zero`` is one endless line)."""
    limit = MAX_IMPORT_LINE_BYTES
    for number in itertools.count(1):
        raw = stream.readline(limit + 1)
        if not raw:
            return
        if len(raw) > limit and not (len(raw) == limit + 1 and raw.endswith(b"\n")):
            raise MemoryInputError(
                f"{where} line {number}: the line is longer than {limit:,} bytes")
        yield number, raw


def _parse_lines(stream: BinaryIO, where: str) -> list[tuple[int, MemoryWrite]]:
    found: list[tuple[int, MemoryWrite]] = []
    for number, raw in _bounded_lines(stream, where):
        if number == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)  # an editor's byte-order mark
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MemoryInputError(f"{where} line {number}: not valid UTF-8") from None
        if not line.strip():
            continue
        try:
            value = strict_json.decode(line)
        except strict_json.StrictJsonError as exc:  # not JSON, nested too deeply, a repeated key
            raise MemoryInputError(f"{where} line {number}: {exc.reason}") from None
        try:
            found.append((number, MemoryWrite.from_dict(value)))
        except InvalidMemoryError as exc:
            raise MemoryInputError(f"{where} line {number}: {exc}") from None
    seen: dict[str, int] = {}
    for number, memory in found:
        if memory.id is not None:
            if memory.id in seen:
                raise MemoryInputError(
                    f"{where} line {number}: repeats the id {memory.id!r} of line "
                    f"{seen[memory.id]}")
            seen[memory.id] = number
    return found


async def _add(store: MemoryStore, args: argparse.Namespace, out: TextIO) -> int:
    memory_id = await store.remember(
        args.text, principal=args.principal, scope=args.scope, id=args.id)
    out.write(f"{safe(memory_id)}\n")
    return 0


async def _import(
    store: MemoryStore, lines: list[tuple[int, MemoryWrite]], where: str, out: TextIO
) -> int:
    try:
        ids = await store.remember_many(memory for _, memory in lines)
    except (MemoryOwnershipError, MemoryIdTakenError) as exc:
        number = next(n for n, memory in lines if memory.id == exc.id)
        raise MemoryInputError(f"{where} line {number}: {exc}") from None
    out.write(f"imported {len(ids)} {'memory' if len(ids) == 1 else 'memories'}\n")
    return 0


def _when(created_at: float) -> str:
    try:
        moment = datetime.fromtimestamp(created_at, tz=timezone.utc)
    except (OverflowError, ValueError, OSError):  # a time in milliseconds, or none at all
        return f"(not a time: {created_at!r})"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def _list(store: MemoryStore, args: argparse.Namespace, out: TextIO) -> int:
    memories = store.memories(principal=args.principal, scope=args.scope)
    if args.json:
        rows = [
            {"id": m.id, "text": m.text, "principal": m.principal, "scope": m.scope,
             "created_at": m.created_at}
            async for m in memories
        ]
        out.write(safe_json(json.dumps(rows, ensure_ascii=False, indent=2)) + "\n")
        return 0
    async for memory in memories:
        out.write(f"{safe(memory.id)}\t{_when(memory.created_at)}\t{safe(memory.text)}\n")
    return 0


async def _embed(store: MemoryStore, out: TextIO) -> int:
    done = await store.embed_missing()
    assert store.embedding is not None  # checked before the store opened
    out.write(f"embedded {done} {'memory' if done == 1 else 'memories'} "
              f"({safe(store.embedding.name)})\n")
    return 0


async def _forget(store: MemoryStore, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if await store.forget(args.id, principal=args.principal, scope=args.scope):
        out.write(f"forgot {safe(args.id)}\n")
        return 0
    err.write(f"recallbound: no memory {safe(repr(args.id))} for this principal and scope\n")
    return NOT_FOUND


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run the parsed ``memory`` command; return the exit status (bad input: 2)."""
    try:
        return _run(args, out, err)
    except BrokenPipeError:  # the reader went away (``| head``): the command's own exit
        raise
    except (RecallboundError, OSError) as exc:
        err.write(f"recallbound: {safe(redact(str(exc)))}\n")
        return BAD_INPUT


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .config import load_config

    # Read with --store too: the configured semantic embedding gives what is written vectors.
    values: dict[str, Any] = dict(load_config(args.config).values)
    # Bad lines are found before the store opens: nothing is created for a bad file.
    lines = _read_lines(args.file) if args.memory_command == "import" else []
    where = "standard input" if lines and args.file == "-" else getattr(args, "file", "")
    path = _store_path(args, values)
    if args.memory_command in ("list", "forget"):  # what no memory could have: said, not echoed
        for value, field in ((args.principal, "--principal"), (args.scope, "--scope")):
            validate.bounded_text(value, field=field, max_bytes=validate.MAX_ID_BYTES)
        if args.memory_command == "forget":
            validate.identifier(args.id, field="the memory id")
    if args.memory_command in ("list", "forget", "embed"):  # never create a store
        if not path.exists():
            raise MemoryInputError(
                f"no memory store at {str(path)!r}: nothing was remembered there")
        if path.is_file() and path.stat().st_size == 0:  # SQLite would make a store of it
            raise MemoryInputError(
                f"{str(path)!r} is empty (0 bytes): nothing was remembered there")
    writes = ("add", "import", "embed")
    embedding = _embedding(values) if args.memory_command in writes else None
    if embedding is None and args.memory_command == "embed":
        raise MemoryInputError('no semantic model is configured (semantic = "none"): set '
                               "semantic in the configuration or RECALLBOUND_SEMANTIC")

    async def main() -> int:
        async with MemoryStore(path, embedding=embedding) as store:
            commands: dict[str, Callable[[], Coroutine[Any, Any, int]]] = {
                "add": lambda: _add(store, args, out),
                "import": lambda: _import(store, lines, where, out),
                "list": lambda: _list(store, args, out),
                "forget": lambda: _forget(store, args, out, err),
                "embed": lambda: _embed(store, out),
            }
            return await commands[args.memory_command]()

    return anyio.run(main)
