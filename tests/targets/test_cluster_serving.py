"""Issue 39 without a cluster: a serving node judged in validate mode (`--deployed`), the suite in
the node's own pod (`--node-access host-pid`), and the refusals that keep a serving node from
being disturbed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hvconform.contract.results import EnvironmentBlocked
from hvconform.targets.cluster.access import NSENTER, CommandRunner, HostPidAccess
from hvconform.targets.cluster.existing import ExistingLifecycle
from hvconform.targets.cluster.kube import ExecResult
from hvconform.targets.cluster.serving import ServingLifecycle
from tests.targets.test_cluster_target import KUBECONFIG, options

DEPLOYED = "kube-system/hv-device-plugin"


def _cli(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "run", "--target", "cluster", "--node",
         "hv-node-7", "--kubeconfig", str(KUBECONFIG), *extra],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_a_serving_plugin_is_read_never_applied_restarted_nor_deleted() -> None:
    proc = _cli("--mode", "validate", "--deployed", DEPLOYED, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    plan = proc.stdout
    assert "validate mode" in plan and f"read DaemonSet {DEPLOYED}" in plan
    ids = ServingLifecycle(options(mode="validate", deployed=DEPLOYED)).steps()
    steps = [s.id for s in ids]
    assert steps[:4] == ["metadata-snapshot", "cluster-check", "adopt", "namespaces"]
    for step in ("apply", "rollout", "delete-plugin", "node-prepare", "node-restore"):
        assert step not in steps, f"{step} would touch the serving plugin or its node"


def test_the_serving_run_creates_only_its_own_namespaces() -> None:
    lifecycle = ServingLifecycle(options(mode="validate", deployed=DEPLOYED))
    kinds = {(o["kind"], o["metadata"]["name"]) for o in lifecycle.objects}
    assert all(kind == "Namespace" for kind, _ in kinds), kinds
    assert ("Namespace", "kube-system") not in kinds, "the plugin's namespace is the caller's"


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--deployed", DEPLOYED), "only with --mode validate"),
        (("--mode", "validate", "--deployed", "x"), "NAMESPACE/DAEMONSET"),
        (("--node-access", "hostpid"), "invalid choice"),
    ],
)
def test_a_serving_input_that_would_disturb_or_is_malformed_is_refused(
    extra: tuple[str, ...], words: str
) -> None:
    proc = _cli(*extra, "--dry-run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr


def test_the_full_catalogue_from_the_nodes_pod_needs_a_cordoned_node() -> None:
    plugin_ds = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "p", "namespace": "hv"},
        "spec": {"selector": {"matchLabels": {"app": "p"}},
                 "template": {"spec": {"containers": [{"name": "plugin"}]}}},
    }  # fmt: skip

    def lifecycle(**kw: object) -> ExistingLifecycle:
        return ExistingLifecycle(options(node_access="host-pid", **kw), [plugin_ds])

    serving = {"spec": {}}
    cordoned = {"spec": {"unschedulable": True}}
    with pytest.raises(EnvironmentBlocked, match="kubectl cordon hv-node-7"):
        lifecycle()._may_disturb("hv-node-7", serving)
    lifecycle()._may_disturb("hv-node-7", cordoned)
    lifecycle(allow_disruption=True)._may_disturb("hv-node-7", serving)
    lifecycle(mode="validate")._may_disturb("hv-node-7", serving)


def test_host_pid_access_enters_pid_1s_namespaces_from_the_pod() -> None:
    """In the node's hostPID pod, PID 1 is the node's init: every node command is entered
    there (what it does on a node is the live test's: nox -s sonobuoy-live)."""
    seen: list[list[str]] = []

    class Recorder(CommandRunner):
        def run(self, argv: list[str], *, timeout: float = 900, check: bool = True) -> ExecResult:
            seen.append(argv)
            return ExecResult(0, b"ok\n", b"")

    access = HostPidAccess("hv-node-7", Recorder())
    assert access.run(["stat", "/dev/kvm"]).stdout == b"ok\n"
    assert seen == [[*NSENTER, "stat", "/dev/kvm"]]
    assert access.wrap(["true"]).endswith(" ".join([*NSENTER, "true"]))
