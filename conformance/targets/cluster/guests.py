"""Workload pods of the cluster node: allocation through kubelet admission, guest runs, counters.

A workload pod requests one `hyperlight.dev/hypervisor` slot on the node (nodeName: the kubelet's
own admission answers), runs the compute guest once, then the long-running counter guest. What
the runtime was asked for comes from crictl (the CRI config's CDI devices); the guest's result
from its log; the counter from its emptyDir, read on the node.
"""

from __future__ import annotations

import json
from typing import Any

from hvconform.contract.node import CAP_GUEST, Allocation, GuestOutcome
from hvconform.contract.nodeinit import CRICTL
from hvconform.contract.wait import wait_for
from hvconform.targets.cluster.access import NodeAccess, NodeFiles
from hvconform.targets.cluster.kube import KubeApi, Obj
from hvconform.targets.cluster.plan import ClusterOptions
from hvconform.targets.cluster.workloads import workload_pod

# The node's crictl: the node init's (bound to its containerd) where there is one.
CRICTL_SNIPPET = f"if [ -x {CRICTL} ]; then c={CRICTL}; else c=crictl; fi; "
FAILED_WAITING = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError")


def container_id(pod: Obj, name: str = "") -> str:
    for cs in pod.get("status", {}).get("containerStatuses", []):
        if not name or cs.get("name") == name:
            return str(cs.get("containerID", "")).split("://")[-1]
    return ""


def running(pod: Obj, name: str = "") -> bool:
    return any(
        "running" in cs.get("state", {})
        for cs in pod.get("status", {}).get("containerStatuses", [])
        if not name or cs.get("name") == name
    )


class GuestPods:
    """Mixin of ClusterNode: the workload half of the Node protocol."""

    api: KubeApi
    access: NodeAccess
    files: NodeFiles
    options: ClusterOptions
    capabilities: frozenset[str]
    node_name: str
    taint: bool
    _pods: dict[int, Obj]
    _serial: int
    _poll: float
    resource: str
    kubelet_root: str

    # -- workloads ------------------------------------------------------------------------

    def allocate(self) -> Allocation:
        self._serial += 1
        pod = workload_pod(
            f"hvconform-guest-{self.options.short_id}-{self._node_tag()}{self._serial}",
            self.options.work_namespace,
            self.node_name,
            self.options.guest_image or self.options.image,
            self.options.device,
            taint=self.taint,
            guest=CAP_GUEST in self.capabilities,
            resource=self.resource,
        )
        created = self.api.create(self._placed(pod))
        status = wait_for(
            lambda: self._admitted(created), self.options.pod_timeout, "pod admission", self._poll
        )
        allocation = Allocation(ok=status["ok"], phase=status["phase"], reason=status["reason"])
        allocation.message = status["message"]
        if not allocation.ok:
            self._delete_pod(created, wait=False)  # a refused pod holds nothing
            return allocation
        self._pods[id(allocation)] = status["pod"]
        allocation.cdi_devices = self._cdi_devices(status["pod"])
        return allocation

    def _placed(self, pod: Obj) -> Obj:
        """How a workload pod reaches this node: bound by hand (nodeName, the kubelet's own
        admission answers); a DRA node schedules it instead."""
        return pod

    def _node_tag(self) -> str:
        """Several nodes of one run share the work namespace: their pods are named apart."""
        return f"{self.node_name}-" if self.options.per_node else ""

    def _admitted(self, created: Obj) -> dict[str, Any] | None:
        name, ns = created["metadata"]["name"], created["metadata"]["namespace"]
        pod = self.api.get("v1", "Pod", name, ns) or created
        st = pod.get("status", {})
        phase = st.get("phase", "Pending")
        if phase == "Failed":
            return {
                "ok": False,
                "phase": phase,
                "reason": st.get("reason", ""),
                "message": st.get("message", ""),
                "pod": pod,
            }
        for cs in st.get("containerStatuses", []):
            waiting = cs.get("state", {}).get("waiting", {})
            if waiting.get("reason") in FAILED_WAITING:
                return {
                    "ok": False,
                    "phase": phase,
                    "reason": waiting["reason"],
                    "message": waiting.get("message", ""),
                    "pod": pod,
                }
        if phase in ("Running", "Succeeded") and container_id(pod):
            return {"ok": True, "phase": phase, "reason": "", "message": "", "pod": pod}
        return None

    def _cdi_devices(self, pod: Obj) -> list[str]:
        """What the kubelet asked the runtime for: the CRI config's CDI devices (crictl)."""
        inspect = CRICTL_SNIPPET + '$c inspect -o json "$1"'
        result = self.access.run(["sh", "-c", inspect, "sh", container_id(pod)])
        if result.rc != 0:
            return []
        config = json.loads(result.stdout).get("info", {}).get("config", {})
        devices = (
            config.get("CDI_devices") or config.get("cdi_devices") or config.get("CDIDevices") or []
        )
        return [str(d.get("name", "")) for d in devices]

    def _delete_pod(self, pod: Obj, wait: bool = True) -> None:
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        self.api.delete("v1", "Pod", name, ns, grace=5)
        if wait and not self.api.wait_gone(
            "v1", "Pod", name, ns, self.options.pod_timeout, self.options.poll_interval
        ):
            raise RuntimeError(f"workload pod {ns}/{name} still present")

    def release(self, allocation: Allocation) -> None:
        pod = self._pods.pop(id(allocation), None)
        if pod is not None:
            self._delete_pod(pod)

    def run_guest(self, allocation: Allocation) -> GuestOutcome:
        pod = self._pods[id(allocation)]
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]

        def record() -> dict[str, Any] | None:
            for line in self.api.pod_log(ns, name, "guest").splitlines():
                if line.startswith("{") and '"run"' in line:
                    parsed: dict[str, Any] = json.loads(line)
                    return parsed
            current = self.api.get("v1", "Pod", name, ns) or {}
            if current.get("status", {}).get("phase") in ("Failed", "Succeeded"):
                return {
                    "ok": False,
                    "reason": f"guest pod ended: {self.api.pod_log(ns, name)[-400:]}",
                }
            return None

        found = wait_for(
            record, self.options.pod_timeout, f"guest output in {name}'s log", self._poll
        )
        return GuestOutcome(bool(found.get("ok")), json.dumps(found)[:600], found.get("value"))

    def start_long_guest(self, allocation: Allocation) -> str:
        pod = self._pods[id(allocation)]
        return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}/{pod['metadata']['uid']}"

    def long_guest_counter(self, handle: str) -> int:
        ns, name, uid = handle.split("/")
        pod = self.api.get("v1", "Pod", name, ns) or {}
        assert running(pod, "guest"), f"long-running guest {ns}/{name} is not running"
        path = f"{self.kubelet_root}/pods/{uid}/volumes/kubernetes.io~empty-dir/state/counter.json"
        data = self.files.read_path(path)
        try:
            return int(json.loads(data or b"{}")["counter"])
        except (ValueError, KeyError):
            return 0
