"""What happens to the workloads holding the device, not only to the plugin.

`workloads-survive-kubelet-restart`: running pods holding a device were killed with
UnexpectedAdmissionError when the kubelet restarted (kubernetes/kubernetes#118559, seen with
KubeVirt's devices.kubevirt.io/kvm); the kubelet's own e2e test ("Keeps device plugin assignments
across kubelet restarts", test/e2e_node/device_plugin_test.go) wants the same pod instance
running with the same devices, as the pod-resources API reports them. Here, for a graceful and a
crash restart: every pod that held the device before is the same afterwards (UID, container ID,
restart count), still running and counting in its guest; List reports the same device IDs for
it, GetAllocatableResources the same devices once the plugin is back; and a new pod is admitted.

`health-in-pod-status`: with ResourceHealthStatus (KEP-4680, beta and on in v1.37) the kubelet
reports each held device's health in the pod's allocatedResourcesStatus, as the plugin last
advertised it (device_plugin_failures_pod_status_test.go): a pod must see its device turn
Unhealthy when the device goes, and Healthy again when it is back.
"""

from __future__ import annotations

from hvconform.contract.node import (
    CAP_DEVICE_VIEW,
    CAP_KUBELET_CRASH,
    CAP_KUBELET_RESTART,
    CAP_POD_DEVICE_HEALTH,
    CAP_PODS,
    Node,
    PodView,
    require,
)
from hvconform.contract.results import EventKind, Recorder
from hvconform.contract.wait import wait_for
from hvconform.scenarios.common import FAULT_TIMEOUT_S, RECOVERY_TIMEOUT_S, wait_ready

RUNNING = "Running"
COUNTING_S = 30.0
# A real kubelet limits its pod-resources API (v1.37.2 podresources/constants.go: 100 calls a
# second, a burst of 10; each look here is two): polled at 20 a second.
POD_RESOURCES_EVERY_S = 0.05


def start_running_pod(node: Node, rec: Recorder, owner: str = "") -> PodView:
    """A pod asking for the device, admitted and counting in its guest."""
    pod = node.start_pod(owner)
    assert pod.phase == RUNNING, (
        f"a pod asking for the device was not admitted: {pod.phase} {pod.reason} {pod.message}"
    )
    wait_for(lambda: node.pod_counter(pod.uid) > 1, COUNTING_S, f"pod {pod.name} counting")
    rec.event(f"pod {pod.name} running")
    return pod


def wait_counting(node: Node, counters: dict[str, int], label: str) -> None:
    """Every pod's guest counts past the value it had."""
    for uid, before in counters.items():
        wait_for(
            lambda uid=uid, before=before: node.pod_counter(uid) > before,  # type: ignore[misc]
            COUNTING_S,
            f"pod {uid} still counting in its guest ({label})",
        )


def _restart_keeps_pods(node: Node, rec: Recorder, graceful: bool) -> None:
    label = "graceful" if graceful else "crash"
    before = {p.uid: p for p in node.pods() if p.phase == RUNNING and p.container_id}
    resources = node.pod_resources()
    held = {uid: resources.devices.get(uid, ()) for uid in before}
    empty = [before[uid].name for uid, ids in held.items() if not ids]
    assert not empty, f"pod-resources List reports no device for running pods {empty}"
    counters = {uid: node.pod_counter(uid) for uid in before}
    back = node.restart_kubelet(graceful=graceful)
    rec.event(f"kubelet back after {label} restart", back, kind=EventKind.FAULT)
    wait_for(
        lambda: (node.last_registration_at() or 0.0) > back,
        RECOVERY_TIMEOUT_S,
        f"re-registration after kubelet {label} restart",
    )
    rec.metric(f"reregistration_{label}_s", (node.last_registration_at() or back) - back)
    wanted = set(resources.allocatable)
    wait_for(
        lambda: set(node.pod_resources().allocatable) == wanted,
        RECOVERY_TIMEOUT_S,
        f"GetAllocatableResources to report the same {len(wanted)} devices ({label} restart)",
        interval=POD_RESOURCES_EVERY_S,
    )
    after = {p.uid: p for p in node.pods()}
    for uid, pod in before.items():
        now = after.get(uid)
        assert now is not None, f"pod {pod.name} is gone after the kubelet {label} restart"
        assert now.phase == RUNNING, (
            f"pod {pod.name} is {now.phase} after the kubelet {label} restart: "
            f"{now.reason} {now.message}"
        )
        assert (now.container_id, now.restart_count) == (pod.container_id, pod.restart_count), (
            f"pod {pod.name}'s container was replaced by the kubelet {label} restart: "
            f"{pod.container_id}/{pod.restart_count} -> {now.container_id}/{now.restart_count}"
        )
    # A real kubelet lists a pod only once its API source delivered it again (v1.37.2
    # server_v1.go `List`: GetActivePods, the pod manager), up to a second after it is back.
    listed = wait_for(
        lambda: d if set(before) <= set(d := node.pod_resources().devices) else None,
        RECOVERY_TIMEOUT_S,
        f"pod-resources List to report every pod again ({label} restart)",
        interval=POD_RESOURCES_EVERY_S,
    )
    moved = {
        before[u].name: (held[u], listed.get(u, ())) for u in before if listed.get(u) != held[u]
    }
    assert not moved, f"pod-resources List changed across the {label} restart: {moved}"
    wait_counting(node, counters, f"after the kubelet {label} restart")
    rec.metric(f"pods_kept_{label}", len(before))
    rec.event(f"every pod kept its container and devices ({label})")


def workloads_survive_kubelet_restart(node: Node, rec: Recorder) -> None:
    require(node, CAP_PODS, CAP_KUBELET_RESTART)
    wait_ready(node, rec, "before the kubelet restarts")
    pod = start_running_pod(node, rec)
    deleted = False
    try:
        _restart_keeps_pods(node, rec, graceful=True)
        if CAP_KUBELET_CRASH in node.capabilities:
            _restart_keeps_pods(node, rec, graceful=False)
        else:
            rec.note("crash restart not available on this target: graceful only")
        wait_ready(node, rec, "after the kubelet restarts")
        # its device back first: a plugin may offer as few as two (the session guest holds one)
        node.delete_pod(pod.uid)
        deleted = True
        fresh = start_running_pod(node, rec)
        node.delete_pod(fresh.uid)
        rec.event("a new pod was admitted and ran")
    finally:
        if not deleted:
            node.delete_pod(pod.uid)


def _health(node: Node, uid: str, healthy: bool) -> bool:
    return set(node.pod_device_health(uid).values()) == {healthy}


def health_in_pod_status(node: Node, rec: Recorder) -> None:
    require(node, CAP_POD_DEVICE_HEALTH, CAP_PODS, CAP_DEVICE_VIEW)
    wait_ready(node, rec, "before the fault")
    pod = start_running_pod(node, rec)
    try:
        wait_for(lambda: _health(node, pod.uid, True), FAULT_TIMEOUT_S,
                 "the pod's device Healthy in its status")  # fmt: skip
        node.set_device_present(False)
        t0 = rec.event("device removed from where the plugin looks", kind=EventKind.FAULT)
        try:
            wait_for(
                lambda: _health(node, pod.uid, False),
                FAULT_TIMEOUT_S,
                "the pod's device Unhealthy in its status (allocatedResourcesStatus)",
                interval=0.01,
            )
            rec.metric("detected_s", rec.event("pod status: device Unhealthy") - t0)
        finally:
            node.set_device_present(True)
        t1 = rec.event("device restored", kind=EventKind.REPAIRED)
        wait_for(
            lambda: _health(node, pod.uid, True),
            RECOVERY_TIMEOUT_S,
            "the pod's device Healthy again in its status",
            interval=0.01,
        )
        rec.metric("recovery_s", rec.event("pod status: device Healthy") - t1)
        now = next(p for p in node.pods() if p.uid == pod.uid)
        assert now.phase == RUNNING and now.container_id == pod.container_id, (
            f"the pod did not keep running through the fault: {now.phase} {now.reason}"
        )
        wait_ready(node, rec, "after restore")
    finally:
        node.delete_pod(pod.uid)
