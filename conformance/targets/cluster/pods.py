"""Pods holding the device on a cluster node, as the real kubelet runs them (CAP_PODS).

A pod asks for one slot of the plugin's resource and runs the suite's counting guest as its
container command (the guest image's `python3 -m hvconform.guest counter`, its state in an
emptyDir), so a kubelet restart that keeps the container keeps the count going. A bare pod is
pinned by nodeName (the kubelet's own admission answers); a controller's workload (`owner`) is a
ReplicaSet of one, pinned the same way, which runs a new pod when its pod fails (after a reboot).
What the kubelet says about them comes from the API (pod status, allocatedResourcesStatus) and
from its pod-resources API on the node (hvconform.targets.cluster.podresources).
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import TYPE_CHECKING, Any

from hv_device_plugin.api.wire import HEALTHY  # the pod status's word too (core/v1 ResourceHealth)
from hvconform.contract.node import CAP_GUEST, Allocation, NodeEvent, PodResources, PodView
from hvconform.contract.quantity import quantity
from hvconform.contract.wait import wait_for
from hvconform.targets.cluster.access import NodeAccess, NodeFiles
from hvconform.targets.cluster.guests import container_id, running
from hvconform.targets.cluster.kube import KubeApi, Obj
from hvconform.targets.cluster.plan import ClusterOptions
from hvconform.targets.cluster.podresources import SOCKET, NodePodResources, PodResourcesClient
from hvconform.targets.cluster.workloads import Layout, workload_pod

OWNER_LABEL = "hvconform/owner"  # the controller's name the scenario gave ("": a bare pod)
WORKLOAD_LABEL = "hvconform/workload"  # the object to delete: the pod's own, or its ReplicaSet's


def pod_view(pod: Obj) -> PodView:
    meta, st = pod["metadata"], pod.get("status", {})
    statuses = st.get("containerStatuses", [])
    reason, message = st.get("reason", ""), st.get("message", "")
    for cs in statuses:  # a container that cannot start says why where the pod does not
        waiting = cs.get("state", {}).get("waiting", {})
        if not reason and waiting.get("reason") not in (None, "ContainerCreating"):
            reason, message = waiting.get("reason", ""), waiting.get("message", "")
    return PodView(
        uid=str(meta["uid"]),
        name=str(meta["name"]),
        owner=str((meta.get("labels") or {}).get(OWNER_LABEL, "")),
        phase=str(st.get("phase", "Pending")),
        reason=str(reason),
        message=str(message),
        container_id=container_id(pod, "guest") if running(pod, "guest") else "",
        restart_count=sum(int(cs.get("restartCount", 0)) for cs in statuses),
    )


def replica_set(pod: Obj, name: str, owner: str) -> Obj:
    """A ReplicaSet of one whose pod is `pod` (restartPolicy Always, as a controller's must be)."""
    template = copy.deepcopy(pod)
    labels = {**template["metadata"]["labels"], OWNER_LABEL: owner, WORKLOAD_LABEL: name}
    template["spec"]["restartPolicy"] = "Always"
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": pod["metadata"]["namespace"], "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {WORKLOAD_LABEL: name}},
            "template": {"metadata": {"labels": labels}, "spec": template["spec"]},
        },
    }


class ClusterPods:
    """Mixin of ClusterNode: pods (CAP_PODS) over the API and the kubelet's pod-resources API."""

    api: KubeApi
    access: NodeAccess
    files: NodeFiles
    options: ClusterOptions
    layout: Layout
    capabilities: frozenset[str]
    node_name: str
    resource: str
    kubelet_root: str
    taint: bool
    _serial: int
    _poll: float
    _podres: PodResourcesClient | None = None
    _podres_local: bool = False  # read from this machine: cheap enough to sample and poll
    _events: list[NodeEvent]
    _node_down: bool = False
    _started_pods: bool = False  # start_pod was called: delete_workloads has work to do

    if TYPE_CHECKING:  # GuestPods' and ClusterNode's, after this class in the MRO

        def _node_tag(self) -> str: ...
        def _placed(self, pod: Obj) -> Obj: ...
        def _admitted(self, created: Obj) -> dict[str, Any] | None: ...
        def long_guest_counter(self, handle: str) -> int: ...
        def plugin_pod(self) -> Obj | None: ...

    def allocate(self) -> Allocation:
        # Each request the kubelet answers is part of its record (node_events)
        allocation: Allocation = super().allocate()  # type: ignore[misc]
        if allocation.ok:
            self._events.append(NodeEvent(time.monotonic(), "admitted"))
        else:
            text = f"{allocation.reason}: {allocation.message}"
            self._events.append(NodeEvent(time.monotonic(), "refused", detail=text))
        return allocation

    # -- the kubelet's counts -------------------------------------------------------------

    def _node_status(self, key: str) -> int:
        node = self.api.get("v1", "Node", self.node_name) or {}
        return quantity(str(node.get("status", {}).get(key, {}).get(self.resource, "0")))

    def capacity(self) -> int:
        return self._node_status("capacity")

    def allocatable(self) -> int:
        """The kubelet's own count (pod-resources GetAllocatableResources) where it can be
        read: the Node status the API server holds lags it by up to the 10 s status period,
        long enough for a plugin's unhealthy minute to look healthy."""
        if self._podres is not None and self._podres_local:
            # the kubelet restarting: the API's last word meanwhile
            with contextlib.suppress(Exception):
                return len(self._podres.allocatable())
        return self._node_status("allocatable")

    # -- the pod-resources API ------------------------------------------------------------

    def podresources_reason(self) -> str:
        """'' when the kubelet's pod-resources socket answers, else why not. From this machine
        when it reaches the node's files (docker exec, direct); else by python3 on the node,
        or in the diagnostic pod (its image's), over node access."""
        socket = f"{self.kubelet_root}/{SOCKET}"
        local = getattr(self.access, "local_path", None)
        path = local(socket) if local is not None else None
        clients: list[PodResourcesClient] = []
        if path is not None:
            clients.append(PodResourcesClient(path, self.resource))
        else:
            clients.append(NodePodResources(self.access.run, socket, self.resource))
            in_pod = getattr(self.access, "run_in_pod", None)
            if in_pod is not None:
                clients.append(NodePodResources(in_pod, f"/proc/1/root{socket}", self.resource))
        errors = []
        for client in clients:
            try:
                client.allocatable()
            except Exception as exc:  # grpc.RpcError, NodeAccessError, no python3 there
                errors.append(str(exc)[:200])
                continue
            self._podres = client
            self._podres_local = path is not None
            return ""
        return (
            f"the kubelet's pod-resources API at {socket} did not answer through "
            f"{self.access.where} ({'; '.join(errors)})"
        )

    def _client(self) -> PodResourcesClient:
        assert self._podres is not None, "pod-resources API not reachable (CAP_PODS undeclared)"
        return self._podres

    def pod_resources(self) -> PodResources:
        client = self._client()
        uids = {
            (p["metadata"].get("namespace", ""), p["metadata"]["name"]): str(p["metadata"]["uid"])
            for p in self.api.list_objects("v1", "Pod", fields=f"spec.nodeName={self.node_name}")
        }
        listed = {
            uids[(p.namespace, p.name)]: p.devices
            for p in client.pods()
            if (p.namespace, p.name) in uids
        }
        return PodResources(listed, client.allocatable())

    # -- pods -----------------------------------------------------------------------------

    def _new_pod(self, prefix: str) -> Obj:
        self._serial += 1
        pod = workload_pod(
            f"hvconform-{prefix}-{self.options.short_id}-{self._node_tag()}{self._serial}",
            self.options.work_namespace,
            self.node_name,
            self.options.guest_image or self.options.image,
            self.options.device,
            taint=self.taint,
            guest=CAP_GUEST in self.capabilities,
            resource=self.resource,
        )
        return self._placed(pod)

    def start_pod(self, owner: str = "") -> PodView:
        self._started_pods = True
        pod = self._new_pod("rs" if owner else "pod")
        name = pod["metadata"]["name"]
        pod["metadata"]["labels"].update({OWNER_LABEL: owner, WORKLOAD_LABEL: name})
        if owner:
            self.api.create(replica_set(pod, name, owner))

            def made() -> Obj | None:
                found = self._workload_pods(name)
                return found[0] if found else None

            created = wait_for(made, self.options.pod_timeout, f"{name}'s pod", self._poll)
        else:
            created = self.api.create(pod)
        status = wait_for(
            lambda: self._admitted(created), self.options.pod_timeout, "pod admission", self._poll
        )
        view = pod_view(status["pod"])
        if view.phase == "Failed":
            self._events.append(NodeEvent(time.monotonic(), "refused",
                                          detail=f"{view.reason}: {view.message}"))  # fmt: skip
        return view

    def _workload_pods(self, workload: str = "") -> list[Obj]:
        labels = f"{WORKLOAD_LABEL}={workload}" if workload else WORKLOAD_LABEL
        pods: list[Obj] = self.api.list_objects(
            "v1",
            "Pod",
            self.options.work_namespace,
            labels=labels,
            fields=f"spec.nodeName={self.node_name}",
        )
        return pods

    def pods(self) -> list[PodView]:
        """Every workload pod of this run on the node (the session guest's and the checks')."""
        pods: list[Obj] = self.api.list_objects(
            "v1", "Pod", self.options.work_namespace, fields=f"spec.nodeName={self.node_name}"
        )
        return [pod_view(p) for p in pods]

    def _by_uid(self, uid: str) -> Obj | None:
        for pod in self.api.list_objects(
            "v1", "Pod", self.options.work_namespace, fields=f"spec.nodeName={self.node_name}"
        ):
            if pod["metadata"]["uid"] == uid:
                found: Obj = pod
                return found
        return None

    def pod_counter(self, uid: str) -> int:
        pod = self._by_uid(uid)
        assert pod is not None, f"pod {uid} is not on node {self.node_name}"
        name = pod["metadata"]["name"]
        handle = f"{pod['metadata']['namespace']}/{name}/{uid}"
        return self.long_guest_counter(handle)

    def delete_pod(self, uid: str) -> None:
        """Deleted and not replaced: a controller's pod goes with its ReplicaSet. While the node
        is down (no kubelet to confirm a graceful deletion) the API forgets it at once."""
        pod = self._by_uid(uid)
        if pod is None:
            return  # already gone (a ReplicaSet deleted for an earlier pod of it)
        meta = pod["metadata"]
        ns, workload = meta["namespace"], (meta.get("labels") or {}).get(WORKLOAD_LABEL, "")
        grace = 0 if self._node_down else 5
        owned = any(r.get("kind") == "ReplicaSet" for r in meta.get("ownerReferences", []))
        kind, api_version, name = (
            ("ReplicaSet", "apps/v1", workload) if owned else ("Pod", "v1", meta["name"])
        )
        self.api.delete(api_version, kind, name, ns, grace=grace)
        timeout, poll = self.options.pod_timeout, self.options.poll_interval
        if not self.api.wait_gone(api_version, kind, name, ns, timeout, poll):
            raise RuntimeError(f"{kind} {ns}/{name} still present")
        if owned:  # foreground deletion: its pods are gone before it is
            left = [p["metadata"]["name"] for p in self._workload_pods(workload)]
            assert not left, f"pods of ReplicaSet {name} left: {left}"

    def delete_workloads(self) -> None:
        """What the checks' pods left (a failed check's): every ReplicaSet and pod of ours."""
        if not self._started_pods:
            return
        ns = self.options.work_namespace
        for rs in self.api.list_objects("apps/v1", "ReplicaSet", ns, labels=OWNER_LABEL):
            self.api.delete("apps/v1", "ReplicaSet", rs["metadata"]["name"], ns, grace=0)
        for pod in self._workload_pods():
            self.api.delete("v1", "Pod", pod["metadata"]["name"], ns, grace=0)

    def plugin_running(self) -> bool:
        """The plugin's container runs (whether or not it is ready)."""
        pod = self.plugin_pod()
        return pod is not None and running(pod, self.layout.container)

    def pod_device_health(self, uid: str) -> dict[str, bool]:
        """allocatedResourcesStatus (KEP-4680) of the pod's containers for the resource:
        Healthy, or not (Unhealthy, Unknown)."""
        pod = self._by_uid(uid)
        assert pod is not None, f"pod {uid} is not on node {self.node_name}"
        health: dict[str, bool] = {}
        for cs in pod.get("status", {}).get("containerStatuses", []):
            for res in cs.get("allocatedResourcesStatus") or []:
                if res.get("name") != self.resource:
                    continue
                for dev in res.get("resources") or []:
                    health[str(dev.get("resourceID", ""))] = dev.get("health") == HEALTHY
        return health
