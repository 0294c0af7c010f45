"""Issue 35 on the existing-cluster target, LIVE on a cluster-mode node: a plugin deployed with
exec probes only (no HTTP port, an image holding only its binary: go-kvm's profile-exec.yaml)
is judged alive while the kubelet keeps its container running, through every fault that makes
it unready; and a plugin that never recovers from stream-lost leaves every later check
`blocked`, never failed.

Before this, cluster targets read liveness from the pod's ContainersReady condition, which the
readiness probe drives (the seed plugin on KIND: cdi-read-only, device-late,
registration-failure and registration-dir-replaced failed on `liveness must stay true` while it
re-registered a second after each fault). In-container faults for the shell-less image are made
by setns(2) (hvconform.targets.cluster.setns_faults). Runs in `nox -s exec-probes-live` (apart
from `tests` for CI's time: a node stack up and down, two cluster runs); needs `nox -s
node-build`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.results import validate_results
from hvconform.targets.realnode import NODE_NAME
from tests.container.gokvm import NEVER_BACK_SELECTION, NEVER_BACK_VERDICTS, variant_profile
from tests.fixture_plugins import GO_KVM_DIR
from tests.realnode.live_runs import cluster_mode_nodes, live_module, skip_unless_live

# the machine's one node stack, locked only when this module really runs (apart from `tests`,
# it would only wait for the lock to skip: 208 s of a CI worker, measured)
USES_NODE_STACK = live_module("HV_EXEC_PROBES_LIVE")
pytestmark = pytest.mark.timeout(2400)
EXEC_PROFILE = GO_KVM_DIR / "profile-exec.yaml"
# The faults that take the plugin's readiness away while its process keeps running.
UNREADY_FAULTS = {"cdi-missing", "cdi-read-only", "registration-failure",
                  "registration-dir-replaced", "stream-lost", "restart-kubelet"}  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    skip_unless_live("HV_EXEC_PROBES_LIVE", "exec-probes-live")
    from hvconform.targets.realnode import node_images
    from tests.container.fixture_image import ensure_in_suite_engine

    with cluster_mode_nodes(1) as made:
        image = ensure_in_suite_engine()
        node_images.load([image.tag])
        yield made


def _run(cluster: dict[str, str], out: Path, profile: Path, *extra: str) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "hvconform.cli", "run", "--target", "cluster",
        "--kubeconfig", cluster["kubeconfig"], "--node", NODE_NAME, "--node-access", "pod",
        "--plugin-profile", str(profile), "--guest-image", cluster["guest"],
        "--diag-image", cluster["guest"], "--out", str(out), *extra,
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=2000)
    results = out / "results.json"
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-2000:]
    data: dict[str, Any] = json.loads(results.read_text())
    validate_results(data)
    data["_output"] = proc.stdout[-4000:]
    return data


def test_exec_probe_plugin_is_alive_through_every_fault(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    run = _run(cluster, tmp_path / "exec", EXEC_PROFILE)
    checks = {c["id"]: c for c in run["checks"]}
    failed = {i: c["reason"] for i, c in checks.items() if c["status"] == "failed"}
    assert not failed, run["_output"]
    ran = {i for i, c in checks.items() if c["status"] == "passed"}
    # the shell-less image still gets its in-container faults (setns): cdi-read-only runs
    assert ran >= UNREADY_FAULTS, run["_output"]
    # liveness is checked by every check's restore: none said the kubelet killed the plugin
    notes = [n for c in run["checks"] for n in c.get("notes", []) if "liveness" in n]
    assert not notes, notes
    report = json.loads((tmp_path / "exec" / "cluster-cluster.json").read_text())
    assert report["cleanup_ok"], report["verification"]


def test_a_plugin_that_never_recovers_leaves_the_rest_blocked(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    profile = variant_profile(tmp_path, "never-back-after-stream-lost", base=EXEC_PROFILE)
    run = _run(cluster, tmp_path / "mutant", profile, "--recovery-timeout", "20", "--", "-k",
               NEVER_BACK_SELECTION)  # fmt: skip
    got = {c["id"]: c["status"] for c in run["checks"]}
    assert got == NEVER_BACK_VERDICTS, run["_output"]
    for check in run["checks"]:
        if check["status"] == "blocked":
            assert "stream-lost left the node dirty" in check["reason"], check["reason"]
            assert "also after a restart of the plugin" in check["reason"], check["reason"]
