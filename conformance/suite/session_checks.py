"""The session-level checks, decided by the controller once every worker is done: `cleanup`
(every worker's ledger, or a cluster lifecycle's verification), `metadata-two-phase` (each node's
host device metadata around its life) and `plugin-identity` (hvconform.suite.identity).

A phase that never started proves nothing: a node that never came up leaves its startup
metadata phase unrun, which is `blocked` (naming why), never `failed`; when the machine lacked
what the node needed (a kind node image that cannot be pulled), every session-level check that
did not fail is `environment_blocked` with that line, as the checks themselves are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvconform.contract.ledger import read_entries, survivors
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.results import CheckRecord, Status
from hvconform.scenarios import CLEANUP
from hvconform.suite import identity, preflight

METADATA_ID = "metadata-two-phase"
# After the catalogue, in this order.
ORDER = (METADATA_ID, identity.CHECK_ID, CLEANUP.id)


def cleanup_record(out: Path) -> dict[str, Any]:
    ledgers = sorted((out / "ledger").glob("*.jsonl"))
    entries = read_entries(ledgers)
    left = survivors(entries)
    record = CheckRecord(CLEANUP.id, CLEANUP.marker, CLEANUP.title)
    record.metrics = {"ledger_entries": len(entries), "survivors": len(left)}
    if not entries:
        record.status, record.reason = preflight.nothing_created()
    elif left:
        record.status = Status.FAILED.value
        record.reason = "left behind: " + "; ".join(f"{e.kind} {e.ident}" for e in left[:10])
    return record.to_json()


def metadata_record(out: Path) -> dict[str, Any] | None:
    """Both phases of every node. A verdict that is not accepted fails; a startup phase that
    never ran (the node never came up) blocks, unless the final phase found the device changed;
    a node whose device is not on this machine is not judged (not applicable when none is)."""
    summaries = sorted((out / "metadata").glob("*.json"))
    if not summaries:
        return None
    record = CheckRecord(METADATA_ID, "metadata", "Host device metadata, two phases")
    down = identity.never_up(out)
    failures, unrun, not_here = [], [], []
    for path in summaries:
        summary = json.loads(path.read_text())
        record.evidence.append(f"metadata/{path.name}")
        if summary.get("not_here"):
            not_here.append(f"{path.stem}: {summary['not_here']}")
            continue
        for phase in ("startup", "final"):
            verdict = summary[phase]["verdict"]
            if verdict is None:
                why = down.get(path.stem, "the node never came up")
                record.notes.append(f"{path.stem} {phase}: never ran ({why})")
                unrun.append(f"{path.stem} {phase} phase never ran: {why}")
                continue
            record.notes.append(f"{path.stem} {phase}: {verdict['message']}")
            if verdict["status"] != "accepted":
                failures.append(f"{path.stem} {phase}: {verdict['message']}")
    record.metrics = {"nodes": len(summaries) - len(not_here)}
    if len(not_here) == len(summaries):  # no node's device was here to check
        record.status, record.reason = Status.NOT_APPLICABLE.value, "; ".join(not_here)
    elif failures:
        record.status, record.reason = Status.FAILED.value, "; ".join(failures)
    elif unrun:
        record.status, record.reason = Status.BLOCKED.value, "; ".join(unrun)
    return record.to_json()


def cluster_report(out: Path, records: dict[str, Any]) -> dict[str, Any]:
    """kind/aks write cluster-<target>.json: its environment, and whether cleanup verified."""
    reports = sorted(out.glob("cluster-*.json"))
    if not reports:
        return {}
    data: dict[str, Any] = json.loads(reports[0].read_text())
    checks = data.get("verification", {})
    cleanup = records.get(CLEANUP.id)
    if cleanup is not None and not data.get("cleanup_ok", True):
        failed = [f"{name}: {v.get('detail', '')}" for name, v in checks.items() if not v.get("ok")]
        cleanup["status"] = Status.FAILED.value
        hint = [n for n in data.get("notes", []) if "hvconform cleanup" in str(n)]
        cleanup["reason"] = (
            "cluster cleanup not verified: "
            + ("; ".join(failed[:5]) or "see " + reports[0].name)
            + (f"; {hint[0]}" if hint else "")
        )
    elif cleanup is not None and cleanup["status"] == Status.SKIPPED.value and checks:
        # No ledger on a cluster: what the run put there was verified gone by the cluster
        # lifecycle instead. A recorded contract (a fake cloud) verifies nothing live.
        cleanup["notes"] = [f"{name}: {v.get('detail', '')}" for name, v in checks.items()]
        cleanup["metrics"]["cluster_verifications"] = len(checks)
        if data.get("contract") or data.get("environment", {}).get("contract"):
            cleanup["reason"] = "cluster cleanup checked against a recorded contract, not live"
        else:
            cleanup["status"], cleanup["reason"] = Status.PASSED.value, ""
    env: dict[str, Any] = data.get("environment", {})
    return env


def environment_blocked(records: dict[str, Any], line: str) -> None:
    """No node came up because the machine lacks something: the session-level checks that did
    not fail say so too (a verified cleanup stays in their notes), so the run never passes."""
    for check_id in ORDER:
        found = records.get(check_id)
        if found is not None and found["status"] != Status.FAILED.value:
            found["status"], found["reason"] = Status.ENVIRONMENT_BLOCKED.value, line


def decide(
    out: Path, records: dict[str, Any], plugin: PluginUnderTest
) -> tuple[dict[str, Any], str]:
    """Add every session-level record to `records` (when any check reported); returns the
    cluster environment and the environment_blocked line of a run whose nodes never came up
    ('' when they did)."""
    if records:
        records[CLEANUP.id] = cleanup_record(out)
        for made in (metadata_record(out), identity.record(out, plugin)):
            if made is not None:
                records[made["id"]] = made
    cluster = cluster_report(out, records)
    line = identity.environment_line(out) if records else ""
    if line:
        environment_blocked(records, line)
    return cluster, line
