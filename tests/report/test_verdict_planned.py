"""A complete run that lists its planned checks is PASSED, not INCOMPLETE."""

from __future__ import annotations

import json
from pathlib import Path

from hvconform.report.model import build

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "results" / "all-passed.json"


def test_planned_checks_that_all_ran_give_passed(tmp_path: Path) -> None:
    data = json.loads(FIXTURE.read_text())
    data["run"]["planned"] = [c["id"] for c in data["checks"]]
    view = build(data, tmp_path, tmp_path)
    assert view.verdict == "PASSED"
    data["run"]["planned"].append("never-ran")
    assert build(data, tmp_path, tmp_path).verdict == "INCOMPLETE"


def test_blocked_and_environment_blocked_runs_never_read_as_passed(tmp_path: Path) -> None:
    data = json.loads(FIXTURE.read_text())
    data["run"]["planned"] = [c["id"] for c in data["checks"]]
    for check in data["checks"]:
        check["status"] = "environment_blocked"
    assert build(data, tmp_path, tmp_path).verdict == "ENVIRONMENT BLOCKED"
    data["checks"][0]["status"] = "passed"
    data["checks"][1]["status"] = "blocked"
    assert build(data, tmp_path, tmp_path).verdict == "BLOCKED"
