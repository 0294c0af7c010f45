"""The `cleanup` check on a cluster: no ledger there, so the cluster lifecycle's own verification
(objects deleted, state dir removed, diagnostic pod gone) decides it. A live verification passes
it, a failed one fails it, and a recorded contract (a fake cloud) never counts as live."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.results import CheckRecord, Status
from hvconform.scenarios import CLEANUP
from hvconform.suite.session_checks import cluster_report as _cluster_report

VERIFIED = {
    "objects deleted": {"ok": True, "detail": "7 created, still present: none"},
    "node state dir removed": {"ok": True, "detail": "/var/lib/hvconform: gone"},
}


def _skipped_cleanup() -> dict[str, Any]:
    record = CheckRecord(CLEANUP.id, CLEANUP.marker, CLEANUP.title)
    record.status, record.reason = Status.SKIPPED.value, "no ledger entries: no node was created"
    return record.to_json()


def _decide(tmp_path: Path, report: dict[str, Any]) -> dict[str, Any]:
    (tmp_path / "cluster-cluster.json").write_text(json.dumps(report))
    records = {CLEANUP.id: _skipped_cleanup()}
    _cluster_report(tmp_path, records)
    return records[CLEANUP.id]


def test_a_live_verified_cleanup_passes_with_what_was_verified(tmp_path: Path) -> None:
    record = _decide(tmp_path, {"contract": False, "cleanup_ok": True, "verification": VERIFIED})
    assert record["status"] == Status.PASSED.value and record["reason"] == ""
    assert record["metrics"]["cluster_verifications"] == 2
    assert "objects deleted: 7 created, still present: none" in record["notes"]


def test_a_recorded_contract_is_not_a_live_pass(tmp_path: Path) -> None:
    report = {"contract": True, "cleanup_ok": True, "verification": VERIFIED}
    record = _decide(tmp_path, report)
    assert record["status"] == Status.SKIPPED.value
    assert "recorded contract" in record["reason"]


@pytest.mark.parametrize("contract", [False, True])
def test_an_unverified_cleanup_fails_and_names_what_is_left(tmp_path: Path, contract: bool) -> None:
    left = VERIFIED | {"objects deleted": {"ok": False, "detail": "still present: DaemonSet x"}}
    report = {"contract": contract, "cleanup_ok": False, "verification": left}
    record = _decide(tmp_path, report)
    assert record["status"] == Status.FAILED.value
    assert "objects deleted: still present: DaemonSet x" in record["reason"]


def test_an_unverified_cleanup_says_how_to_remove_what_is_left(tmp_path: Path) -> None:
    left = VERIFIED | {"objects deleted": {"ok": False, "detail": "labelled and left: Pod p"}}
    hint = "if this run did not finish, remove what it left with: hvconform cleanup --run-id r1"
    report = {"contract": False, "cleanup_ok": False, "verification": left, "notes": [hint]}
    record = _decide(tmp_path, report)
    assert record["status"] == Status.FAILED.value
    assert record["reason"].endswith(hint)
