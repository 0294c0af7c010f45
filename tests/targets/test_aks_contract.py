"""The AKS target end to end against RECORDED CONTRACTS (fake az, API stand-in with exec).

Never live results: the cluster report carries environment.contract = true.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.node import CAP_DEVICE_VIEW, CAP_GUEST, CAP_LONG_GUEST, CAP_PLUGIN_RESTART
from hvconform.contract.results import EnvironmentBlocked, NotApplicable
from hvconform.targets import build_plan
from hvconform.targets.cluster.aks import AksLifecycle
from hvconform.targets.cluster.lifecycle import CleanupIncomplete, Terminated
from hvconform.targets.cluster.run import open_cluster, values_key
from tests.targets.conftest import Recorded, contract_options, recorded_objects
from tests.targets.test_kind_contract import planned_commands

AKS = pytest.mark.parametrize("recorded", [("aks", {})], indirect=True, ids=["aks"])
POOL_NODE = "aks-hvkc0ffee01-87654321-vmss000000"
DIAG = "hvconform-diag"


def aks_run(recorded: Recorded, **kw: Any) -> tuple[Any, ...]:
    options = contract_options("aks", recorded.tmp, **kw)
    objects = recorded_objects(options.plugin_namespace, options.hypervisor)
    out = recorded.tmp / "out"
    lifecycle = AksLifecycle(options.validate(), objects)
    return options, objects, out, open_cluster(lifecycle, out_dir=out)


def issued(recorded: Recorded) -> list[str]:
    """Executables and node commands (through the diagnostic pod) on one timeline."""
    return [
        f"exec {argv[1]}: {shlex.join(argv[2:])}" if argv[0] == "exec" else shlex.join(argv)
        for argv in recorded.log
    ]


def report(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "cluster-aks.json").read_text())
    return data


def fail_on_node(recorded: Recorded, regex: str) -> None:
    recorded.kube.rules["node"].insert(0, {"match": regex, "rc": 1, "stderr": "injected failure\n"})


@AKS
def test_aks_run_end_to_end_exact_commands_and_verified_cleanup(recorded: Recorded) -> None:
    options, objects, out, cm = aks_run(recorded)
    kubeconfig = f"{options.workdir}/kubeconfig-aks-c0ffee01"
    with cm as node:
        assert node.node_name == POOL_NODE and node.capacity() == 2000
        assert {CAP_GUEST, CAP_DEVICE_VIEW, CAP_PLUGIN_RESTART} <= node.capabilities
        ds_path = f"/apis/apps/v1/namespaces/{options.plugin_namespace}/daemonsets/hv-device-plugin"
        spec = recorded.kube.state.objects[ds_path]["spec"]["template"]["spec"]
        assert spec["nodeSelector"]["hyperlight.dev/conformance-run"] == "c0ffee01"
        assert {
            "key": "hyperlight.dev/conformance",
            "operator": "Exists",
            "effect": "NoSchedule",
        } in spec["tolerations"]
        assert {
            "name": "host-dev",
            "hostPath": {"path": "/var/lib/hvconform/host-dev", "type": "Directory"},
        } in spec["volumes"]
        allocation = node.allocate()
        assert allocation.ok and node.run_guest(allocation).value == 55
        node.release(allocation)
        back = node.restart_kubelet(graceful=False)
        assert (node.last_registration_at() or 0) > back
        assert os.path.exists(kubeconfig)
    assert recorded.commands("az") == [
        "account show --output json",
        "aks get-credentials --resource-group rg-contract --name aks-contract"
        f" --file {kubeconfig} --overwrite-existing",
        "aks nodepool add --resource-group rg-contract --cluster-name aks-contract --name hvkc0ffee01"
        " --mode User --node-count 1 --node-vm-size Standard_D4ads_v5 --os-sku Ubuntu"
        " --node-taints hyperlight.dev/conformance=c0ffee01:NoSchedule --labels hyperlight.dev/enabled=true"
        " hyperlight.dev/hypervisor=kvm hyperlight.dev/conformance-run=c0ffee01 --tags hvconform-run=c0ffee01"
        " --output json",
        "aks nodepool delete --resource-group rg-contract --cluster-name aks-contract"
        " --name hvkc0ffee01 --output none",
        "aks nodepool list --resource-group rg-contract --cluster-name aks-contract"
        " --query [].name --output json",
    ]
    plan = planned_commands(build_plan("aks", options, objects=objects))
    assert [c for c in issued(recorded) if c in plan] == plan
    requests = recorded.kube.requests
    dry = [i for i, r in enumerate(requests) if "dryRun=All" in r]
    pool_added = [
        i for i, argv in enumerate(recorded.log) if argv[:4] == ["az", "aks", "nodepool", "add"]
    ]
    assert dry and pool_added, "a server-side dry run, then the pool"
    assert any(f"pods/{DIAG}/exec" in r for r in requests) and not os.path.exists(kubeconfig)
    data = report(out)
    assert data["environment"]["contract"] is True and data["cleanup_ok"] is True
    assert {k for k, v in data["verification"].items() if v["ok"]} == {
        "node pool deleted",
        "objects deleted",
        "diagnostic pod gone",
        "original node labels unchanged",
        "pre-existing pods unchanged (UIDs, restart counts)",
        "temporary kubeconfig removed",
    }
    assert recorded.run_objects() == []


@pytest.mark.parametrize(
    "recorded",
    [
        (
            "aks",
            {
                "api": {
                    "deny_dry_run": {
                        "match": "hostPath",
                        "code": 403,
                        "reason": "Forbidden",
                        "message": 'admission webhook "validation.gatekeeper.sh" denied the request: '
                        "[azurepolicy-k8sazurev1restrictedhostpath] HostPath volumes are not allowed",
                    }
                }
            },
        )
    ],
    indirect=True,
    ids=["safeguards"],
)
def test_automatic_safeguards_are_environment_blocked_before_any_pool(recorded: Recorded) -> None:
    _, _, out, cm = aks_run(recorded)
    with pytest.raises(EnvironmentBlocked, match="gatekeeper"), cm:
        pytest.fail("the dry run should have stopped the run")
    assert not [c for c in recorded.commands("az") if c.startswith("aks nodepool add")]
    data = report(out)
    assert data["cleanup_ok"] and recorded.run_objects() == []


@AKS
@pytest.mark.parametrize(
    ("devices", "hypervisor", "reason"),
    [("", "kvm", "neither /dev/kvm nor /dev/mshv"), ("/dev/mshv\n", "kvm", "never mixes")],
)
def test_a_node_without_the_device_is_not_applicable(
    recorded: Recorded, devices: str, hypervisor: str, reason: str
) -> None:
    recorded.kube.rules["node"].insert(
        0, {"match": "for d in /dev/kvm /dev/mshv", "stdout": devices}
    )
    _, _, out, cm = aks_run(recorded, hypervisor=hypervisor)
    with pytest.raises(NotApplicable, match=reason), cm:
        pytest.fail("never a pass")
    assert any(c.startswith("aks nodepool delete") for c in recorded.commands("az"))
    assert report(out)["cleanup_ok"]


@AKS
def test_mshv_pool_uses_azure_linux_kata_and_declares_no_guest(recorded: Recorded) -> None:
    node_path = f"/api/v1/nodes/{POOL_NODE}"
    labels = recorded.kube.state.objects[node_path]["metadata"]["labels"]
    labels.update({"hyperlight.dev/hypervisor": "mshv", "agentpool": "hvmc0ffee01"})
    rules = recorded.kube.rules["node"]
    rules.insert(0, {"match": "for d in /dev/kvm /dev/mshv", "stdout": "/dev/mshv\n"})
    rules.insert(
        0, {"match": r"stat -c .* /dev/mshv$", "stdout": "character special file|600|0|0|a|e9\n"}
    )
    options, _, _, cm = aks_run(recorded, hypervisor="mshv")
    with cm as node:
        assert CAP_GUEST not in node.capabilities and CAP_LONG_GUEST not in node.capabilities
        assert CAP_DEVICE_VIEW not in node.capabilities and node.session_guest is None
        assert node.host_device_metadata()["minor"] == 233
        assert node.allocate().ok
    add = next(c for c in recorded.commands("az") if c.startswith("aks nodepool add"))
    assert "--os-sku AzureLinux --workload-runtime KataVmIsolation" in add
    assert "hyperlight.dev/hypervisor=mshv" in add and "kvm" not in add
    ds = next(
        r for r in recorded.kube.requests if r.startswith("POST") and r.endswith("/daemonsets")
    )
    assert ds and values_key(options) == "aks-mshv"


@AKS
def test_verification_reports_a_disturbed_pre_existing_pod(recorded: Recorded) -> None:
    _, _, out, cm = aks_run(recorded)
    with pytest.raises(CleanupIncomplete), cm:
        path = "/api/v1/namespaces/kube-system/pods/coredns-6f5c8d7b9-abcde"
        recorded.kube.state.objects[path]["status"]["containerStatuses"][0]["restartCount"] = 1
    failed = {k: v for k, v in report(out)["verification"].items() if not v["ok"]}
    assert list(failed) == ["pre-existing pods unchanged (UIDs, restart counts)"]
    assert "kube-system/coredns-6f5c8d7b9-abcde: restarted" in failed[next(iter(failed))]["detail"]


AKS_FAULTS = {
    "az-account": ("cmd", r"^az account show"),
    "credentials": ("cmd", r"^az aks get-credentials"),
    "snapshot": ("api", r"^GET /api/v1/pods$"),
    "namespaces": ("api", r"^POST /api/v1/namespaces$"),
    "dry-run": ("api", r"dryRun=All"),
    "nodepool-add": ("cmd", r"^az aks nodepool add"),
    "node-wait": ("api", r"^GET /api/v1/nodes\?labelSelector"),
    "diag-pod": ("api", r"^POST /api/v1/namespaces/hvconform-diag-c0ffee01/pods$"),
    "node-check": ("node", r"for d in /dev/kvm"),
    "node-prepare": ("node", r'mknod -m 0600 "/var/lib/hvconform/host-dev'),
    "apply": ("api", r"^POST /apis/apps/v1/namespaces/[^/]+/daemonsets$"),
    "rollout": ("api", r"^GET /apis/apps/v1/namespaces/[^/]+/daemonsets/"),
    "baseline": ("node", r"zz-unrelated-vendor\.json \S+$"),
}


def test_every_aks_setup_step_has_a_fault(tmp_path: Path) -> None:
    options = contract_options("aks", tmp_path)
    steps = build_plan("aks", options, objects=recorded_objects(options.plugin_namespace))
    assert {s.id for s in steps if s.phase == "setup"} == set(AKS_FAULTS)


@AKS
@pytest.mark.parametrize("failing", list(AKS_FAULTS))
def test_cleanup_runs_after_a_failure_at_every_aks_step(recorded: Recorded, failing: str) -> None:
    how, regex = AKS_FAULTS[failing]
    {"cmd": recorded.fail_command, "api": recorded.fail_request}.get(
        how, lambda r: fail_on_node(recorded, r)
    )(regex)
    options, objects, out, cm = aks_run(recorded)
    with pytest.raises(Exception), cm:  # noqa: B017 - each step fails its own way
        pytest.fail("setup should have failed")
    setup = [s for s in build_plan("aks", options, objects=objects) if s.phase == "setup"]
    reached = setup[: [s.id for s in setup].index(failing) + 1]
    armed = [s.arms for s in reached if s.arms]
    data = report(out)
    assert [s["id"] for s in data["steps"] if s["phase"] == "setup"] == [s.id for s in reached]
    cleanup = [s for s in data["steps"] if s["phase"] == "cleanup"]
    assert [s["id"] for s in cleanup] == list(reversed(armed))
    assert all(s["status"] == "ok" for s in data["steps"] if s["phase"] != "setup"), data["steps"]
    deleted = any(c.startswith("aks nodepool delete") for c in recorded.commands("az"))
    assert deleted == ("nodepool-delete" in armed)
    assert not os.path.exists(f"{options.workdir}/kubeconfig-aks-c0ffee01")
    assert recorded.run_objects() == []


@AKS
def test_sigterm_removes_the_pool(recorded: Recorded) -> None:
    _, _, out, cm = aks_run(recorded)
    with pytest.raises(Terminated), cm as node:
        os.kill(os.getpid(), signal.SIGTERM)
        node.capacity()
    assert any(c.startswith("aks nodepool delete") for c in recorded.commands("az"))
    assert report(out)["cleanup_ok"] and recorded.run_objects() == []
