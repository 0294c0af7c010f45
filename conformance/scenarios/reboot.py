"""A node reboot, as the workloads holding the device live it.

After a reboot, pods asking for a device-plugin resource failed or were admitted before the
plugin was back (kubernetes/kubernetes#128043, #109595, #67107), or looped on admission errors
("no healthy devices", squat/generic-device-plugin#63). The kubelet's own e2e test simulates a
reboot by stopping the kubelet and removing every pod sandbox through CRI, then starting the
kubelet again: pods that held devices fail admission while the plugin is not back
("Does not keep device plugin assignments across node reboots if fails admission"), and pods
deleted meanwhile must lose their assignment ("[OrphanedPods]", test/e2e_node/
device_plugin_test.go). Here the plugin then starts as its target starts it, and its device may
come back before it is usable (a hypervisor module still loading).

Measured: kubelet start to plugin registered, and the device requests refused meanwhile.
Required: no pod admitted with the device while it is not usable, and no healthy device
advertised then (which is what sends pods into an admission-error loop); workloads owned by a
controller run again with the device; the checkpoint keeps no assignment for a pod deleted
while the kubelet was down.
"""

from __future__ import annotations

import time

from hvconform.contract.node import CAP_DEVICE_REMAP, CAP_NODE_REBOOT, CAP_PODS, Node, require
from hvconform.contract.results import NotApplicable, Recorder
from hvconform.contract.wait import wait_for
from hvconform.scenarios.common import RECOVERY_TIMEOUT_S, fresh_guest, wait_ready
from hvconform.scenarios.workloads import COUNTING_S, RUNNING, start_running_pod

OWNER = "reboot-workload"
# After the plugin registered, its device stays unusable this long while requests keep coming:
# long enough for any list the plugin sends at start to reach the kubelet.
UNUSABLE_AFTER_REGISTRATION_S = 2.0
REQUEST_EVERY_S = 0.05  # one pod asking for the device every 50 ms during the boot
ADMISSION_ERROR = "UnexpectedAdmissionError"


class _Requests:
    """Pods asking for the device while it comes back; each refused or admitted at once."""

    def __init__(self, node: Node, booted: float) -> None:
        self.node, self.booted = node, booted
        self.refused = self.refused_unregistered = self.admitted = 0
        self.registered: float | None = None

    def one(self) -> None:
        reg = self.node.last_registration_at()
        if self.registered is None and reg is not None and reg > self.booted:
            self.registered = reg
        allocation = self.node.allocate()
        try:
            if allocation.ok:
                self.admitted += 1
            else:
                self.refused += 1
                self.refused_unregistered += self.registered is None
        finally:
            self.node.release(allocation)


def _owned_pod_back(node: Node) -> str | None:
    running = [p for p in node.pods() if p.owner == OWNER and p.phase == RUNNING]
    for pod in running:
        if pod.container_id and node.pod_counter(pod.uid) > 1:
            return pod.uid
    return None


def _boot(node: Node, rec: Recorder, late: bool) -> tuple[float, _Requests]:
    """Boot, then ask for the device until the plugin registered and the window passed."""
    booted = node.boot_node(device_usable=not late)
    rec.event("kubelet started" + (", device not yet usable" if late else ""), booted)
    requests = _Requests(node, booted)

    def window_over() -> bool:
        requests.one()
        reg = requests.registered
        return reg is not None and time.monotonic() - reg >= UNUSABLE_AFTER_REGISTRATION_S

    wait_for(
        window_over,
        RECOVERY_TIMEOUT_S + UNUSABLE_AFTER_REGISTRATION_S,
        "the plugin registered after the reboot",
        interval=REQUEST_EVERY_S,
    )
    assert requests.registered is not None
    rec.event("plugin registered", requests.registered)
    rec.metric("boot_to_registered_s", requests.registered - booted)
    rec.metric("refused_before_registered", requests.refused_unregistered)
    return booted, requests


def _judge_unusable_window(node: Node, rec: Recorder, booted: float, requests: _Requests) -> None:
    rec.metric("refused_while_unusable", requests.refused)
    events = node.node_events(booted)
    healthy = [f"{e.value} at +{e.t - booted:.3f}s" for e in events
               if e.kind == "allocatable" and e.value > 0]  # fmt: skip
    # The plugin's own Allocate refusing (an rpc error): the kubelet had counted a healthy device.
    by_plugin = [e.detail for e in events if e.kind == "refused" and "rpc error" in e.detail]
    rec.metric("admission_errors_at_boot", sum(ADMISSION_ERROR in e.detail for e in events
                                               if e.kind == "refused"))  # fmt: skip
    assert not requests.admitted, (
        f"{requests.admitted} pods were admitted with the device while it was not usable"
    )
    assert not healthy, (
        f"healthy devices advertised after the reboot while the device was not usable: {healthy}"
        + (f"; pods then failed in the plugin's Allocate: {by_plugin[:2]}" if by_plugin else "")
    )


def node_reboot(node: Node, rec: Recorder) -> None:
    require(node, CAP_NODE_REBOOT, CAP_PODS)
    wait_ready(node, rec, "before the reboot")
    free = node.allocatable() - (1 if node.session_guest else 0)
    if free < 2:
        raise NotApplicable(
            f"a reboot is judged with two pods holding the device (one a controller's, one "
            f"deleted while the kubelet is down); the plugin offers {free} beside the session guest"
        )
    start_running_pod(node, rec, owner=OWNER)
    doomed = start_running_pod(node, rec)
    late = CAP_DEVICE_REMAP in node.capabilities
    if not late:
        rec.note("the device cannot be held unusable at boot here: usable from the start")
    try:
        node.stop_node()
        rec.event("node down: kubelet, plugin and every sandbox gone")
        node.delete_pod(doomed.uid)
        rec.event(f"pod {doomed.name} deleted while the kubelet was down")
        booted, requests = _boot(node, rec, late)
        if late:
            _judge_unusable_window(node, rec, booted, requests)
            node.remap_device_unusable(False)
        usable = rec.event("device usable")
        rec.metric("usable_to_ready_s", wait_ready(node, rec, "after the reboot") - usable)
        back = wait_for(lambda: _owned_pod_back(node), RECOVERY_TIMEOUT_S + COUNTING_S,
                        "the controller's workload running again with the device")  # fmt: skip
        rec.metric("workload_back_s", rec.event("controller's workload counting again") - usable)
        failed = [p for p in node.pods() if p.owner == OWNER and p.uid != back]
        rec.note(f"controller pods before the one running: {[p.reason for p in failed]}")
        wait_for(
            lambda: doomed.uid not in node.checkpoint_pod_uids(),
            RECOVERY_TIMEOUT_S,
            "the checkpoint to drop the pod deleted while the kubelet was down",
        )
        listed = node.pod_resources().devices
        assert doomed.uid not in listed, "pod-resources still lists the pod deleted meanwhile"
        fresh_guest(node, rec, "reboot")
    finally:
        for pod in node.pods():
            if pod.owner == OWNER:
                node.delete_pod(pod.uid)
