"""The existing-cluster target LIVE: `node-up --nodes 1`, the images imported into the node's
containerd, `hvconform run --target cluster` through both node-access routes, node-down.

Nothing here is recorded: a real API server, DaemonSet rollout, kubelet, containerd with CDI and
a real KVM guest. Needs the node built (`nox -s node-build`; skipped with that reason when it is
not, as on a fresh CI machine) and no other node up on this machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.targets.realnode import NODE_NAME
from tests.realnode.live_runs import cluster_mode_nodes, run_output

USES_NODE_STACK = True  # conftest: one node stack at a time on this machine
# each test is a whole hvconform run on a real cluster (the first also brings the node up): the
# suite's 300 s default stopped the DRA run mid-way on a loaded CI machine
pytestmark = pytest.mark.timeout(1800)

# Checks no route of this target can make (the reason is recorded with them).
NOT_APPLICABLE = {
    "atomic-replacement",
    "optional-rpcs",
    # issue 26 without --allow-node-reboot: a cluster the run did not create is not rebooted
    # (and through the diagnostic pod, an exec the reboot would cut, not even with it) ...
    "node-reboot",
    # ... and the manifests applied unchanged give the plugin the node's real /dev.
    "device-late",
}  # workloads-survive-kubelet-restart, health-in-pod-status (pod-resources read by the diag
# image's python3) and stream-lost (ss and perl on the node) run


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    with cluster_mode_nodes(1) as made:
        yield made


def _run(cluster: dict[str, str], out: Path, access: str, *extra: str) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "hvconform.cli", "run", "--target", "cluster",
        "--kubeconfig", cluster["kubeconfig"], "--node", NODE_NAME,
        "--node-access", access, "--image", cluster["plugin"], "--guest-image", cluster["guest"],
        "--diag-image", cluster["guest"], "--out", str(out), *extra,
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, run_output(proc, out)
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    report: dict[str, Any] = json.loads((out / "cluster-cluster.json").read_text())
    return {"results": results, "report": report}


def _assert_live_and_clean(run: dict[str, Any], expect: set[str]) -> None:
    statuses = {c["id"]: c["status"] for c in run["results"]["checks"]}
    assert {i for i, s in statuses.items() if s == "passed"} >= expect, statuses
    assert not [i for i, s in statuses.items() if s == "failed"], statuses
    report = run["report"]
    assert report["contract"] is False and report["cleanup_ok"], report["verification"]
    for name in ("objects deleted", "node state dir removed", "host device metadata (final)"):
        assert report["verification"][name]["ok"], name
    process = report["environment"]["plugin_process"]
    assert process["CapEff"] == "0" * 16 and process["NoNewPrivs"] == "1", process
    # issue 38: the node's runtime as its daemon says it, asked through the node access route
    runtimes = run["results"]["environment"]["container_runtime"]
    assert runtimes and all(r.get("cdi_enabled") is True for r in runtimes), runtimes


def test_pod_route_runs_the_whole_catalogue(cluster: dict[str, str], tmp_path: Path) -> None:
    run = _run(cluster, tmp_path / "pod", "pod")
    every = {c["id"] for c in run["results"]["checks"]} - NOT_APPLICABLE  # cleanup too
    _assert_live_and_clean(run, every)
    assert run["report"]["verification"]["diagnostic pod gone"]["ok"]
    # applied as `hvconform manifests` prints them, the chart's Namespace apart: the run's own
    # namespace replaces it (blast radius: a run never applies a profile's Namespace)
    applied = [
        o
        for o in yaml.safe_load_all((tmp_path / "pod" / "cluster" / "manifests.yaml").read_bytes())
        if o
    ]
    ns = next(o["metadata"]["namespace"] for o in applied if o["kind"] == "DaemonSet")
    printed = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "manifests", "--target", "kind",
         "--image", cluster["plugin"], "--namespace", ns],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    # the objects `hvconform manifests` prints, through the shipped profile (the same chart)
    assert applied == [o for o in yaml.safe_load_all(printed) if o and o["kind"] != "Namespace"]


def test_direct_route_faults_and_restarts(cluster: dict[str, str], tmp_path: Path) -> None:
    run = _run(cluster, tmp_path / "direct", "direct", "-m", "identity or restart or cdi")
    expect = {"identity-missing", "device-unusable", "restart-plugin", "restart-kubelet",
              "cdi-read-only", "cdi-non-regular"}  # fmt: skip
    _assert_live_and_clean(run, expect)
    assert "diagnostic pod gone" not in run["report"]["verification"]


def test_a_dra_driver_is_judged_on_the_cluster(cluster: dict[str, str], tmp_path: Path) -> None:
    """This repository's driver from its profile's deploy section (the chart in mode: dra),
    reaching the API server in-cluster through the kubernetes Service's address."""
    from hvconform.contract.plugin import SHIPPED_DRA

    run = _run(cluster, tmp_path / "dra", "direct", "--plugin-profile", str(SHIPPED_DRA))
    expect = {"cdi-missing", "cdi-read-only", "identity-missing", "device-unusable",
              "restart-plugin", "preservation", "dra-kubelet-restart", "dra-pod-while-kubelet-down",
              "dra-prepare-retried", "dra-shared-device", "dra-no-spec-left", "guest-execution",
              "plugin-identity"}  # fmt: skip
    _assert_live_and_clean(run, expect)
    judged = {c["id"] for c in run["results"]["checks"]}
    assert not judged & {"stream-lost", "registration-failure", "optional-rpcs"}, judged
