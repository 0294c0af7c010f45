"""The DRA mode LIVE (issue 28): this plugin as a DRA driver beside a real v1.37.2 kubelet, API
server, scheduler and containerd with CDI (the node stack), judged on what the kubelet's and
the scheduler's code does with it, nothing recorded:

- the kubelet's plugin watcher takes the registration (pkg/kubelet/pluginmanager; the driver's
  readiness follows it) and the driver publishes its node's ResourceSlice;
- a pod spec unchanged from the device-plugin world (limits hyperlight.dev/hypervisor: 1) is
  served through the chart's DeviceClass (extendedResourceName, KEP-5004, GA in v1.37): the
  scheduler allocates the device, the kubelet calls NodePrepareResources, containerd injects
  /dev/kvm from the claim's CDI spec, and a KVM guest runs in the pod;
- a kubelet restart while the claim is prepared keeps the pod running (the kubelet prepares
  again; the driver answers the same), and the driver republishes the slice the restarted
  kubelet wiped (dra_plugin_manager.go wipeResourceSlices);
- once the pod is gone the kubelet unprepares the claim and no CDI spec is left
  (test/e2e_node/dra_test.go);
- a pod naming a ResourceClaim in resources.claims sees the driver's health stream (dra-health
  v1) in its allocatedResourcesStatus; the extended-resource path gets none in v1.37.2 (the
  kubelet skips containers without resources.claims: manager.go UpdateAllocatedResourcesStatus).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hv_device_plugin.api.dra_wire import PLUGINS_DIR, PLUGINS_REGISTRY_DIR
from hv_device_plugin.api.names import DRA_DRIVER, HYPERVISOR_RESOURCE
from hvconform.contract.wait import wait_for
from hvconform.targets.realnode import BIN, CDI_DIR, NODE_NAME, REPO, procs, stack
from hvconform.targets.realnode.configs import NAMESPACE, PKI, workload_pod
from hvconform.targets.realnode.kubeapi import Api, ApiError
from tests.chart.helm import template
from tests.realnode.live_runs import kvm

USES_NODE_STACK = True  # conftest: one node stack at a time on this machine

# a timeout per test that also covers the module's node stack coming up (pytest-timeout counts
# fixture setup): on a loaded machine the stack and the kubelet's unprepare take minutes
pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow, pytest.mark.timeout(1800)]
RESOURCE_API = "/apis/resource.k8s.io/v1"
DRIVER_DIR = Path(PLUGINS_DIR) / DRA_DRIVER
LIVE_S = 90.0


@pytest.fixture(scope="module")
def node() -> Iterator[Api]:
    missing = [n for n in ("kubelet", "kube-apiserver", "kube-scheduler") if not (BIN / n).exists()]
    if missing:
        pytest.skip(f"the node is not built ({', '.join(missing)}): run `nox -s node-build`")
    if (p := procs.recorded("kubelet")) is not None and p.alive:
        pytest.skip("a node is already up on this machine: `nox -s node-down` first")
    before = kvm()
    try:
        api = stack.up()
        assert api is not None
        yield api
    finally:
        left = stack.down()
        assert not left, f"node-down left: {left}"
        assert kvm() == before, "/dev/kvm changed"


@pytest.fixture(scope="module")
def driver(
    node: Api, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes]]:
    DRIVER_DIR.mkdir(parents=True, exist_ok=True)  # under the stack's kubelet root: node-down
    Path(PLUGINS_REGISTRY_DIR).mkdir(parents=True, exist_ok=True)
    log = (tmp_path_factory.mktemp("dra") / "driver.log").open("wb")
    argv = [sys.executable, "-m", "hv_device_plugin", "--mode", "dra", "--node-name", NODE_NAME,
            "--hypervisor-device", "/dev/kvm", "--cdi-dir", str(CDI_DIR), "--health-addr", "",
            "--kube-api-server", "https://127.0.0.1:16443", "--kube-ca-file", str(PKI / "ca.crt"),
            "--kube-client-cert", str(PKI / "admin.crt"), "--kube-client-key",
            str(PKI / "admin.key"), "--log-level", "debug"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        log.close()


def _slices(api: Api) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get(f"{RESOURCE_API}/resourceslices")["items"]
    return [s for s in items if s["spec"]["driver"] == DRA_DRIVER]


def _dra_pod(name: str, command: list[str], state: Path) -> dict[str, Any]:
    """The node target's workload pod, scheduled (not bound by nodeName): DRA allocation is the
    scheduler's, a pod bound by hand never gets a claim."""
    pod = workload_pod(name, HYPERVISOR_RESOURCE, command, state)
    del pod["spec"]["nodeName"]
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE_NAME}
    return pod


def _pod(api: Api, name: str) -> dict[str, Any] | None:
    try:
        pod: dict[str, Any] = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return pod


def _claim_specs() -> list[str]:
    return sorted(p.name for p in CDI_DIR.glob("hyperlight-claim-*.json"))


@pytest.fixture(scope="module")
def device_class(node: Api, driver: subprocess.Popen[bytes]) -> Iterator[str]:
    """The chart's own DeviceClass (mode: dra), and the driver's slice published."""
    (klass,) = [o for o in template({"mode": "dra"}) if o["kind"] == "DeviceClass"]
    node.request("POST", f"{RESOURCE_API}/deviceclasses", klass)
    try:
        wait_for(lambda: _slices(node), LIVE_S, "the driver's ResourceSlice after registration")
        (published,) = _slices(node)
        assert published["spec"]["nodeName"] == NODE_NAME
        assert [d["name"] for d in published["spec"]["devices"]] == ["kvm"]
        yield str(klass["metadata"]["name"])
    finally:
        node.request("DELETE", f"{RESOURCE_API}/deviceclasses/{klass['metadata']['name']}")


class Guest:
    """A pod whose own command counts in a KVM guest on the /dev/kvm DRA gave it."""

    def __init__(self, api: Api, state: Path, pod: dict[str, Any]) -> None:
        self.api, self.state, self.name = api, state, pod["metadata"]["name"]
        state.mkdir()
        state.chmod(0o777)
        api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

    def pod(self) -> dict[str, Any] | None:
        return _pod(self.api, self.name)

    def counter(self) -> int:
        phase = ((self.pod() or {}).get("status") or {}).get("phase")
        assert phase not in ("Failed", "Succeeded"), json.dumps(self.pod())[:1500]
        try:
            return int(json.loads((self.state / "c.json").read_text())["counter"])
        except (OSError, ValueError, KeyError):
            return 0

    def wait_counting(self, what: str) -> None:
        seen = self.counter()
        wait_for(
            lambda: self.counter() > seen + 2, LIVE_S, f"the pod's KVM guest counting ({what})"
        )

    def health(self) -> list[str]:
        statuses = ((self.pod() or {}).get("status") or {}).get("containerStatuses") or [{}]
        return [r.get("health", "") for entry in statuses[0].get("allocatedResourcesStatus") or []
                for r in entry.get("resources") or []]  # fmt: skip

    def delete(self) -> None:
        self.api.request(
            "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{self.name}?gracePeriodSeconds=0"
        )
        wait_for(lambda: self.pod() is None, LIVE_S, f"pod {self.name} deleted")


COUNTER = ["/usr/bin/python3", "-m", "hvconform.guest", "counter", "--device", "/dev/kvm",
           "--state-file", "/state/c.json", "--interval", "0.05"]  # fmt: skip


def test_the_extended_resource_through_dra_survives_a_kubelet_restart_and_leaves_nothing(
    node: Api, driver: subprocess.Popen[bytes], device_class: str, tmp_path: Path
) -> None:
    """A pod spec unchanged from the device-plugin world (limits hyperlight.dev/hypervisor: 1)."""
    api = node
    name = f"hv-dra-{uuid.uuid4().hex[:6]}"
    guest = Guest(api, tmp_path / "state", _dra_pod(name, COUNTER, tmp_path / "state"))
    guest.wait_counting("DRA-injected /dev/kvm")
    assert len(_claim_specs()) == 1, "one CDI spec for the pod's one claim"
    started = guest.pod()
    assert started is not None
    assert (started["status"].get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    # v1.37.2 reports device health in pod status only for containers naming claims in
    # resources.claims (manager.go UpdateAllocatedResourcesStatus): none for this path
    assert guest.health() == []
    kubelet = procs.recorded("kubelet")
    assert kubelet is not None
    kubelet.stop(sig=signal.SIGTERM)
    stack.start_kubelet(api)
    wait_for(lambda: _slices(api), LIVE_S, "the slice republished after the kubelet restart")
    guest.wait_counting("after the kubelet restart, the claim prepared again")
    now = guest.pod()
    assert now is not None and now["status"]["containerStatuses"][0]["restartCount"] == 0
    guest.delete()
    wait_for(lambda: not _claim_specs(), LIVE_S, "no CDI spec left after the claim's unprepare")
    assert driver.poll() is None, "the driver exited"


def test_a_claim_reports_the_devices_health_in_the_pod_status(
    node: Api, driver: subprocess.Popen[bytes], device_class: str, tmp_path: Path
) -> None:
    """A ResourceClaim named by the container: the driver's health stream (dra-health v1) is
    what the kubelet writes into allocatedResourcesStatus (ResourceHealthStatus, beta in v1.37)."""
    api = node
    claim_name = f"hv-claim-{uuid.uuid4().hex[:6]}"
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": claim_name, "namespace": NAMESPACE},
             "spec": {"devices": {"requests": [{"name": "hv",
                                                "exactly": {"deviceClassName": device_class}}]}}}  # fmt: skip
    api.request("POST", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims", claim)
    try:
        pod = _dra_pod(f"hv-dra-{uuid.uuid4().hex[:6]}", COUNTER, tmp_path / "state")
        container = pod["spec"]["containers"][0]
        del container["resources"]
        container["resources"] = {"claims": [{"name": "hv"}]}
        pod["spec"]["resourceClaims"] = [{"name": "hv", "resourceClaimName": claim_name}]
        guest = Guest(api, tmp_path / "state", pod)
        guest.wait_counting("DRA-injected /dev/kvm, by a claim")
        wait_for(lambda: guest.health() == ["Healthy"], LIVE_S, "allocatedResourcesStatus Healthy")
        guest.delete()
        wait_for(lambda: not _claim_specs(), LIVE_S, "no CDI spec left after the unprepare")
    finally:
        api.request("DELETE", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims/{claim_name}")
