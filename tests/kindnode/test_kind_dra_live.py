"""The chart's DRA mode LIVE on a real kind cluster (issue 28 beyond the bare kubelet): the
objects `mode: dra` renders with the kind target's values (the DRA driver DaemonSet, its RBAC
and ValidatingAdmissionPolicy, the DeviceClass, the bootstrap DaemonSet) applied to a fresh
one-node kind v1.37.2 cluster from the offline node image, the plugin and guest images of
`nox -s image`, and judged on what the cluster's own components do with them:

- the driver's DaemonSet rolls out (its readiness follows the kubelet's registration of the
  driver) and the driver publishes its node's ResourceSlice, through its service account's
  RBAC and past the chart's own-node admission policy; the policy type-checks on the real API
  server and refuses the driver's own token a slice of another node;
- the cluster target's workload pod, unchanged but for being scheduled (no nodeName: DRA
  allocation is the scheduler's), asks limits hyperlight.dev/hypervisor: 1 and runs the
  suite's KVM guest on the /dev/kvm the claim's CDI spec gave it (KEP-5004's
  extendedResourceName on the chart's DeviceClass);
- a pod naming a ResourceClaim of the chart's DeviceClass runs its guest too, and sees the
  driver's health stream in its allocatedResourcesStatus;
- once the pods are gone, the claims are gone and no per-claim CDI spec is left in the node;
- the cluster is deleted, nothing of it is left, and the host's /dev/kvm is unchanged.

The bare-kubelet twin is tests/realnode/test_dra_live.py. Run by `nox -s kind-live`
(HV_KIND_LIVE=1; `-- -k dra` for this module alone); skipped elsewhere with the reason.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from hv_device_plugin.api.dra_wire import PLUGINS_REGISTRY_DIR, RESOURCE_API
from hv_device_plugin.api.names import DRA_DRIVER
from hv_device_plugin.dra.kubeapi import ApiAccess, ApiError
from hv_device_plugin.dra.kubeapi import KubeApi as DriverApi
from hvconform.contract.deploy import Pods
from hvconform.contract.plugin import resolve
from hvconform.contract.wait import wait_for
from hvconform.manifests.profile import render_deploy
from hvconform.targets.cluster.access import CommandRunner
from hvconform.targets.cluster.guests import FAILED_WAITING, running
from hvconform.targets.cluster.kind import KindLifecycle
from hvconform.targets.cluster.kube import KubeApi, Obj
from hvconform.targets.cluster.plan import ClusterOptions, Step
from hvconform.targets.cluster.workloads import Layout, prepare, workload_pod
from tests.kindnode.live import assert_nothing_left, kvm, lifecycle

# the `engine` fixture is tests/kindnode/conftest.py's (shared with test_kind_live.py)
pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow]

LIVE_S = 180.0  # a cold pod on kind: image from the node's store, claim allocated, CDI injected
CDI_DIR = "/var/run/cdi"  # the chart's cdiDir, and kind/cluster.yaml's containerd cdi_spec_dirs
# The driver's pods, as the chart labels them (the profile's deploy.pods name the device
# plugin's, which mode: dra does not render).
DRA_PODS = Pods(
    labels={"app.kubernetes.io/component": "dra-driver", "app.kubernetes.io/part-of": "hyperlight"},
    container="plugin",
)
# The cluster target's device-plugin steps: `baseline` opens its ClusterNode (allocatable > 0,
# a session guest), which DRA has no part of (the node advertises no extended resource), and
# node-prepare/-restore make the isolated host-device view the chart is applied here without.
DEVICE_PLUGIN_STEPS = frozenset({"baseline", "workloads", "node-prepare", "node-restore"})
DRA_NAME = "hv-dra-driver-kvm"  # the chart's hv.draName: DaemonSet, ServiceAccount, policy
POLICY = f"{DRA_NAME}-own-node"
ADMISSION_API = "admissionregistration.k8s.io/v1"


class DraKind(KindLifecycle):
    """The kind target's lifecycle (create, load the images, apply, roll out, delete, verify)
    with the objects of the chart's mode: dra, applied as rendered."""

    def prepare(self, rendered: list[Obj]) -> tuple[list[Obj], Layout]:
        # as the existing-cluster target applies them: the driver sees the node's real /dev
        return prepare(rendered, isolate_host_view=False, paths=self.plugin.paths)

    def steps(self) -> list[Step]:
        return [s for s in super().steps() if s.id not in DEVICE_PLUGIN_STEPS]


def _dra(options: ClusterOptions, runner: CommandRunner) -> KindLifecycle:
    """The shipped profile's chart and kind values, as the suite renders them for kind, with
    mode: dra on top."""
    deploy = resolve().deploy
    assert deploy is not None and deploy.chart is not None
    chart = replace(deploy.chart, set={**deploy.chart.set, "mode": "dra"})
    rendered = render_deploy(
        replace(deploy, chart=chart, pods=DRA_PODS),
        "kind",
        namespace=options.plugin_namespace,
        image=options.image,
    )
    kinds = {o["kind"] for o in rendered.objects}
    assert {"DeviceClass", "ValidatingAdmissionPolicy", "ServiceAccount"} <= kinds, kinds
    return DraKind(options, rendered.objects, runner=runner)


class Cluster:
    """What the test does on the running cluster: API calls, and commands in the node."""

    def __init__(self, lc: KindLifecycle) -> None:
        self.lc, self.options = lc, lc.options
        self.api: KubeApi = lc.api()
        self.ns = lc.options.work_namespace

    def node(self, script: str) -> str:
        result = self.lc.access().run(["sh", "-c", script])
        assert result.rc == 0, result.stderr.decode()[-500:]
        return result.stdout.decode()

    def slices(self) -> list[Obj]:
        items = self.api.list_objects(RESOURCE_API, "ResourceSlice")
        return [s for s in items if s["spec"]["driver"] == DRA_DRIVER]

    def claim_specs(self) -> list[str]:
        # the node's own CDI dir, read inside the kind node container
        return self.node(f"ls -1 {CDI_DIR} | grep '^hyperlight-claim-.*[.]json$' || true").split()

    def claims(self) -> list[str]:
        return [
            c["metadata"]["name"]
            for c in self.api.list_objects(RESOURCE_API, "ResourceClaim", self.ns)
        ]

    def pod(self, name: str) -> Obj:
        """The cluster target's workload pod (the guest's run, then its counter), scheduled."""
        made = workload_pod(
            name, self.ns, "", self.options.guest_image, self.options.device,
            taint=False, guest=True,
        )  # fmt: skip
        del made["spec"]["nodeName"]  # a pod bound by hand never gets a claim allocated
        return made

    def guest_ran(self, pod: Obj) -> dict[str, Any]:
        """The guest's `run --json` record from the pod's log; a pod that cannot run fails."""
        name = pod["metadata"]["name"]

        def record() -> dict[str, Any] | None:
            current = self.api.get("v1", "Pod", name, self.ns) or {}
            status = current.get("status", {})
            waiting = [
                cs.get("state", {}).get("waiting", {}) for cs in status.get("containerStatuses", [])
            ]
            stuck = [w for w in waiting if w.get("reason") in FAILED_WAITING]
            if status.get("phase") == "Failed" or stuck:  # the guest's own words say why
                log = self.api.pod_log(self.ns, name, "guest")[-800:]
                pytest.fail(f"{name} cannot run: {json.dumps(status)[:1200]}\n{log}")
            if not running(current, "guest"):
                return None
            for line in self.api.pod_log(self.ns, name, "guest").splitlines():
                if line.startswith("{") and '"run"' in line:
                    found: dict[str, Any] = json.loads(line)
                    return found
            return None

        found = wait_for(record, LIVE_S, f"the KVM guest's record in {name}'s log", 1.0)
        assert found.get("ok") is True, found
        uid = (self.api.get("v1", "Pod", name, self.ns) or {})["metadata"]["uid"]
        # the pod's `state` emptyDir (mounted at STATE_MOUNT), where the counter guest writes
        state = f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/state/counter.json"

        def counting() -> int:
            text = self.node(f"cat {state} 2>/dev/null || echo '{{}}'")
            return int(json.loads(text).get("counter", 0)) if text.strip() else 0

        # the long-running guest too: the device stays usable after the first run
        wait_for(lambda: counting() > 2, LIVE_S, f"{name}'s KVM guest counting", 1.0)
        return found

    def delete(self, api_version: str, kind: str, name: str) -> None:
        self.api.delete(api_version, kind, name, self.ns, grace=5)
        gone = self.api.wait_gone(
            api_version, kind, name, self.ns, LIVE_S, self.options.poll_interval
        )
        assert gone, f"{kind} {self.ns}/{name} still present after {LIVE_S:g}s"


def _driver_published(c: Cluster) -> None:
    """The driver registered with the kubelet and published its node's one-device slice: it
    publishes only once the kubelet's NotifyRegistrationStatus said registered (plugin/dra/
    daemon.py), so the slice is the kubelet's word, not only the driver's."""
    node = c.lc.node_name
    reg = c.node(f"ls -1 {PLUGINS_REGISTRY_DIR}").split()
    assert f"{DRA_DRIVER}-reg.sock" in reg, f"{PLUGINS_REGISTRY_DIR}: {reg}"
    wait_for(c.slices, LIVE_S, "the driver's ResourceSlice", 1.0)
    (published,) = c.slices()
    assert published["spec"]["nodeName"] == node, published["spec"]
    assert [d["name"] for d in published["spec"]["devices"]] == ["kvm"], published["spec"]
    klass = c.api.get(RESOURCE_API, "DeviceClass", DRA_DRIVER)
    assert (
        klass is not None and klass["spec"]["extendedResourceName"] == "hyperlight.dev/hypervisor"
    )


def _policy_holds(c: Cluster, tmp_path: Path) -> None:
    """The chart's ValidatingAdmissionPolicy on a real API server: type-checked without a
    warning, and the very token the kubelet mounted in the driver's pod (node-bound: it names
    the node) may write its own node's slice and is refused another node's (server dry runs)."""

    def checked() -> Obj | None:
        # the status controller's verdict on this generation (typeChecking is {} when clean)
        vap = c.api.get(ADMISSION_API, "ValidatingAdmissionPolicy", POLICY) or {}
        status: Obj = vap.get("status") or {}
        done = status.get("observedGeneration", 0) >= vap["metadata"]["generation"]
        return status if done else None

    status = wait_for(checked, LIVE_S, f"{POLICY} type-checked by the controller manager", 1.0)
    assert not (status.get("typeChecking") or {}).get("expressionWarnings"), status
    (pod,) = c.api.list_objects(
        "v1", "Pod", c.lc.options.plugin_namespace, labels=f"app.kubernetes.io/name={DRA_NAME}"
    )
    projected = f"/var/lib/kubelet/pods/{pod['metadata']['uid']}/volumes/kubernetes.io~projected"
    token = tmp_path / "driver-token"
    token.write_text(c.node(f"cat {projected}/*/token"))
    kubeconfig = yaml.safe_load(Path(c.lc.kubeconfig).read_text())
    cluster = kubeconfig["clusters"][0]["cluster"]
    ca = tmp_path / "cluster-ca.crt"
    ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    driver = DriverApi(ApiAccess(cluster["server"], str(ca), token_file=str(token)))
    (published,) = c.slices()
    path = f"/apis/{RESOURCE_API}/resourceslices?dryRun=All"

    def slice_for(node: str) -> Obj:
        made = copy.deepcopy(published)
        made["metadata"] = {"name": f"hvt-policy-{node}"}
        made["spec"]["nodeName"] = node
        made["spec"]["pool"]["name"] = node
        return made

    driver.request("POST", path, slice_for(c.lc.node_name))  # its own node: admitted
    with pytest.raises(ApiError) as refused:
        driver.request("POST", path, slice_for("hvt-elsewhere"))
    assert "only its own node's ResourceSlices" in str(refused.value), refused.value
    assert f'token node: "{c.lc.node_name}"' in str(refused.value), refused.value


def _extended_resource_pod(c: Cluster) -> None:
    """limits hyperlight.dev/hypervisor: 1, served through the DeviceClass."""
    pod = c.pod(f"hv-dra-er-{uuid.uuid4().hex[:6]}")
    name = pod["metadata"]["name"]
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"hyperlight.dev/hypervisor": "1"}
    c.api.create(pod)
    c.guest_ran(pod)
    live = c.api.get("v1", "Pod", name, c.ns) or {}
    claim = (live["status"].get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    assert claim and claim in c.claims(), (live["status"], c.claims())
    assert len(c.claim_specs()) == 1, c.claim_specs()
    c.delete("v1", "Pod", name)
    # the pod's own claim goes with it (owned by the pod); its spec with the unprepare
    wait_for(lambda: claim not in c.claims(), LIVE_S, "the pod's extended-resource claim gone", 1.0)
    wait_for(lambda: not c.claim_specs(), LIVE_S, "no CDI spec left after the unprepare", 1.0)


def _claim_pod(c: Cluster) -> None:
    """A ResourceClaim of the chart's DeviceClass, named by the pod."""
    claim = f"hv-claim-{uuid.uuid4().hex[:6]}"
    c.api.create({
        "apiVersion": RESOURCE_API, "kind": "ResourceClaim",
        "metadata": {"name": claim, "namespace": c.ns},
        "spec": {"devices": {"requests": [
            {"name": "hv", "exactly": {"deviceClassName": DRA_DRIVER}}]}},
    })  # fmt: skip
    pod = c.pod(f"hv-dra-claim-{uuid.uuid4().hex[:6]}")
    container = pod["spec"]["containers"][0]
    container["resources"] = {"claims": [{"name": "hv"}]}
    pod["spec"]["resourceClaims"] = [{"name": "hv", "resourceClaimName": claim}]
    c.api.create(pod)
    c.guest_ran(pod)
    assert len(c.claim_specs()) == 1, c.claim_specs()
    name = pod["metadata"]["name"]

    def health() -> list[str]:
        live = c.api.get("v1", "Pod", name, c.ns) or {}
        statuses = (live.get("status") or {}).get("containerStatuses") or [{}]
        return [r.get("health", "") for entry in statuses[0].get("allocatedResourcesStatus") or []
                for r in entry.get("resources") or []]  # fmt: skip

    # the driver's health stream (dra-health v1), as the kubelet writes it for a named claim
    wait_for(lambda: health() == ["Healthy"], LIVE_S, "allocatedResourcesStatus Healthy", 1.0)
    c.delete("v1", "Pod", name)
    wait_for(lambda: not c.claim_specs(), LIVE_S, "no CDI spec left after the unprepare", 1.0)
    c.delete(RESOURCE_API, "ResourceClaim", claim)
    assert c.claims() == [], c.claims()


# a cluster made and deleted, the images loaded, two pods' cold starts: past the default 300 s
@pytest.mark.timeout(1200)
def test_the_charts_dra_mode_runs_guests_on_kind_and_leaves_nothing(
    tmp_path: Path, engine: dict[str, Any]
) -> None:
    before = kvm()
    lc = lifecycle(tmp_path, engine, make=_dra)
    try:
        with lc.runbook().running():
            cluster = Cluster(lc)
            _driver_published(cluster)
            _policy_holds(cluster, tmp_path)
            _extended_resource_pod(cluster)
            _claim_pod(cluster)
    finally:
        lc.close_api()
        lc.report.write(tmp_path / "out" / "cluster-kind.json")
    ran = [s.id for s in lc.report.steps]
    assert {"kind-create", "apply", "rollout", "delete-plugin", "kind-delete"} <= set(ran), ran
    assert_nothing_left(lc, engine, before)
