"""`hvconform report`: exit codes a pipeline can gate on, and its step summary."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hvconform.report.cli import register
from tests.report.conftest import make_run


def report(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hvconform")
    register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(["report", *argv])
    code: int = ns.func(ns)
    return code


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("all-passed", 0),
        ("mixed-not-verified", 0),
        ("failed-wait-expired", 1),
        ("partial-interrupted", 1),
    ],
)
def test_exit_code_follows_the_verdict(tmp_path: Path, name: str, expected: int) -> None:
    results = make_run(tmp_path, name)
    assert report(str(results), "--out", str(tmp_path / "out")) == expected
    assert (tmp_path / "out" / "report.html").exists()


def test_partial_flag_makes_a_clean_run_not_clean(tmp_path: Path) -> None:
    results = make_run(tmp_path, "all-passed")
    assert report(str(results), "--partial") == 1


def test_unreadable_results_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report(str(tmp_path / "absent.json")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hvconform report: ") and "\n" not in err


def test_step_summary_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    results = make_run(tmp_path, "failed-wait-expired")
    assert report(str(results)) == 1
    assert "**Verdict: FAILED.**" in summary.read_text()
