"""Issue 38 on the real node target: the whole catalogue on containerd 2.x, LIVE.

The node runs containerd CONTAINERD2_VERSION and runc RUNC_VERSION built from their modules
(`--node-runtime containerd-2.3`: config version 3, CDI under the CRI runtime plugin), and this
repository's plugin and the go-kvm fixture get the verdicts they get on Debian's containerd
1.7.24 (tests/realnode/test_node_target.py and the shipped profile's node run): every check the
node target can make passes. The runtime is named as its daemon says it (crictl), CDI on. A
containerd 2.x with CDI disabled (`containerd-2.3-cdi-off`, the stand-in for containerd 2.0's
silent drop of CDI requests) is reported as the runtime's failure, with the fix: every check
environment_blocked (exit 6), none failed; so is one that reads its CDI specs from a dir the
plugin does not write to (`containerd-2.3-cdi-elsewhere`: a spec the runtime cannot resolve),
each saying which side failed and why. A cluster-mode node (`node-up --nodes 1
--node-runtime containerd-2.3`) runs the cluster target's guest and CDI checks there too.

Runs in `nox -s node-containerd2` (it builds containerd 2.x and runc first: apart from `tests`
for CI's time, two whole catalogues on the node stack); needs `nox -s node-build`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.plugin import SHIPPED
from hvconform.contract.preconditions import EXIT_ENVIRONMENT_BLOCKED
from hvconform.targets.realnode import CDI_DIR, CONTAINERD2_VERSION, NODE_NAME, REPO
from hvconform.targets.realnode.runtimes import RUNTIMES
from tests.fixture_plugins import build_go_kvm
from tests.realnode.live_runs import (
    cluster_mode_nodes,
    live_module,
    run_node,
    run_output,
    skip_unless_live,
    statuses,
)

USES_NODE_STACK = live_module("HV_CONTAINERD2_LIVE")
pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow, pytest.mark.timeout(2400)]
RUNTIME = "containerd-2.3"
GO_KVM = REPO / "fixtures" / "plugins" / "go-kvm" / "profile.yaml"
# As on containerd 1.7: the node target deploys no DaemonSet to roll and does not see the
# plugin's GetPreferredAllocation answer; the Go fixture declares no optional RPC anyway.
NOT_APPLICABLE = {"rollout-safety", "optional-rpcs"}


@pytest.fixture(scope="module", autouse=True)
def _containerd2() -> None:
    skip_unless_live("HV_CONTAINERD2_LIVE", "node-containerd2")
    if missing := RUNTIMES[RUNTIME].missing():
        pytest.skip(f"{RUNTIME}: {', '.join(missing)} not built ({RUNTIMES[RUNTIME].fix})")


def _on_containerd2(data: dict[str, Any]) -> None:
    (runtime,) = data["environment"]["container_runtime"]
    assert runtime["name"] == "containerd", runtime
    assert runtime["version"].startswith(CONTAINERD2_VERSION.lstrip("v")), runtime
    assert runtime["cdi_enabled"] is True and runtime["cdi_spec_dirs"], runtime


@pytest.mark.parametrize("profile", [SHIPPED, GO_KVM], ids=["this-repository", "go-kvm"])
def test_the_whole_catalogue_on_containerd_2(tmp_path: Path, profile: Path) -> None:
    if profile == GO_KVM:
        build_go_kvm()
    data = run_node(tmp_path, profile, "--node-runtime", RUNTIME, timeout=2200)
    got = statuses(data)
    want = {c: "not_applicable" if c in NOT_APPLICABLE else "passed" for c in got}
    assert got == want, data["_output"]
    assert {"guest-execution", "cdi-missing", "restart-kubelet", "node-reboot"} <= set(got)
    _on_containerd2(data)


def test_a_runtime_with_cdi_off_is_blamed_never_the_plugin(tmp_path: Path) -> None:
    data = run_node(tmp_path, SHIPPED, "--node-runtime", "containerd-2.3-cdi-off", "-m", "guest")
    got = statuses(data)
    assert set(got.values()) == {"environment_blocked"}, data["_output"]
    assert data["run"]["exit_code"] == EXIT_ENVIRONMENT_BLOCKED
    (reason,) = {c["reason"] for c in data["checks"]}
    assert reason.startswith("the container runtime keeps CDI devices from workloads: containerd")
    assert "reports CDI off" in reason and "fix: enable CDI in the runtime" in reason


def test_a_runtime_that_cannot_resolve_the_spec_is_blamed_never_the_plugin(tmp_path: Path) -> None:
    """Which side failed: the plugin writes its spec to the node's CDI dir; the runtime (CDI on)
    reads another, so it cannot resolve what the allocation names. The runtime's side."""
    runtime = "containerd-2.3-cdi-elsewhere"
    data = run_node(tmp_path, SHIPPED, "--node-runtime", runtime, "-m", "guest")
    got = statuses(data)
    assert set(got.values()) == {"environment_blocked"}, data["_output"]
    assert data["run"]["exit_code"] == EXIT_ENVIRONMENT_BLOCKED
    (reason,) = {c["reason"] for c in data["checks"]}
    assert reason.startswith("the container runtime cannot resolve the plugin's CDI devices: ")
    assert f"reads CDI specs from {CDI_DIR}-unread" in reason, reason
    assert f"the plugin writes its spec to {CDI_DIR}" in reason and "fix: add" in reason
    # the runtime as its daemon says it, in the reason (the node never came up: the run's
    # environment records a runtime only for a node that did)
    assert f"containerd {CONTAINERD2_VERSION.lstrip('v')}+" in reason, reason


def _cluster_run(made: dict[str, str], out: Path, marks: str) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable, "-m", "hvconform.cli", "run", "--target", "cluster",
        "--kubeconfig", made["kubeconfig"], "--node", NODE_NAME, "--node-access", "pod",
        "--image", made["plugin"], "--guest-image", made["guest"],
        "--diag-image", made["guest"], "--out", str(out), "-m", marks,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=REPO)


def test_a_cluster_mode_node_on_containerd_2_runs_the_guest_and_cdi_checks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with cluster_mode_nodes(1, RUNTIME) as made:
        proc = _cluster_run(made, out, "guest or cdi")
    assert proc.returncode == 0, run_output(proc, out)
    data = json.loads((out / "results.json").read_text())
    assert {c["status"] for c in data["checks"]} == {"passed"}, run_output(proc, out)
    _on_containerd2(data)


def test_a_cluster_nodes_runtime_with_cdi_off_is_blamed_never_the_plugin(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with cluster_mode_nodes(1, "containerd-2.3-cdi-off") as made:
        proc = _cluster_run(made, out, "guest")
    data = json.loads((out / "results.json").read_text())
    assert proc.returncode == EXIT_ENVIRONMENT_BLOCKED, run_output(proc, out)
    assert {c["status"] for c in data["checks"]} == {"environment_blocked"}, run_output(proc, out)
    (reason,) = {c["reason"] for c in data["checks"]}
    assert "reports CDI off" in reason and "the plugin writes CDI spec" in reason, reason
