"""A cluster node with a DRA driver under test (the profile's `dra` section), on kind.

The driver runs as its chart's DaemonSet (mode: dra) with the chart's RBAC, admission policy and
DeviceClass, applied as the profile's deploy section renders them: nothing DRA-specific is made
here. What differs from a device plugin's node is what hvconform.contract.dra says:
- capacity and allocatable are the devices of the driver's ResourceSlices for this node (the
  node status has no extended resource of a DRA driver);
- workload pods are scheduled, pinned by a nodeSelector: the scheduler allocates their claims,
  a pod bound by hand (nodeName) never gets one;
- a refusal is the scheduler's (Unschedulable) or the kubelet's (FailedPrepareDynamicResources);
- the kubelet is stopped and started as a systemd unit inside the node, as the reboot does; its
  failed unprepares are its log's lines, read in the node (it records no event for them);
- the plugin's CDI spec is the session claim's, found from the devices the runtime was asked
  for (no spec exists before a claim is prepared);
- read-only CDI storage is made in the driver's own view too when the chart's CDI mount does
  not propagate node mounts into it (hvconform.targets.cluster.inside): a claim prepared
  meanwhile fails as it would on a read-only node;
- the driver's registration socket is not removed here (CAP_REGISTRATION_SOCKET not declared):
  telling it from the other sockets of the node's plugins_registry takes a GetInfo call in the
  node, which has no gRPC client.
"""

from __future__ import annotations

from typing import Any

from hv_device_plugin.api.dra_wire import RESOURCE_API
from hvconform.contract.base import discover_spec
from hvconform.contract.dra import (
    CAP_DRA,
    CAP_KUBELET_STOP,
    CAP_REGISTRATION_SOCKET,
    DELETION_GRACE_S,
    DEVICE_PLUGIN_ONLY,
    PREPARE_FAILED,
    UNPREPARE_FAILED,
    SliceCounts,
    SliceView,
    each_event,
    refusal,
    scheduled_to,
    slice_view,
    unprepare_failed,
)
from hvconform.contract.node import CAP_GUEST, CAP_LONG_GUEST, PodView
from hvconform.contract.wait import wait_for
from hvconform.targets.cluster.kube import Obj
from hvconform.targets.cluster.kubelet import (
    KUBELET_LOG_LINES,
    KUBELET_START,
    KUBELET_STOP,
    to_monotonic,
)
from hvconform.targets.cluster.node import ClusterNode
from hvconform.targets.cluster.pods import OWNER_LABEL, WORKLOAD_LABEL, pod_view


class ClusterDraNode(SliceCounts, ClusterNode):
    """ClusterNode with the DRA node's observations (hvconform.contract.dra.DraNode)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        assert self.plugin is not None and self.plugin.dra is not None, "a DRA driver's node"
        self.dra = self.plugin.dra
        self.capabilities = self._dra_capabilities(self.capabilities)

    def _dra_capabilities(self, caps: frozenset[str]) -> frozenset[str]:
        for cap in DEVICE_PLUGIN_ONLY & caps:
            self.capability_notes[cap] = "the plugin under test is a DRA driver"
        caps = (caps - DEVICE_PLUGIN_ONLY) | {CAP_DRA}
        self.capability_notes[CAP_REGISTRATION_SOCKET] = (
            "the driver's registration socket is told from the others by GetInfo, and the node "
            "has no gRPC client to ask it"
        )
        if getattr(self.access, "local_path", None) is None:  # the diagnostic pod's exec
            self.capability_notes[CAP_KUBELET_STOP] = (
                f"node access through {self.access.where} rides on the kubelet: it cannot "
                "start a kubelet it has stopped (use --node-access direct)"
            )
            return caps
        return caps | {CAP_KUBELET_STOP}

    # -- lifecycle ------------------------------------------------------------------------

    def setup(self) -> None:
        """ClusterNode's setup in the order a DRA driver allows: the session pod's claim is
        prepared before there is any spec to take as the baseline."""
        t = self.options.rollout_timeout
        self.kubelet_root = self.kubelet_root_dir()
        wait_for(self.plugin_ready, t, "plugin readiness at node setup", self._poll)
        wait_for(lambda: self.allocatable() > 0, t, "a published device at node setup", self._poll)
        self.host_metadata_at_start = self.host_device_metadata()
        self.enable_inside()
        self.enable_cdi_inside()
        self.enable_workload_faults()
        for name, data in self.sentinels.items():
            self.write_file("cdi", name, data)
        allocation = self.allocate()
        assert allocation.ok, (
            f"the session pod was refused at node setup: {allocation.reason} {allocation.message}"
        )
        self.spec_name = self.spec_name or discover_spec(self, allocation.cdi_devices)
        if self.spec_name:
            self.baseline_spec = wait_for(lambda: self.read_file("cdi", self.spec_name), t,
                                          "the session claim's CDI spec at setup", self._poll)  # fmt: skip
        if CAP_LONG_GUEST in self.capabilities and allocation.cdi_devices:
            self.session_guest = self.start_long_guest(allocation)
        else:  # nothing injected through CDI: no guest can be judged here
            self.release(allocation)
            self.capabilities -= {CAP_GUEST, CAP_LONG_GUEST}

    def enable_workload_faults(self) -> None:
        super().enable_workload_faults()
        self.capabilities = self._dra_capabilities(self.capabilities)
        # pod-resources' GetAllocatableResources lists device-plugin devices only: a sample of
        # it says nothing of a DRA driver's
        self.stop_sampler()

    # -- observations ---------------------------------------------------------------------

    def slices(self) -> list[SliceView]:
        items = self.api.list_objects(RESOURCE_API, "ResourceSlice")
        views = (slice_view(item, self.dra.driver, self.node_name) for item in items)
        return [v for v in views if v is not None]

    # -- pods -----------------------------------------------------------------------------

    def _placed(self, pod: Obj) -> Obj:
        return scheduled_to(pod, self.node_name)

    def _admitted(self, created: Obj) -> dict[str, Any] | None:
        settled = super()._admitted(created)
        if settled is not None:
            return settled
        name = created["metadata"]["name"]
        pod = self.api.get("v1", "Pod", name, self.options.work_namespace)
        if pod is None:
            return None
        why = refusal(pod, lambda: self._prepare_events(name))
        if why is None:
            return None
        phase = pod.get("status", {}).get("phase", "Pending")
        return {"ok": False, "phase": phase, "pod": pod, "reason": why[0], "message": why[1]}

    def _prepare_events(self, name: str) -> list[str]:
        """Each failed NodePrepareResources of the pod, as the kubelet's events count them."""
        fields = f"involvedObject.name={name},reason={PREPARE_FAILED}"
        return each_event(
            self.api.list_objects("v1", "Event", self.options.work_namespace, fields=fields)
        )

    def prepare_failures(self, name: str) -> int:
        return len(self._prepare_events(name))

    def request_pod_deletion(self, name: str) -> None:
        self.api.delete("v1", "Pod", name, self.options.work_namespace, grace=DELETION_GRACE_S)

    def unprepare_failures(self, name: str) -> int:
        script = ["sh", "-c", KUBELET_LOG_LINES, "sh", str(self._since), UNPREPARE_FAILED]
        return sum(1 for line in self._node(script).splitlines() if unprepare_failed(line, name))

    def submit_pod(self) -> str:
        self._started_pods = True
        pod = self._new_pod("pod")
        name = str(pod["metadata"]["name"])
        pod["metadata"]["labels"].update({OWNER_LABEL: "", WORKLOAD_LABEL: name})
        self.api.create(pod)
        return name

    def pod_named(self, name: str) -> PodView | None:
        pod = self.api.get("v1", "Pod", name, self.options.work_namespace)
        return None if pod is None else pod_view(pod)

    def pod_scheduled(self, name: str) -> bool:
        pod = self.api.get("v1", "Pod", name, self.options.work_namespace) or {}
        return bool(pod.get("spec", {}).get("nodeName") == self.node_name)

    # -- the kubelet ----------------------------------------------------------------------

    def stop_kubelet(self, graceful: bool) -> None:
        self._node_down = True  # first: a check that fails meanwhile has it started again
        how = "graceful" if graceful else "crash"
        self._node(["sh", "-c", KUBELET_STOP, "sh", how])

    def start_kubelet(self) -> float:
        """Started; returns when its socket was made (the node's clock), as restart_kubelet."""
        issued = float(self._node(["sh", "-c", KUBELET_START]).split()[0])
        self._node_down = False

        def back() -> float | None:
            pid, sock, _ = self._kubelet_state()
            return sock if pid != "0" and sock > issued else None

        made = wait_for(back, self.options.pod_timeout, "the kubelet's socket after its start",
                        min(0.2, self._poll))  # fmt: skip
        return to_monotonic(made)
