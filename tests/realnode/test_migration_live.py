"""The migration an operator follows (issue 28): one node pool moved from the device plugin to
the DRA driver, pod specs unchanged, LIVE on this machine's two cluster-mode nodes (kubelet, API
server, scheduler and controller manager v1.37.2, containerd with CDI, real KVM guests).

Two releases of the chart split by a node label: `hv-dp` (mode: deviceplugin, nodeSelector
hyperlight.dev/pool=dp) and `hv-dra` (mode: dra, pool=dra), installed with helm as the README
says. v1.37.2's scheduler serves an extended resource through DRA on a node where a DeviceClass
maps it (extendedResourceName) and the node's allocatable for it is 0 or absent, and through the
device plugin where that is > 0 (dynamicresources/extendeddynamicresources.go
filterExtendedResources, noderesources/fit.go shouldDelegateResourceToDRA): so the one pod spec
(limits hyperlight.dev/hypervisor: 1) runs on either pool. Node 1 then moves (cordon, drain,
relabel, wait for the driver's slice and the device plugin's allocatable gone, uncordon) and the
same spec runs there through DRA. What the kubelet does with the extended resource once the
device plugin left is measured, not assumed: the plugin's final empty ListAndWatch list sets the
node's capacity and allocatable to 0 at once, and when the stopped endpoint's grace
(pkg/kubelet/cm/devicemanager endpointStopGracePeriod, 5 min) expires the kubelet keeps the
capacity at 0 rather than removing it (pkg/kubelet/nodestatus/setters.go): 0 for good, which is
what the scheduler's rule needs, and the same spec still runs there through DRA after it. Rolled
back the same way (relabel pool=dp), the same spec runs through the device plugin again.

Every figure is printed (`pytest -s`) and written to migration-timings.json under tmp_path.
Runs in `nox -s dra-live` (apart from `tests` for CI's time). Needs the node built (`nox -s
node-build`; skipped with that reason when it is not) and no other node up on this machine.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hv_device_plugin.api.names import HYPERVISOR_RESOURCE
from hvconform.contract.wait import wait_for
from hvconform.targets.cluster.kube import KubeApi, Obj
from hvconform.targets.realnode import node_images, nodes, procs, stack
from tests.realnode.live_runs import kvm, live_module, skip_unless_live
from tests.realnode.pool_guests import Guests, via_device_plugin, via_dra
from tests.realnode.pools import (
    CLUSTER_KINDS,
    KUBECTL,
    LIVE_S,
    PART_OF,
    POOL_LABEL,
    WORK,
    Cluster,
    Release,
    Timeline,
    cluster_scoped,
    install,
    kubectl,
    render,
    uninstall,
)

# the machine's one node stack, locked only when this module really runs: apart from `tests`
# (nox -s dra-live) for CI's time, 424 s of the node stack's serialized time in a CI log
USES_NODE_STACK = live_module("HV_DRA_LIVE")

# two nodes up, two releases rolled out, five guest pods, the kubelet's 5 min grace measured
pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow, pytest.mark.timeout(2400)]

DP = Release("hv-dp", "deviceplugin", "dp")
DRA = Release("hv-dra", "dra", "dra")
# pkg/kubelet/cm/devicemanager/types.go endpointStopGracePeriod (5 min), then the kubelet's
# next node status update (it drops the stopped endpoint there: manager.go GetCapacity)
CAPACITY_S = 420.0
# what v1.37.2's kubelet logs (--v=2) when the last endpoint of a resource stops
# (manager.go PluginDisconnected) and when its grace expired (nodestatus/setters.go: the
# capacity set to 0, not removed, "to indicate that the resource is managed by device plugin")
DISCONNECTED = "Last device plugin for this resource disconnected"
REMOVED = "Set capacity for removed resource to 0 on device removal"
DRAIN = ["--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=180s"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    skip_unless_live("HV_DRA_LIVE", "dra-live")
    if not KUBECTL:
        pytest.skip("kubectl not found: run `nox -s kind-image` (builds it) or install kubectl")
    if missing := nodes.has_tools():
        pytest.skip(f"the node is not built ({', '.join(missing)}): run `nox -s node-build`")
    if nodes.recorded_nodes() or ((p := procs.recorded("kubelet")) and p.alive):
        pytest.skip("a node is already up on this machine: `nox -s node-down` first")
    before = kvm()
    try:
        stack.up_nodes(2)
        tags = node_images.build_images()
        node_images.load(list(tags.values()))
        yield {**tags, "layouts": nodes.layouts(2)}
    finally:
        left = stack.down()
        assert not left, f"node-down left: {left}"
        assert kvm() == before, "/dev/kvm changed"


def renders_apart(image: str, tl: Timeline) -> None:
    """The two releases' objects: no cluster-scoped object in both, each namespaced object in
    its own release's namespace, and every DaemonSet (the deviceAccess bootstrap's too) only on
    its own pool's nodes."""
    dp, dra = render(DP, image), render(DRA, image)
    assert not cluster_scoped(dp) & cluster_scoped(dra), cluster_scoped(dp) & cluster_scoped(dra)
    for release, objects in ((DP, dp), (DRA, dra)):
        namespaced = [o for o in objects if (o["kind"], o["metadata"]["name"]) not in
                      cluster_scoped(objects)]  # fmt: skip
        assert {o["metadata"].get("namespace") for o in namespaced} == {release.name}
        sets = {
            d["metadata"]["labels"]["app.kubernetes.io/component"]: d
            for d in objects
            if d["kind"] == "DaemonSet"
        }
        want = {"device-access", "hypervisor-plugin" if release is DP else "dra-driver"}
        assert set(sets) == want, sorted(sets)
        for ds in sets.values():
            assert ds["spec"]["template"]["spec"]["nodeSelector"] == {POOL_LABEL: release.pool}
    tl.observed["cluster_scoped_hv_dp"] = sorted("/".join(k) for k in cluster_scoped(dp))
    tl.observed["cluster_scoped_hv_dra"] = sorted("/".join(k) for k in cluster_scoped(dra))


def one_device_access_each(c: Cluster, pools: dict[str, Release]) -> None:
    """Each node runs exactly one bootstrap pod, its own pool's release's."""
    for node, release in pools.items():
        found = [p["metadata"]["namespace"] for p in c.pods(node, "", "device-access")]
        assert found == [release.name], (node, found)


def migrate(c: Cluster, tl: Timeline, node: str, source: Release, target: Release) -> None:
    """An operator's steps on one node: cordon and drain (DaemonSet pods stay), relabel, wait
    until the node serves the resource only through the target, uncordon. Each step timed."""
    tag = f"{source.pool}_to_{target.pool}"
    tl.event(f"cordon_{tag}")
    kubectl("cordon", node)
    kubectl("drain", node, *DRAIN)
    tl.since(f"cordon_{tag}", f"{tag}_drain", "kubectl cordon + drain of the node's workloads")
    if source is DRA:
        # the drained pods' claims unprepared while the driver still runs on the node
        tl.first_of(
            f"cordon_{tag}",
            {
                f"{tag}_claims_gone": (
                    "the drained pods' ResourceClaims of this node's pool deleted",
                    lambda: not [cl for cl in c.claims(WORK) if _pool(cl) == node],
                ),
                f"{tag}_claim_specs_gone": (
                    "no per-claim CDI spec left in the node (NodeUnprepareResources done)",
                    lambda: not c.claim_specs(node),
                ),
            },
            LIVE_S,
            f"node {node}'s claims released before it leaves DRA",
        )
    tl.event(f"relabel_{tag}")
    kubectl("label", "node", node, f"{POOL_LABEL}={target.pool}", "--overwrite")
    plugin = "hypervisor-plugin" if source is DP else "dra-driver"
    served = "dra-driver" if target is DRA else "hypervisor-plugin"
    access_pods: list[int] = []

    def allocatable(zero: bool) -> Callable[[], bool]:
        def held() -> bool:
            value = c.extended(node, "allocatable")
            if (value in (None, "0")) is zero:
                tl.observed[f"{tag}_allocatable"] = value
                tl.observed[f"{tag}_capacity_then"] = c.extended(node, "capacity")
                return True
            return False

        return held

    conditions: dict[str, tuple[str, Callable[[], bool]]] = {
        f"{tag}_old_plugin_gone": (
            f"{source.name}'s {plugin} pod gone from the node",
            lambda: not c.pods(node, source.name, plugin),
        ),
        f"{tag}_old_access_gone": (
            f"{source.name}'s device-access pod gone from the node",
            lambda: not c.pods(node, source.name, "device-access"),
        ),
        f"{tag}_new_access_ready": (
            f"{target.name}'s device-access pod Ready on the node",
            lambda: c.ready(node, target.name, "device-access"),
        ),
        f"{tag}_new_pod_ready": (
            f"{target.name}'s {served} pod Ready on the node",
            lambda: c.ready(node, target.name, served),
        ),
    }
    if target is DRA:
        conditions[f"{tag}_allocatable_zero"] = (
            "the node's allocatable hyperlight.dev/hypervisor 0 or absent (the device plugin's "
            "final empty list, or its stopped endpoint's devices unhealthy)",
            allocatable(zero=True),
        )
        conditions[f"{tag}_slice_published"] = (
            "the driver's ResourceSlice of the node published",
            lambda: bool(c.slices(node)),
        )
    else:
        conditions[f"{tag}_allocatable_back"] = (
            "the node's allocatable hyperlight.dev/hypervisor > 0 (the device plugin registered)",
            allocatable(zero=False),
        )
        conditions[f"{tag}_slice_wiped"] = (
            "the driver's ResourceSlice of the node deleted (the kubelet wipes an unregistered "
            "driver's slices after 30 s: dra_plugin_manager.go wipingDelay)",
            lambda: not c.slices(node),
        )
    try:
        tl.first_of(
            f"relabel_{tag}",
            conditions,
            LIVE_S,
            f"node {node} moved from pool {source.pool} to {target.pool}",
            watch=lambda: access_pods.append(len(c.pods(node, "", "device-access"))),
        )
    finally:
        # the two releases' bootstrap pods on the node at once, at most (old leaving, new come)
        tl.observed[f"{tag}_device_access_pods_at_once_max"] = max(access_pods, default=0)
    tl.event(f"uncordon_{tag}")
    kubectl("uncordon", node)


def _pool(claim: Obj) -> str:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or [{}]
    return str(results[0].get("pool", ""))


def cleanup(c: Cluster) -> list[str]:
    """Both releases' objects deleted and verified gone, the workloads' first (their claims
    unprepared by a driver still running); what could not be done, in words."""
    problems: list[str] = []

    def step(what: str, do: Callable[[], object]) -> None:
        try:
            do()
        except Exception as exc:  # every step is tried; the test fails on any after
            problems.append(f"{what}: {exc}")

    def namespace_gone(name: str) -> None:
        c.api.delete("v1", "Namespace", name)
        assert c.api.wait_gone("v1", "Namespace", name, "", LIVE_S, 0.5), f"{name} still there"

    def cluster_scoped_gone() -> None:
        left = []
        for api_version, kind in CLUSTER_KINDS:
            for obj in c.api.list_objects(api_version, kind, labels=PART_OF):
                left.append(f"{kind}/{obj['metadata']['name']}")
                c.api.delete(api_version, kind, obj["metadata"]["name"])
        assert not left, f"left by helm uninstall (deleted now): {left}"

    step(f"namespace {WORK} deleted", lambda: namespace_gone(WORK))
    for release in (DRA, DP):
        step(f"helm uninstall {release.name}", functools.partial(uninstall, release))
        step(f"namespace {release.name} deleted", functools.partial(namespace_gone, release.name))
    step("cluster-scoped objects of both releases gone", cluster_scoped_gone)

    def no_claim_specs() -> None:
        left = {n: c.claim_specs(n) for n in c.layouts}
        assert not any(left.values()), left

    step("no per-claim CDI spec left in the nodes", no_claim_specs)
    step(
        "the driver's slices wiped by the kubelets",
        lambda: wait_for(
            lambda: not any(c.slices(n) for n in c.layouts), LIVE_S, "the driver's slices gone", 1
        ),
    )
    return problems


def test_a_node_pool_moves_from_the_device_plugin_to_dra_with_pods_unchanged(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    image = cluster["plugin"]
    layouts = cluster["layouts"]
    node1, node2 = (n.name for n in layouts)
    api = KubeApi(str(nodes.ADMIN_KUBECONFIG))
    c = Cluster(api, layouts)
    g = Guests(c, cluster["guest"])
    tl = Timeline()
    problems: list[str] = []
    try:
        renders_apart(image, tl)
        kubectl("label", "node", node1, f"{POOL_LABEL}={DP.pool}")
        kubectl("label", "node", node2, f"{POOL_LABEL}={DRA.pool}")
        tl.event("install")
        install(DP, image)
        install(DRA, image)
        tl.first_of(
            "install",
            {
                "install_hv_dp_rolled_out": (
                    "hv-dp's DaemonSets ready on node 1 (pool dp)",
                    lambda: c.rolled_out(DP.name),
                ),
                "install_hv_dra_rolled_out": (
                    "hv-dra's DaemonSets ready on node 2 (pool dra)",
                    lambda: c.rolled_out(DRA.name),
                ),
                "install_node1_allocatable": (
                    "node 1's allocatable hyperlight.dev/hypervisor > 0 (the device plugin)",
                    lambda: c.extended(node1, "allocatable") not in (None, "0"),
                ),
                "install_node2_slice": (
                    "the driver's ResourceSlice of node 2 published",
                    lambda: bool(c.slices(node2)),
                ),
            },
            LIVE_S,
            "both releases rolled out, each on its pool",
        )
        one_device_access_each(c, {node1: DP, node2: DRA})
        assert c.extended(node2, "allocatable") is None, "node 2 never ran the device plugin"
        assert not c.slices(node1), "node 1 is not the driver's"
        tl.observed["node1_allocatable_on_device_plugin"] = c.extended(node1, "allocatable")

        # one unchanged pod spec on each pool: the scheduler picks the path per node
        kubectl("create", "namespace", WORK)
        tl.event("pods")
        on_dp, on_dra = g.start(node1), g.start(node2)
        g.ran(on_dp)
        g.ran(on_dra)
        tl.since("pods", "pods_both_guests_ran", "the same spec on both pools, both KVM guests ran")
        via_device_plugin(c, g, on_dp)
        via_dra(c, g, on_dra, node2)

        # node 1 moves to DRA
        log_at = c.kubelet_log(node1).stat().st_size
        migrate(c, tl, node1, DP, DRA)
        assert g.c.api.get("v1", "Pod", on_dp, WORK) is None, "drained"
        tl.event("pod_after_move")
        moved = g.start(node1)
        g.ran(moved)
        tl.since("pod_after_move", "dp_to_dra_pod_ran", "the same spec on node 1, its guest ran")
        via_dra(c, g, moved, node1)
        # what the kubelet keeps of the device plugin's resource once its endpoint stopped, and
        # when its grace (endpointStopGracePeriod) expires: the scheduler's rule wants 0 or absent
        tl.observed["dp_to_dra_capacity_with_dra_pod_running"] = c.extended(node1, "capacity")
        disconnected = c.kubelet_lines(node1, log_at, DISCONNECTED, HYPERVISOR_RESOURCE)
        tl.observed["dp_to_dra_kubelet_plugin_disconnected"] = bool(disconnected)
        since_relabel = time.monotonic() - tl.events["relabel_dp_to_dra"]
        wait_for(
            lambda: c.kubelet_lines(node1, log_at, REMOVED, HYPERVISOR_RESOURCE),
            max(CAPACITY_S - since_relabel, 1.0),
            "node 1's kubelet dropping the device plugin's stopped endpoint (its grace expired)",
            1.0,
        )
        tl.since("relabel_dp_to_dra", "dp_to_dra_grace_expired",
                 f"node 1's kubelet logged '{REMOVED}' for {HYPERVISOR_RESOURCE}")  # fmt: skip
        after_grace = {f: c.extended(node1, f) for f in ("capacity", "allocatable")}
        tl.observed["dp_to_dra_after_grace"] = after_grace
        assert after_grace["allocatable"] in (None, "0"), after_grace
        g.counting(moved, "node 1 after the kubelet's grace")
        tl.event("pod_after_grace")
        later = g.start(node1)
        g.ran(later)
        tl.since("pod_after_grace", "dp_to_dra_pod_after_grace_ran",
                 "the same spec on node 1 after the grace, its guest ran")  # fmt: skip
        via_dra(c, g, later, node1)

        # rolled back the same way: the device plugin's allocatable wins again
        migrate(c, tl, node1, DRA, DP)
        tl.event("pod_after_rollback")
        back = g.start(node1)
        g.ran(back)
        tl.since(
            "pod_after_rollback", "dra_to_dp_pod_ran", "the same spec on node 1, its guest ran"
        )
        via_device_plugin(c, g, back)

        # the other pool was never touched
        g.counting(on_dra, "node 2, at the end")
        assert g.restarts(on_dra) == 0
        via_dra(c, g, on_dra, node2)
    finally:
        problems = cleanup(c)
        api.close()
        out = tmp_path / "migration-timings.json"
        out.write_text(json.dumps({**tl.as_json(), "cleanup_problems": problems}, indent=1))
        print("\nmigration timings (monotonic seconds):", *tl.lines(), sep="\n")
        print(f"written to {out}")
    assert not problems, problems
