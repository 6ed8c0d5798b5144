"""A machine without PgBouncer: its tests skip with a one-line reason, and fail under CI."""

from __future__ import annotations

import shutil

import pytest

from . import _pg


@pytest.fixture
def no_pgbouncer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)


@pytest.mark.usefixtures("no_pgbouncer")
def test_without_the_program_a_pgbouncer_test_skips_naming_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        _pg.pgbouncer_program()
    reason = str(skipped.value)
    assert "\n" not in reason
    assert "Debian package: pgbouncer" in reason


@pytest.mark.usefixtures("no_pgbouncer")
def test_without_the_program_under_ci_a_pgbouncer_test_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception) as failed:
        _pg.pgbouncer_program()
    assert "pgbouncer" in str(failed.value)


@pytest.mark.usefixtures("no_pgbouncer")
def test_the_pooled_dsn_skips_through_the_same_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    _pg.pooled_dsn.cache_clear()
    with pytest.raises(pytest.skip.Exception):
        _pg.pooled_dsn()


def test_ci_sets_the_ci_variable() -> None:
    ci = (_pg.Path(__file__).resolve().parents[1] / ".ci" / "run").read_text(encoding="utf-8")
    assert "export CI=" in ci
