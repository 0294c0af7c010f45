"""A complete run that lists its planned checks is PASSED, not INCOMPLETE."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.report.model import build

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "results" / "all-passed.json"


def test_planned_checks_that_all_ran_give_passed(tmp_path: Path) -> None:
    data = json.loads(FIXTURE.read_text())
    data["run"]["planned"] = [c["id"] for c in data["checks"]]
    view = build(data, tmp_path, tmp_path)
    assert view.verdict == "PASSED"
    data["run"]["planned"].append("never-ran")
    assert build(data, tmp_path, tmp_path).verdict == "INCOMPLETE"
