"""The real node target (`--target node`) runs a plugin as its profile describes it.

A plugin with fixed standard paths (the Go fixture: /var/lib/kubelet/device-plugins, /var/run/cdi,
gRPC Health only, its own resource and CDI kind) is certified on the real kubelet: every check
that the target can make passes, none is not_applicable for want of directory flags, and a
defect is still caught there (faults reach the plugin's own mount namespace). The unit half
needs no node; the live half needs the node built (`nox -s node-build`; skipped with that
reason when it is not, as on a fresh CI machine) and starts the node itself unless `nox -s
node-up` already did.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hvconform.contract.node import (
    CAP_DEVICE_REMAP,
    CAP_LIVENESS,
    CAP_READINESS,
    CAP_SOCKET_REDIRECT,
)
from hvconform.contract.plugin import SHIPPED, Probe, load_profile
from hvconform.targets.realnode import BIN, CDI_DIR, HOST_DEV, PLUGIN_DIR, REPO, procs
from hvconform.targets.realnode.node import WORKLOAD_CAPABILITIES, RealNode
from hvconform.targets.realnode.sandboxed import (
    host_network_argv,
    observed_capabilities,
    plugin_binds,
)
from tests.fixture_plugins import build_go_kvm
from tests.realnode.live_runs import run_node, statuses

USES_NODE_STACK = True  # conftest: one node stack at a time on this machine
# the first test waits for that lock inside its own timeout (other modules hold it for minutes)
pytestmark = pytest.mark.timeout(1800)

GO_KVM = REPO / "fixtures" / "plugins" / "go-kvm" / "profile.yaml"
# What the node target cannot make for any plugin: it deploys no DaemonSet to roll, and it does
# not see the plugin's GetPreferredAllocation answer to the kubelet. The Go fixture declares
# no optional RPC anyway. Issue 26's five checks run here against the real kubelet.
NOT_APPLICABLE = {"rollout-safety", "optional-rpcs"}
WORKLOAD_CHECKS = (
    "workloads-survive-kubelet-restart",
    "node-reboot",
    "device-late",
    "stream-lost",
    "health-in-pod-status",
)


def test_fixed_path_plugin_gets_the_node_dirs_where_it_looks() -> None:
    plugin = load_profile(GO_KVM)
    assert plugin_binds(plugin) == [
        (str(PLUGIN_DIR), "/var/lib/kubelet/device-plugins"),
        (str(CDI_DIR), "/var/run/cdi"),
    ]
    shipped = load_profile(SHIPPED)
    assert (str(HOST_DEV), "/host-dev") in plugin_binds(shipped)


def test_the_command_runs_as_is_nothing_appended() -> None:
    for profile in (GO_KVM, SHIPPED):
        plugin = load_profile(profile)
        argv = host_network_argv(plugin, "127.0.0.1:18080")
        assert argv[argv.index("--") + 1 :] == plugin.argv("127.0.0.1:18080")
        for flag in ("--device-plugin-dir", "--cdi-dir"):
            assert flag not in argv
    # a top-level directory (/host-dev) only exists in a staged root
    assert "--stage-root" in host_network_argv(load_profile(SHIPPED), "127.0.0.1:1")
    assert "--stage-root" not in host_network_argv(load_profile(GO_KVM), "127.0.0.1:1")


def test_health_is_a_capability_only_when_the_profile_can_observe_it(tmp_path: Path) -> None:
    plugin = load_profile(GO_KVM)
    assert observed_capabilities(plugin) == {CAP_READINESS, CAP_LIVENESS}
    blind = replace(plugin, readiness=Probe(), liveness=Probe())
    assert observed_capabilities(blind) == frozenset()
    node = RealNode(out_dir=tmp_path, worker="t", plugin=blind)
    assert not {CAP_READINESS, CAP_LIVENESS} & node.capabilities
    # faults of the plugin's own view are made in its mount namespace, whatever its paths
    assert {CAP_SOCKET_REDIRECT, CAP_DEVICE_REMAP} <= node.capabilities
    # pods, reboots, a late device, a kubelet-ended stream, device health in pod status
    assert node.capabilities >= WORKLOAD_CAPABILITIES
    assert node.resource == "example.org/kvm"  # declared in the profile
    undeclared = replace(load_profile(SHIPPED), resource=None, cdi_kind=None, cdi_spec=None)
    shipped = RealNode(out_dir=tmp_path, worker="u", plugin=undeclared)
    assert shipped.resource == "" and shipped.spec_name == ""  # discovered from the plugin
    assert {CAP_READINESS, CAP_LIVENESS} <= shipped.capabilities  # its http probes


# -- live -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node_built() -> None:
    missing = [n for n in ("kubelet", "kube-apiserver", "etcd", "crictl") if not (BIN / n).exists()]
    if missing:
        pytest.skip(f"the node is not built ({', '.join(missing)}): run `nox -s node-build`")
    if (p := procs.recorded("plugin")) is not None and p.alive:
        pytest.skip("node-up --plugin runs a plugin on the node: `nox -s node-down` first")


def _variant(tmp_path: Path, env: dict[str, str]) -> Path:
    """The fixture's profile with its defect switched on (its deploy section left out: the node
    target runs the command)."""
    build_go_kvm()
    data = yaml.safe_load(GO_KVM.read_text())
    data["command"] = [str(GO_KVM.parent / "bin" / "go-kvm"), "-v=2"]
    data["env"] = env
    data.pop("deploy", None)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.root
@pytest.mark.kvm
@pytest.mark.slow
@pytest.mark.timeout(1600)
def test_a_fixed_path_plugin_is_certified_on_the_real_kubelet(
    node_built: None, tmp_path: Path
) -> None:
    build_go_kvm()
    data = run_node(tmp_path, GO_KVM)
    got = statuses(data)
    want = {check: "not_applicable" if check in NOT_APPLICABLE else "passed" for check in got}
    assert got == want, data["_output"]
    assert {"cdi-missing", "registration-failure", "device-unusable", "cleanup"} <= set(got)
    # what ran, read back from the kernel, is the profile's command, unchanged
    plugin = load_profile(GO_KVM)
    for read in data["run"]["plugin_ran"]:
        assert read["how"] == "process", read
        assert read["argv"] == plugin.argv() and read["exe"] == plugin.argv()[0], read
    by_id = {c["id"]: c for c in data["checks"]}
    assert by_id["restart-kubelet"]["metrics"]["reregistration_s"] < 5
    # issue 26 on the real kubelet: its figures are measured there
    assert set(WORKLOAD_CHECKS) <= set(got)
    assert 0 < by_id["stream-lost"]["metrics"]["reregistration_s"] < 5
    assert by_id["node-reboot"]["metrics"]["boot_to_registered_s"] > 0
    kept = by_id["workloads-survive-kubelet-restart"]["metrics"]
    assert kept["pods_kept_graceful"] >= 1 and kept["pods_kept_crash"] >= 1
    # issue 38: the runtime as its running daemon says it, CDI on and reading the node's dir
    (runtime,) = data["environment"]["container_runtime"]
    assert runtime["name"] == "containerd" and runtime["version"], runtime
    assert runtime["cdi_enabled"] is True and runtime["cdi_spec_dirs"], runtime


@pytest.mark.root
@pytest.mark.kvm
@pytest.mark.slow
def test_a_plugin_that_never_probes_fails_device_unusable_there(
    node_built: None, tmp_path: Path
) -> None:
    profile = _variant(tmp_path, {"GOKVM_DEFECT": "no-probe"})
    data = run_node(tmp_path, profile, "-m", "identity", "--recovery-timeout", "10")
    got = statuses(data)
    assert got["device-unusable"] == "failed", data["_output"]
    # a plugin that never probes hands out a device that does not exist yet; the node is
    # restored after that failure too (the restore of a plugin started without its device)
    assert got["device-late"] == "failed", data["_output"]
    assert got["cleanup"] == "passed", data["_output"]
    assert "not_applicable" not in {got["identity-missing"], got["device-unusable"]}
