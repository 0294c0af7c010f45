"""Results 1.3: the report reads the typed fields, never the words; a 1.2 file still reads.

Each check below carries words that would mislead a reader of text (a reason worded like an
expired wait, an event named like a fresh guest): the 1.3 report follows the fields, and the same
file declared 1.2 goes through report.legacy and reads as before.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hvconform.contract.results import validate_results
from hvconform.contract.wait import expired
from hvconform.report import junit
from hvconform.report.model import CheckView, build

WAIT_TEXT = "hvconform.contract.wait.WaitExpired: wait 'spec again' expired after 3s (last: None)"


def results(version: str) -> dict[str, Any]:
    facts = expired("allocatable > 0 (after restore)", 60, 0).facts
    assert facts is not None
    check = {"marker": "cdi", "duration_s": 1.0, "metrics": {}, "evidence": []}
    return {
        "schema_version": version,
        "run": {
            "id": "r1",
            "target": "local",
            "started_at": "2026-01-01T00:00:00Z",
            "finished_at": "2026-01-01T00:01:00Z",
            "duration_s": 60.0,
            "exit_code": 1,
        },
        "environment": {
            "kernel": "6.1",
            "distribution": "Debian",
            "cgroup": {"version": "v2", "driver": "systemd"},
            "python": "3.11",
            "plugin_version": "0.1",
            "suite_version": "0.1",
            "source_commit": "abc",
        },
        "checks": [
            {
                **check,
                "id": "worded-like-a-wait",
                "title": "An assertion whose message reads like a wait",
                "status": "failed",
                "reason": WAIT_TEXT,
                "failure": "assertion",
                "timeline": [
                    {"name": "fresh guest passed (decoy)", "t_s": 0.1, "kind": "info"},
                    {"name": "a guest ran", "t_s": 0.2, "kind": "guest"},
                ],
            },
            {
                **check,
                "id": "typed-wait",
                "title": "A wait with its fields",
                "status": "failed",
                "reason": facts.sentence(),
                "failure": "wait",
                "wait": facts.to_json(),
                "timeline": [{"name": "device removed", "t_s": 0.1, "kind": "fault"}],
            },
            {
                **check,
                "id": "blocked-worded-otherwise",
                "title": "A status is its field",
                "status": "blocked",
                "reason": "not_applicable: RuntimeError: words only",
                "timeline": [],
            },
        ],
    }


def view(data: dict[str, Any], tmp_path: Path) -> dict[str, CheckView]:
    validate_results(data)  # a file the suite could have written
    return {c.id: c for c in build(data, tmp_path, tmp_path).checks}


def test_a_1_3_report_reads_fields_never_words(tmp_path: Path) -> None:
    checks = view(results("1.3"), tmp_path)
    decoy = checks["worded-like-a-wait"]
    assert (decoy.failure_kind, decoy.wait) == ("assertion", None)
    assert decoy.reason_words == WAIT_TEXT  # shown as recorded: no class name stripped by regex
    assert [e.kind for e in decoy.timeline] == ["info", "guest"]
    assert "a fresh guest passed afterwards" in decoy.phrases  # counted by kind, not by name
    typed = checks["typed-wait"]
    assert typed.wait is not None and typed.failure_kind == "wait"
    assert (typed.wait.awaited, typed.wait.view) == (
        "allocatable > 0 (after restore)",
        "the kubelet's",
    )
    assert typed.reason_words == (
        "waited 60 s for allocatable > 0 (after restore) (as the kubelet sees it): "
        "the kubelet still counted 0 allocatable"
    )
    blocked = checks["blocked-worded-otherwise"]
    assert (blocked.status, blocked.reason_words) == (
        "blocked",
        "not_applicable: RuntimeError: words only",
    )
    assert 'type="assertion"' in junit.render(build(results("1.3"), tmp_path, tmp_path))


def test_a_1_2_file_reads_through_the_legacy_words(tmp_path: Path) -> None:
    """What an older suite wrote: no event kinds, so they come from the scenarios' wording."""
    data = results("1.2")
    for check in data["checks"]:
        for event in check["timeline"]:
            del event["kind"]
    checks = view(data, tmp_path)
    decoy = checks["worded-like-a-wait"]
    assert decoy.failure_kind == "assertion"  # 1.2 named the failure kind: the field wins
    assert decoy.reason_words == "waited 3 s for spec again: the condition still did not hold"
    assert [e.kind for e in decoy.timeline] == ["guest", "info"]
    assert checks["typed-wait"].timeline[0].kind == "fault"
    assert checks["blocked-worded-otherwise"].reason_words == (
        "not_applicable: RuntimeError: words only"
    )


def test_a_1_3_file_without_event_kinds_is_refused() -> None:
    data = copy.deepcopy(results("1.3"))
    del data["checks"][1]["timeline"][0]["kind"]
    with pytest.raises(jsonschema.ValidationError):
        validate_results(data)
