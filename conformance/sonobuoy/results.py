"""A node's results.json as the item tree Sonobuoy's manual result format reads.

`sonobuoy results` rolls a DaemonSet plugin's manual YAML up per node: one item per file, its
status the worst of its items'. Each check is one item, its status the suite's own word:
passed and failed as Sonobuoy counts them, skipped for a check that was not judged
(not_applicable, skipped; the reason in details), and environment_blocked and blocked kept as
they are, so Sonobuoy shows them as custom statuses and never as a pass or a failure of the
plugin. The suite's own results.json, report and junit.xml travel beside this file.
"""

from __future__ import annotations

from typing import Any

# The file the plugin definition names as its result file (result-files), beside the others.
MANUAL_FILE = "hvconform-sonobuoy.yaml"
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
BLOCKED = "blocked"  # the suite's word for a node where nothing could be verified
_AS_SONOBUOY = {"passed": PASSED, "failed": FAILED, "not_applicable": SKIPPED, "skipped": SKIPPED}


def item_status(status: str) -> str:
    """The suite's status as Sonobuoy's item status (custom statuses pass through as they are)."""
    return _AS_SONOBUOY.get(status, status)


def _check_item(check: dict[str, Any]) -> dict[str, Any]:
    details: dict[str, Any] = {"title": check.get("title", "")}
    for key in ("reason", "requirement_level", "failure"):
        if check.get(key):
            details[key] = check[key]
    if check.get("status") not in ("passed", "failed"):
        details["suite_status"] = check.get("status", "")
    metrics = check.get("metrics") or {}
    if metrics:
        details["figures"] = dict(metrics)
    return {"name": check["id"], "status": item_status(str(check.get("status", ""))),
            "details": details}  # fmt: skip


def overall(statuses: list[str]) -> str:
    """A node's verdict: failed if any check failed; then an environment problem or a blocked
    check (nothing verified there); passed when every judged check passed."""
    for word in ("failed", "blocked", "environment_blocked"):
        if word in statuses:
            return word
    return "passed" if "passed" in statuses else "skipped"


def manual_tree(
    results: dict[str, Any], node: str, refused: str = "", cost: dict[str, float] | None = None
) -> dict[str, Any]:
    """The manual-format document of one node's run (or of a run refused before it began);
    `cost`: what the run took on the node (wall and CPU seconds), in its details, which
    Sonobuoy keeps on the file's item (`sonobuoy results --mode dump`)."""
    run = results.get("run", {}) if results else {}
    checks = [c for c in results.get("checks", []) if isinstance(c, dict)] if results else []
    items = [_check_item(c) for c in checks]
    meta = {"node": node, "mode": str(run.get("mode", "")), "run_id": str(run.get("run_id", ""))}
    if refused:  # nothing was verified on this node: never a failure of its plugin
        return {"name": "hvconform", "status": BLOCKED, "meta": meta,
                "details": {"refused": refused}, "items": []}  # fmt: skip
    status = item_status(overall([str(c.get("status", "")) for c in checks]))
    tree: dict[str, Any] = {"name": "hvconform", "status": status, "meta": meta, "items": items}
    if cost:
        tree["details"] = {"node": node, **cost}
    return tree
