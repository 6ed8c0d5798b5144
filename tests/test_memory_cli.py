"""``recallbound memory add|import|list|forget``: output, JSON, all-or-nothing import, and bad
input as one ``recallbound:`` line with exit status 2."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from runtime_hooks.__main__ import main

WHO = ["--principal", "u1", "--scope", "proj"]


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def rows(path: Path) -> list[tuple[str, str, str, str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT principal, scope, id, text FROM memories ORDER BY principal, scope, id"
        ).fetchall()
    finally:
        conn.close()


def test_add_list_forget_round_trip(tmp_path: Path) -> None:
    store = str(tmp_path / "memory.db")
    status, out, err = cli("memory", "--store", store, "add", "Ana owns the schema review.", *WHO)
    assert (status, err) == (0, "")
    first = out.strip()
    assert cli("memory", "--store", store, "add", "The release is Friday.", "--id", "rel", *WHO)[
        :2
    ] == (0, "rel\n")
    status, out, _ = cli("memory", "--store", store, "list", *WHO, "--json")
    listed = json.loads(out)
    assert status == 0
    assert {m["id"] for m in listed} == {first, "rel"}
    assert all(m["principal"] == "u1" and m["scope"] == "proj" for m in listed)
    status, out, _ = cli("memory", "--store", store, "list", *WHO)
    assert status == 0 and len(out.splitlines()) == 2 and "Ana owns" in out
    # Upsert by id.
    cli("memory", "--store", store, "add", "The release moved to Monday.", "--id", "rel", *WHO)
    assert ("u1", "proj", "rel", "The release moved to Monday.") in rows(Path(store))
    assert cli("memory", "--store", store, "forget", "rel", *WHO) == (0, "forgot rel\n", "")
    status, out, err = cli("memory", "--store", store, "forget", "rel", *WHO)
    assert (status, out) == (1, "")
    assert err.startswith("recallbound: no memory 'rel'") and err.count("\n") == 1
    # Another principal sees nothing of u1's.
    status, out, _ = cli("memory", "--store", store, "list", "--principal", "u2", "--scope",
                         "proj", "--json")
    assert (status, json.loads(out)) == (0, [])


@pytest.mark.parametrize("where", ["after memory", "before memory", "after the subcommand"])
def test_store_may_be_named_before_or_after_the_subcommand(tmp_path: Path, where: str) -> None:
    store = str(tmp_path / "memory.db")

    def command(sub: str, *rest: str) -> list[str]:
        if where == "after memory":
            return ["memory", "--store", store, sub, *rest]
        if where == "before memory":
            return ["--store", store, "memory", sub, *rest]
        return ["memory", sub, *rest, "--store", store]

    status, out, err = cli(*command("add", "Ana owns the schema review.", *WHO))
    assert (status, err) == (0, "")
    assert rows(Path(store)) == [("u1", "proj", out.strip(), "Ana owns the schema review.")]
    status, out, _ = cli(*command("list", *WHO, "--json"))
    assert status == 0 and [m["text"] for m in json.loads(out)] == ["Ana owns the schema review."]


def test_store_before_another_command_is_a_usage_error(tmp_path: Path) -> None:
    with contextlib.redirect_stderr(io.StringIO()) as err:
        status = main(["--store", str(tmp_path / "memory.db"), "config", "show"])
    assert status == 2 and "--store before the command is for the memory command" in err.getvalue()
    assert not (tmp_path / "memory.db").exists()


def test_list_into_a_pipe_its_reader_closed_ends_quietly(tmp_path: Path) -> None:
    """``recallbound memory list ... | head -1``: the reader goes away after one line; the
    command stops with the shell's SIGPIPE status and no error line."""
    store, data = tmp_path / "memory.db", tmp_path / "memories.jsonl"
    data.write_text("".join(
        json.dumps({"text": f"note {i} " + "x" * 80, "principal": "u1", "scope": "proj"}) + "\n"
        for i in range(3000)), encoding="utf-8")
    assert cli("memory", "--store", str(store), "import", str(data))[0] == 0
    command = [sys.executable, "-m", "runtime_hooks", "memory", "--store", str(store), "list",
               *WHO]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=tmp_path) as process:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline().strip()
        process.stdout.close()
        error = process.stderr.read()
    assert (process.returncode, error) == (141, b"")


def test_import_reads_jsonl_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "memory.db"
    data = tmp_path / "memories.jsonl"
    data.write_text(
        json.dumps({"text": "one", "principal": "u1", "scope": "proj", "id": "a"}) + "\n\n"
        + json.dumps({"text": "two", "principal": "u2", "scope": "proj"}) + "\n",
        encoding="utf-8",
    )
    assert cli("memory", "--store", str(store), "import", str(data)) == (
        0, "imported 2 memories\n", "")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
        json.dumps({"text": "three", "principal": "u1", "scope": "proj", "id": "a"}).encode()
    )))
    assert cli("memory", "--store", str(store), "import", "-") == (0, "imported 1 memory\n", "")
    assert [(r[0], r[2], r[3]) for r in rows(store)] == [("u1", "a", "three")] + [
        ("u2", r[2], "two") for r in rows(store) if r[0] == "u2"
    ]


def test_import_ignores_a_byte_order_mark_at_the_start(tmp_path: Path) -> None:
    """A file saved by an editor that writes a UTF-8 byte-order mark imports as it reads; a
    mark anywhere else is still part of its line (and not JSON there)."""
    store, data = tmp_path / "memory.db", tmp_path / "memories.jsonl"
    line = json.dumps({"text": "one", "principal": "u1", "scope": "proj", "id": "a"})
    data.write_bytes(b"\xef\xbb\xbf" + line.encode() + b"\r\n")
    assert cli("memory", "--store", str(store), "import", str(data)) == (
        0, "imported 1 memory\n", "")
    assert rows(store) == [("u1", "proj", "a", "one")]
    data.write_bytes(line.encode() + b"\n\xef\xbb\xbf" + line.replace('"a"', '"b"').encode())
    status, _, err = cli("memory", "--store", str(store), "import", str(data))
    assert status == 2 and "line 2: not valid JSON" in err
    assert rows(store) == [("u1", "proj", "a", "one")]


GOOD = json.dumps({"text": "fine", "principal": "u1", "scope": "proj", "id": "g"})


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (b"not json", "line 2: not valid JSON"),
        (b'["a list"]', "line 2: a memory must be an object"),
        (b'"a string"', "line 2: a memory must be an object"),
        (b'{"text": "x", "principal": "u1"}', "line 2: missing key(s): 'scope'"),
        (b'{"text": "", "principal": "u1", "scope": "p"}', "line 2: text must not be empty"),
        (b'{"text": "x", "principal": "u1", "scope": "p", "id": "a\\u0000"}', "line 2: id must"),
        (b'{"text": "\\ud800", "principal": "u1", "scope": "p"}', "line 2: text is not valid"),
        (b'{"text": "x", "principal": "u1", "scope": "proj", "id": "g"}',
         "line 2: repeats the id 'g' of line 1"),
        (b'{"text": "x", "principal": "u1", "scope": "proj", "id": "theirs"}',
         "line 2: memory id 'theirs' belongs to another principal or scope"),
        (b"\xff\xfe bad bytes", "line 2: not valid UTF-8"),
    ],
)
def test_a_bad_line_is_named_and_nothing_is_imported(
    tmp_path: Path, second: bytes, why: str
) -> None:
    store = tmp_path / "memory.db"
    assert cli("memory", "--store", str(store), "add", "u2's", "--id", "theirs",
               "--principal", "u2", "--scope", "proj")[0] == 0
    before = rows(store)
    data = tmp_path / "bad.jsonl"
    data.write_bytes(GOOD.encode() + b"\n" + second + b"\n" + GOOD.replace('"g"', '"h"').encode())
    status, out, err = cli("memory", "--store", str(store), "import", str(data))
    assert (status, out) == (2, "")
    assert err.startswith(f"recallbound: {data} {why}"), err
    assert err.count("\n") == 1
    assert rows(store) == before


def test_errors_are_one_line_with_exit_status_2(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE notes (x)")
    conn.commit()
    conn.close()
    cases = [
        ("memory", "--store", str(foreign), "add", "x", *WHO),
        ("memory", "--store", str(tmp_path / "missing" / "m.db"), "add", "x", *WHO),
        ("memory", "--store", str(tmp_path / "m.db"), "add", "", *WHO),
        ("memory", "--store", str(tmp_path / "m.db"), "add", "x", "--id", "a\x1bb", *WHO),
        ("memory", "--store", str(tmp_path / "m.db"), "import", str(tmp_path / "absent.jsonl")),
        ("memory", "--store", str(tmp_path / "never.db"), "list", *WHO),
    ]
    for argv in cases:
        status, out, err = cli(*argv)
        assert (status, out) == (2, ""), argv
        assert err.startswith("recallbound: ") and err.count("\n") == 1, (argv, err)
        assert "Traceback" not in err
    assert not (tmp_path / "never.db").exists()
    assert "\x1b" not in cli(*cases[3])[2]  # the bad id is printed escaped


def test_the_default_store_folder_is_created_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)  # no recallbound.toml here
    monkeypatch.delenv("RECALLBOUND_CONFIG", raising=False)
    monkeypatch.delenv("RECALLBOUND_STORE", raising=False)
    status, out, _ = cli("memory", "add", "first memory", *WHO)
    assert status == 0
    assert rows(tmp_path / "data" / "recallbound" / "memory.db") == [
        ("u1", "proj", out.strip(), "first memory")
    ]


def _no_configured_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no recallbound.toml here
    monkeypatch.delenv("RECALLBOUND_CONFIG", raising=False)
    monkeypatch.delenv("RECALLBOUND_STORE", raising=False)


def test_a_relative_xdg_data_home_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The XDG specification: a relative path in ``XDG_DATA_HOME`` is invalid and ignored."""
    _no_configured_store(tmp_path, monkeypatch)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", "data")
    assert cli("memory", "add", "first memory", *WHO)[0] == 0
    assert (tmp_path / "home" / ".local" / "share" / "recallbound" / "memory.db").is_file()
    assert not (tmp_path / "data").exists()


def test_reading_the_default_store_creates_no_folder_and_a_bad_home_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_configured_store(tmp_path, monkeypatch)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    code, out, err = cli("memory", "list", *WHO)
    assert (code, out) == (2, "") and "no memory store at" in err
    assert not (tmp_path / "home").exists()
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("HOME", str(tmp_path / "file"))
    code, out, err = cli("memory", "add", "first memory", *WHO)
    assert (code, out) == (2, "")
    assert err.startswith("recallbound: cannot create the default store's folder")
    assert err.count("\n") == 1 and "Errno" not in err


def test_the_configured_store_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "configured.db"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RECALLBOUND_CONFIG", raising=False)
    monkeypatch.setenv("RECALLBOUND_STORE", str(store))
    assert cli("memory", "add", "configured", "--id", "c", *WHO)[:2] == (0, "c\n")
    assert rows(store) == [("u1", "proj", "c", "configured")]


def test_listed_text_cannot_forge_lines_or_escape_sequences(tmp_path: Path) -> None:
    store = tmp_path / "m.db"

    async def seed() -> None:
        from plugin.memory.store import MemoryStore

        async with MemoryStore(store) as opened:
            await opened.remember("line one\nfake\x1b[31m row\u202e", id="x", principal="u1",
                                  scope="proj")

    anyio.run(seed)
    status, out, _ = cli("memory", "--store", str(store), "list", *WHO)
    assert status == 0 and out.count("\n") == 1
    assert "\x1b" not in out and "\u202e" not in out
    status, out, _ = cli("memory", "--store", str(store), "list", *WHO, "--json")
    assert "\x1b" not in out and json.loads(out)[0]["text"] == "line one\nfake\x1b[31m row\u202e"


def test_a_store_given_on_the_command_line_still_gets_the_configured_vectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recallbound.toml").write_text(
        'ledger = "l.db"\nstore = "m.db"\nsemantic = "hashing"\n')
    assert cli("memory", "--store", "other.db", "add", "explicit store", "--id", "a", *WHO)[0] == 0
    conn = sqlite3.connect(tmp_path / "other.db")
    try:
        (vectors,) = conn.execute("SELECT count(*) FROM embeddings").fetchone()
    finally:
        conn.close()
    assert vectors == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
def test_embed_computes_the_vectors_the_configured_model_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    anyio_backend: str,
) -> None:
    import logging

    from plugin.memory.embedding_choice import load_embedding
    from plugin.memory.store import MemoryStore
    from runtime_hooks.bootstrap import RecallConfig, Semantic, open_hooks

    monkeypatch.chdir(tmp_path)
    (tmp_path / "recallbound.toml").write_text('ledger = "l.db"\nstore = "m.db"\n')
    for text in ("Invoice QX-7781 is filed under taxes", "The plumber comes on Tuesday"):
        assert cli("memory", "add", text, *WHO)[0] == 0  # semantic = "none": no vectors
    hashing = load_embedding("hashing")
    assert hashing is not None

    async def seen() -> list[str]:  # what the semantic arm finds, by text
        async with MemoryStore(tmp_path / "m.db", embedding=hashing) as store:
            found = await store.semantic_candidates(
                hashing.embed(["invoice QX-7781 taxes"])[0], principal="u1", scope="proj",
                limit=5)
            return [item.text for item in found]

    async def warned() -> list[logging.LogRecord]:
        caplog.clear()
        config = RecallConfig(ledger_path=tmp_path / "l.db", store_path=tmp_path / "m.db",
                              semantic=Semantic.HASHING)
        with caplog.at_level(logging.WARNING, logger="recallbound.memory"):
            async with open_hooks(config):
                pass
        return [r for r in caplog.records if getattr(r, "recallbound", {}).get("event")
                == "store.unembedded"]

    assert anyio.run(seen, backend=anyio_backend) == []
    (record,) = anyio.run(warned, backend=anyio_backend)
    assert record.recallbound["memories"] == 2 and "recallbound memory embed" in record.message
    monkeypatch.setenv("RECALLBOUND_SEMANTIC", "hashing")
    assert cli("memory", "embed") == (0, "embedded 2 memories (hashing-blake2b-256)\n", "")
    assert cli("memory", "embed") == (0, "embedded 0 memories (hashing-blake2b-256)\n", "")
    assert "Invoice QX-7781 is filed under taxes" in anyio.run(seen, backend=anyio_backend)
    assert anyio.run(warned, backend=anyio_backend) == []
    monkeypatch.delenv("RECALLBOUND_SEMANTIC")
    status, out, err = cli("memory", "embed")
    assert (status, out) == (2, "") and "no semantic model is configured" in err
    assert cli("memory", "--store", "absent.db", "embed")[0] == 2  # creates no store
    assert not (tmp_path / "absent.db").exists()


def test_a_console_that_cannot_encode_a_memory_gets_it_escaped(tmp_path: Path) -> None:
    import os
    import subprocess

    store = str(tmp_path / "m.db")
    assert cli("memory", "--store", store, "add", "party \U0001f389", "--id", "e1", *WHO)[0] == 0
    env = {**os.environ, "PYTHONIOENCODING": "cp1252"}
    done = subprocess.run(
        [sys.executable, "-m", "runtime_hooks", "memory", "--store", store, "list", *WHO],
        capture_output=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert b"party \\U0001f389" in done.stdout and b"Traceback" not in done.stderr


@pytest.mark.parametrize("created_at", [1.7e12, -1e12])
def test_a_memory_whose_time_is_no_date_is_listed_not_a_traceback(
    tmp_path: Path, created_at: float
) -> None:
    """A time in milliseconds (as many exports write it) is past any date: it is shown as
    what it is, and the listing goes on."""
    from plugin.memory.store import MemoryStore

    store = tmp_path / "memory.db"

    async def seed() -> None:
        async with MemoryStore(store) as opened:
            await opened.remember("a note", id="m1", principal="u", scope="s")
    anyio.run(seed)
    with contextlib.closing(sqlite3.connect(store)) as conn, conn:
        conn.execute("UPDATE memories SET created_at = ?", (created_at,))
    code, out, err = cli("memory", "--store", str(store), "list", "--principal", "u",
                         "--scope", "s")
    assert (code, err) == (0, "")
    assert out == f"m1\t(not a time: {created_at!r})\ta note\n"


def test_import_from_a_closed_standard_input_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", None)
    code, _, err = cli("memory", "--store", str(tmp_path / "m.db"), "import", "-")
    assert code == 2 and err.startswith("recallbound: ") and err.count("\n") == 1


def test_an_import_line_whose_id_a_belief_holds_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugin.memory.store import MemoryStore

    store = tmp_path / "m.db"

    async def seed() -> None:
        async with MemoryStore(store) as opened:
            await opened.add_belief("b1", "Ana", "Ana thinks the cutover is on Friday",
                                    principal="u", scope="s")
    anyio.run(seed)
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "ok", "principal": "u", "scope": "s"}\n'
                    '{"text": "t", "principal": "u", "scope": "s", "id": "b1"}\n')
    code, out, err = cli("memory", "--store", str(store), "import", str(path))
    assert (code, out) == (2, "")
    assert "line 2" in err and "'b1'" in err and err.count("\n") == 1


def test_list_reads_while_another_process_writes(tmp_path: Path) -> None:
    store = str(tmp_path / "m.db")
    assert cli("memory", "--store", store, "add", "Committed note.", "--id", "m1", *WHO)[0] == 0
    other = sqlite3.connect(store, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # an import in progress holds the write lock
        status, out, err = cli("memory", "--store", store, "list", *WHO, "--json")
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert (status, err) == (0, "")
    assert [m["id"] for m in json.loads(out)] == ["m1"]


@pytest.mark.parametrize("command", [["list", *WHO], ["forget", *WHO, "m-1"], ["embed"]])
@pytest.mark.parametrize("content", [None, b""])
def test_list_forget_and_embed_never_create_a_store(
    tmp_path: Path, command: list[str], content: bytes | None
) -> None:
    # No file, or an empty one: nothing was remembered there, and reading must not make a
    # store of it (an empty file is what SQLite would silently turn into one).
    store = tmp_path / "memory.db"
    if content is not None:
        store.write_bytes(content)
    code, out, err = cli("memory", "--store", str(store), *command)
    assert code == 2 and out == ""
    assert err.startswith("recallbound: ") and err.count("\n") == 1
    assert "nothing was remembered there" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if content is None else ["memory.db"])
    if content is not None:
        assert store.read_bytes() == content


@pytest.mark.parametrize("argv", [
    ["list", "--principal", "p" * 130_000, "--scope", "proj"],
    ["list", "--principal", "u1", "--scope", "a\x00b"],
    ["forget", *WHO, "x" * 100_000],
    ["forget", "--principal", " ", "--scope", "proj", "m-1"],
])
def test_a_principal_scope_or_id_no_memory_could_have_is_refused_in_one_short_line(
    tmp_path: Path, argv: list[str]
) -> None:
    # The rule add applies: a principal, scope or id that is not an id is a typed error (exit
    # 2), said without echoing it, instead of an empty list or a megabyte "no memory" line.
    store = str(tmp_path / "memory.db")
    assert cli("memory", "--store", store, "add", "Ana owns the schema review.", *WHO)[0] == 0
    code, out, err = cli("memory", "--store", store, *argv)
    assert code == 2 and out == ""
    assert err.startswith("recallbound: ") and err.count("\n") == 1 and len(err) < 300


def test_a_memory_added_under_any_principal_a_run_may_have_can_be_listed_and_forgotten(
    tmp_path: Path,
) -> None:
    """``list`` and ``forget`` take every principal and scope ``add`` takes (a run's identity
    may hold a newline or a tab), so no memory is written that the CLI cannot reach."""
    store = str(tmp_path / "memory.db")
    who = ["--principal", "team\nana", "--scope", "proj\tq3"]
    assert cli("memory", "--store", store, "add", "Ana owns the review.", "--id", "m1",
               *who)[:2] == (0, "m1\n")
    status, out, err = cli("memory", "--store", store, "list", *who, "--json")
    assert (status, err) == (0, "")
    assert [m["id"] for m in json.loads(out)] == ["m1"]
    assert cli("memory", "--store", store, "forget", "m1", *who) == (0, "forgot m1\n", "")
    assert rows(Path(store)) == []
