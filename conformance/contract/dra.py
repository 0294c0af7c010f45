"""What DRA checks may do to, and observe on, a node whose plugin under test is a DRA driver.

A target that runs a DRA driver declares CAP_DRA and implements this on top of the Node
contract; checks of the device plugin API end not_applicable there, DRA checks everywhere else
(hvconform.scenarios: each check names the API it judges). The catalogue's own observations
keep their meaning: capacity() is the number of devices the driver publishes for the node in
its ResourceSlices, allocatable() the number of those without a NoSchedule or NoExecute taint,
allocate() a pod asking for the DeviceClass's extended resource, scheduled (the scheduler
allocates DRA claims; a pod bound by hand never gets one) and refused when it is unschedulable
or its NodePrepareResources fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hvconform.contract.dra_profile import API_DEVICE_PLUGIN, API_DRA
from hvconform.contract.node import (
    CAP_DEVICE_LATE,
    CAP_NODE_REBOOT,
    CAP_POD_DEVICE_HEALTH,
    CAP_READ_STORM,
    CAP_SOCKET_REDIRECT,
    CAP_STREAM_END,
    Node,
    PodView,
)

# The plugin under test is a DRA driver on this node (checks of the device plugin API do not
# apply; the DRA checks do).
CAP_DRA = "dra"
# The kubelet can be held stopped and started again (stop_kubelet / start_kubelet): not through
# node access that rides on the kubelet itself (an exec in a diagnostic pod).
CAP_KUBELET_STOP = "kubelet-stop"
# The driver's registration socket can be removed from the kubelet's plugins_registry dir
# (remove_registration_socket), as a node cleanup or a careless rm does: found as the socket
# there whose GetInfo names the driver, whatever its name.
CAP_REGISTRATION_SOCKET = "registration-socket"
# What a device plugin's node does that a DRA driver's does not have, on every target: the
# kubelet.sock socket dir and the ListAndWatch stream, the device checkpoint of a reboot, a read
# storm of the one spec during Allocate, health in pod status for the extended-resource path
# (v1.37.2 reports none there: manager.go skips containers without resources.claims).
DEVICE_PLUGIN_ONLY = frozenset({CAP_SOCKET_REDIRECT, CAP_STREAM_END, CAP_NODE_REBOOT,
                                CAP_DEVICE_LATE, CAP_POD_DEVICE_HEALTH, CAP_READ_STORM})  # fmt: skip
# Taints that keep the scheduler off a device (allocatable() leaves those devices out).
BLOCKING_TAINTS = ("NoSchedule", "NoExecute")


def plugin_api(node: Node) -> str:
    """The kubelet API the node's plugin under test speaks."""
    return API_DRA if CAP_DRA in node.capabilities else API_DEVICE_PLUGIN


@dataclass(frozen=True)
class SliceView:
    """One ResourceSlice of the driver for this node, as the API server has it."""

    uid: str  # a slice deleted and published again has a new one
    devices: int
    tainted: int  # devices with a NoSchedule or NoExecute taint
    shared: int = 0  # devices several claims may be allocated at once (allowMultipleAllocations)


class DraNode(Node, Protocol):
    def slices(self) -> list[SliceView]: ...
    def stop_kubelet(self, graceful: bool) -> None: ...
    def start_kubelet(self) -> float: ...  # monotonic time its socket was made
    def submit_pod(self) -> str: ...  # a check's pod made, not waited for: its name
    def pod_named(self, name: str) -> PodView | None: ...
    def pod_scheduled(self, name: str) -> bool: ...  # bound to the node, its claims allocated
    def prepare_failures(self, name: str) -> int: ...  # FailedPrepareDynamicResources events
    # a graceful deletion (DELETION_GRACE_S), not waited for: the API keeps the pod until the
    # kubelet has stopped it and unprepared its claims
    def request_pod_deletion(self, name: str) -> None: ...
    def unprepare_failures(self, name: str) -> int: ...  # the kubelet's lines (UNPREPARE_FAILED)
    def remove_registration_socket(self) -> float: ...  # CAP_REGISTRATION_SOCKET: when it went


def slice_view(item: dict[str, Any], driver: str, node_name: str) -> SliceView | None:
    """A ResourceSlice as the API server returns it, when it is `driver`'s for `node_name`."""
    spec = item.get("spec", {})
    if spec.get("driver") != driver or spec.get("nodeName") != node_name:
        return None
    devices = spec.get("devices") or []
    tainted = sum(
        1 for d in devices
        if any(t.get("effect") in BLOCKING_TAINTS for t in d.get("taints") or [])
    )  # fmt: skip
    shared = sum(1 for d in devices if d.get("allowMultipleAllocations"))
    return SliceView(item["metadata"]["uid"], len(devices), tainted, shared)


class SliceCounts:
    """capacity() and allocatable() of a DRA node, from its slices() (both DRA nodes)."""

    def slices(self) -> list[SliceView]:
        raise NotImplementedError

    def capacity(self) -> int:
        return sum(s.devices for s in self.slices())

    def allocatable(self) -> int:
        return sum(s.devices - s.tainted for s in self.slices())


# The kubelet's event reason for a failed NodePrepareResources (v1.37.2 pkg/kubelet/events).
PREPARE_FAILED = "FailedPrepareDynamicResources"


# The kubelet records no event when a pod's NodeUnprepareResources fails, only its pod worker's
# log line at each retry (v1.37.2 pod_workers.go: "Error syncing pod, skipping" err="unprepare
# dynamic resources: ..." pod="<namespace>/<name>"); it keeps the pod object meanwhile (the
# status manager deletes it once PodMightNeedToUnprepareResources is false).
UNPREPARE_FAILED = "unprepare dynamic resources"
SYNC_ERROR = '"Error syncing pod, skipping"'
# A graceful deletion's grace period: the kubelet stops the pod first (kubelet_pods.go
# PodCouldHaveRunningContainers), where a forced one (0) drops the object at once.
DELETION_GRACE_S = 1


def unprepare_failed(line: str, pod: str) -> bool:
    """A kubelet log line of a failed unprepare of the claims of the pod named `pod`."""
    return (
        SYNC_ERROR in line
        and UNPREPARE_FAILED in line
        and re.search(rf'pod="[^"/]*/{re.escape(pod)}"', line) is not None
    )


def scheduled_to(pod: dict[str, Any], node_name: str) -> dict[str, Any]:
    """A workload pod placed by the scheduler on `node_name` (it allocates the pod's claims; a
    pod bound by hand through nodeName never gets one)."""
    pod["spec"].pop("nodeName", None)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    return pod


def each_event(events: list[dict[str, Any]]) -> list[str]:
    """Every occurrence of the events' messages (an aggregated event counts them)."""
    out: list[str] = []
    for ev in events:
        out += [str(ev.get("message", ""))] * max(1, int(ev.get("count") or 1))
    return out


def refusal(
    pod: dict[str, Any], prepare_failures: Callable[[], list[str]]
) -> tuple[str, str] | None:
    """Why a pending pod is refused (reason, message): unschedulable, or its claims' prepare
    failed (the events asked only when it was scheduled); None while it may still run."""
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return "Unschedulable", str(cond.get("message", ""))
    failed = prepare_failures()
    return (PREPARE_FAILED, failed[-1]) if failed else None
