"""What a user of the ``recallbound`` commands meets on endless or hostile input: one
``recallbound:`` line and the documented exit status, never a traceback."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Enough for the interpreter and the CLI; reading /dev/zero whole would pass it.
ADDRESS_SPACE = 2 * 1024**3


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _recallbound(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(cwd)}
    env.pop("XDG_DATA_HOME", None)
    return subprocess.run(
        [sys.executable, "-m", "runtime_hooks", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_bounded,
        check=False,
    )


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_memory_import_of_an_endless_line_is_one_error_line(tmp_path: Path) -> None:
    done = _recallbound(
        "memory", "--store", str(tmp_path / "memory.db"), "import", "/dev/zero", cwd=tmp_path
    )
    assert "Traceback" not in done.stderr
    assert done.returncode == 2
    assert done.stderr.startswith("recallbound: /dev/zero line 1: the line is longer than")
    assert done.stderr.count("\n") == 1
    assert not (tmp_path / "memory.db").exists()  # nothing was created for a bad file


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_mcp_token_file_that_never_ends_is_one_error_line(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    done = _recallbound("mcp", "--http", "127.0.0.1:0", "--token-file", "/dev/zero", cwd=tmp_path)
    assert "Traceback" not in done.stderr
    assert done.returncode == 1
    assert done.stderr.startswith("recallbound: token file '/dev/zero': larger than")
    assert done.stderr.count("\n") == 1


def test_mcp_token_file_that_is_not_utf8_is_one_error_line(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    (tmp_path / "tokens.toml").write_bytes(b"\xff[[token]]\n")
    done = _recallbound("mcp", "--http", "127.0.0.1:0", "--token-file", "tokens.toml", cwd=tmp_path)
    assert "Traceback" not in done.stderr
    assert (done.returncode, done.stderr) == (
        1,
        "recallbound: token file 'tokens.toml': not valid TOML\n",
    )


def test_a_malformed_scenario_file_from_a_pipe_leaves_the_out_folder_as_it_was(
    tmp_path: Path,
) -> None:
    good = {
        "id": "s1",
        "family": "continuation",
        "principal": "u",
        "scope": "p",
        "memories": [{"id": "m1", "text": "alpha", "principal": "u", "scope": "p"}],
        "state": {"current_request": "alpha"},
        "relevant": {"m1": 2},
    }
    bad = {**good, "id": "s2", "relevant": {"m1": 3}}
    lines = "".join(json.dumps(scenario) + "\n" for scenario in (good, bad))
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("earlier run\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLBOUND_")}
    done = subprocess.run(
        [sys.executable, "-m", "runtime_hooks", "evaluate", "--scenarios", "/dev/stdin",
         "--out", str(out), "--semantic", "hashing", "--quiet", "--determinism", "0"],
        input=lines, capture_output=True, text=True, timeout=300, check=False,
        env={**env, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == (
        "recallbound: /dev/stdin: line 2, field 'relevant.m1': grade must be 1 or 2, got 3\n"
    )
    assert sorted(path.name for path in out.iterdir()) == ["report.json"]
    assert (out / "report.json").read_text() == "earlier run\n"


@pytest.mark.parametrize("resamples", ["99999999999999999999", "1000001"])
def test_evaluate_resamples_past_its_bound_is_a_usage_error(tmp_path: Path, resamples: str) -> None:
    scenarios = ROOT / "examples" / "scenarios.jsonl"
    done = _recallbound(
        "evaluate", "--scenarios", str(scenarios), "--out", str(tmp_path / "out"),
        "--semantic", "hashing", "--arms", "sparse", "--limit", "1", "--determinism", "0",
        "--quiet", "--resamples", resamples, cwd=tmp_path,
    )  # fmt: skip
    assert "Traceback" not in done.stderr
    assert done.returncode == 2
    assert done.stderr.startswith(
        f"recallbound: argument --resamples: must be an integer from 1 to 1,000,000, "
        f"got '{resamples}' (usage: "
    )
    assert done.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def _outcomes(text: str) -> list[str]:
    return [line for line in text.splitlines() if "-> next-action memory" in line]


def test_a_demo_rerun_with_another_semantic_arm_embeds_the_seeded_memories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from runtime_hooks.__main__ import main

    fresh, rerun = tmp_path / "fresh", tmp_path / "rerun"
    assert main(["demo", "--semantic", "hashing", "--data-dir", str(fresh)]) == 0
    expected = _outcomes(capsys.readouterr().out)
    assert main(["demo", "--semantic", "none", "--data-dir", str(rerun)]) == 0
    capsys.readouterr()
    assert main(["demo", "--semantic", "hashing", "--data-dir", str(rerun)]) == 0
    second = capsys.readouterr().out
    assert "seeded by an earlier run" in second
    # The semantic arm the second run names finds the memories the first run stored.
    assert _outcomes(second) == expected


def test_a_demo_folder_that_cannot_be_a_folder_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    done = _recallbound("demo", "--data-dir", str(tmp_path / "file"), cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("recallbound: cannot keep the demo's files in ")
    assert done.stderr.count("\n") == 1 and "Errno" not in done.stderr


def test_the_demo_help_names_the_model_auto_picks_first() -> None:
    import contextlib
    import io

    from runtime_hooks.__main__ import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["demo", "--help"], stdout=out) == 0
    assert "installed: minilm with wordllama's words, else wordllama" in " ".join(
        out.getvalue().split())
