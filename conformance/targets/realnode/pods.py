"""Pods on the real node (CAP_PODS): real Pods through the API server, admitted by the kubelet.

A check's pod runs the counting guest as its own container command (`hvconform.guest
counter`), so it counts on through kubelet restarts with nobody attached to it; its state file
is /state/<pod UID>.json (the UID from the downward API). A pod with an owner is a ReplicaSet's:
the real kube-controller-manager runs it again when it fails (after a reboot). Observed: the
pod's status (phase, reason, container ID, restarts, allocatedResourcesStatus) from the API, the
devices from the kubelet's pod-resources API (List, GetAllocatableResources). The pod-resources
API names pods, not UIDs: every pod name the node ever saw maps to its UID, so a stale entry of a
deleted pod is still reported under the UID it had.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

from hv_device_plugin.api.wire import HEALTHY  # the pod status's word too (core/v1 ResourceHealth)
from hvconform.contract.node import PodResources, PodView
from hvconform.contract.wait import wait_for
from hvconform.targets.realnode import NODE_NAME, stack
from hvconform.targets.realnode.configs import NAMESPACE, workload_pod
from hvconform.targets.realnode.kubeapi import Api, ApiError
from hvconform.targets.realnode.kubeapi import PodResources as PodResourcesApi

POD_TIMEOUT_S = 60.0
CHECK_LABEL = "hv-check-pod"  # the pods (and ReplicaSets) of CAP_PODS, removed between checks
OWNER_LABEL = "hv-owner"
RS_LABEL = "hv-replicaset"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
REPLICASETS = f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets"
SETTLED = ("Running", "Failed", "Succeeded")


def _running_container(pod: dict[str, Any]) -> str:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    if not statuses or "running" not in statuses[0].get("state", {}):
        return ""
    return str(statuses[0].get("containerID", "")).partition("://")[2]


def _view(pod: dict[str, Any]) -> PodView:
    meta, status = pod["metadata"], pod.get("status", {})
    statuses = status.get("containerStatuses") or [{}]
    return PodView(
        uid=meta["uid"],
        name=meta["name"],
        owner=meta.get("labels", {}).get(OWNER_LABEL, ""),
        phase=status.get("phase", ""),
        reason=status.get("reason", ""),
        message=status.get("message", ""),
        container_id=_running_container(pod),
        restart_count=int(statuses[0].get("restartCount", 0)),
    )


class RealPods:
    """Mixin of RealNode: the pod half of the Node contract against the real kubelet."""

    api: Api | None
    resource: str
    workloads: Path  # the pods' /state on this host
    podresources: PodResourcesApi
    _workload_device: str  # where the runtime puts the hypervisor node in a container
    _pod_uids: dict[str, str]  # pod name -> UID, for every pod seen

    def _api(self) -> Api:
        assert self.api is not None, "the API server was never reached"
        return self.api

    # -- primitives (also the allocations' pods) ----------------------------------------------

    def _pod(self, name: str) -> dict[str, Any] | None:
        try:
            pod: dict[str, Any] = self._api().get(f"{PODS}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return pod

    def _delete_pod(self, name: str) -> None:
        """Deleted at once (grace 0: also while the kubelet is down), and gone from the API."""
        try:
            self._api().request("DELETE", f"{PODS}/{name}?gracePeriodSeconds=0")
        except ApiError as exc:
            if exc.status != 404:
                raise
        wait_for(lambda: self._pod(name) is None, POD_TIMEOUT_S, f"pod {name} deleted")

    def _container_id(self, pod: str) -> str:
        out = stack._crictl("ps", "-q", "--label", f"io.kubernetes.pod.name={pod}").stdout.split()
        return out[0] if out else ""

    def _settled(self, name: str) -> dict[str, Any] | None:
        pod = self._pod(name)
        phase = (pod or {}).get("status", {}).get("phase")
        return pod if phase in SETTLED else None

    def _listed(self, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._api().get(f"{PODS}?labelSelector={selector}")["items"]
        for pod in items:
            self._pod_uids[pod["metadata"]["name"]] = pod["metadata"]["uid"]
        return items

    def _placed(self, pod: dict[str, Any]) -> dict[str, Any]:
        """How a workload pod reaches the node: bound by name (a device plugin's resource is
        the node's own); a DRA node schedules it (dra_node)."""
        return pod

    # -- CAP_PODS -------------------------------------------------------------------------

    def _workload_spec(self, name: str, owner: str) -> dict[str, Any]:
        command = ["/usr/bin/python3", "-m", "hvconform.guest", "counter",
                   "--device", self._workload_device, "--state-file", "/state/$(POD_UID).json",
                   "--interval", "0.05"]  # fmt: skip
        pod = self._placed(workload_pod(name, self.resource, command, self.workloads))
        pod["metadata"]["labels"][CHECK_LABEL] = "1"
        if owner:
            pod["metadata"]["labels"][OWNER_LABEL] = owner
        container = pod["spec"]["containers"][0]
        container["env"].append(
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
        )
        return pod

    def start_pod(self, owner: str = "") -> PodView:
        name = f"hv-pod-{uuid.uuid4().hex[:8]}"
        pod = self._workload_spec(name, owner)
        if not owner:
            self._api().request("POST", PODS, pod)
            settled = wait_for(lambda: self._settled(name), POD_TIMEOUT_S,
                               f"pod {name} running or failed", interval=0.1)  # fmt: skip
            self._pod_uids[name] = settled["metadata"]["uid"]
            return _view(settled)
        # A controller's workload: a ReplicaSet of one, run again by the controller manager,
        # placed by the scheduler (as a real one is: not bound to the node while its status
        # offers no device, so a refused pod is not replaced in a loop by one bound anyway).
        labels = {**pod["metadata"]["labels"], RS_LABEL: name}
        pod["metadata"] = {"labels": labels}
        pod["spec"]["restartPolicy"] = "Always"
        pod["spec"].pop("nodeName", None)
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE_NAME}
        replicaset = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": name, "labels": {CHECK_LABEL: "1", OWNER_LABEL: owner}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {RS_LABEL: name}},
                     "template": pod},
        }  # fmt: skip
        self._api().request("POST", REPLICASETS, replicaset)

        def first() -> dict[str, Any] | None:
            pods = self._listed(f"{RS_LABEL}%3D{name}")
            done = [p for p in pods if p.get("status", {}).get("phase") in SETTLED]
            return done[0] if done else None

        return _view(wait_for(first, POD_TIMEOUT_S, f"the pod of ReplicaSet {name}", 0.1))

    def pods(self) -> list[PodView]:
        return [_view(p) for p in self._listed(CHECK_LABEL)]

    def _pod_by_uid(self, uid: str) -> dict[str, Any]:
        found = [p for p in self._listed(CHECK_LABEL) if p["metadata"]["uid"] == uid]
        if not found:
            raise AssertionError(f"pod {uid} is not on this node")
        return found[0]

    def pod_counter(self, uid: str) -> int:
        pod = _view(self._pod_by_uid(uid))
        assert pod.container_id, f"pod {pod.name} has no container ({pod.phase} {pod.reason})"
        try:
            return int(json.loads((self.workloads / f"{uid}.json").read_text())["counter"])
        except (OSError, ValueError, KeyError):
            return 0

    def delete_pod(self, uid: str) -> None:
        """Deleted and not replaced: its ReplicaSet first, when it has one."""
        found = [p for p in self._listed(CHECK_LABEL) if p["metadata"]["uid"] == uid]
        for pod in found:
            replicaset = pod["metadata"].get("labels", {}).get(RS_LABEL)
            if replicaset:
                self._delete_replicaset(replicaset)
            self._delete_pod(pod["metadata"]["name"])
        (self.workloads / f"{uid}.json").unlink(missing_ok=True)

    def _delete_replicaset(self, name: str) -> None:
        """The ReplicaSet gone (its pods orphaned, then deleted here: grace 0, no replacement)."""
        with contextlib.suppress(ApiError):  # already gone
            self._api().request("DELETE", f"{REPLICASETS}/{name}?propagationPolicy=Orphan")
        for pod in self._listed(f"{RS_LABEL}%3D{name}"):
            self._delete_pod(pod["metadata"]["name"])

    def delete_check_pods(self) -> None:
        """Every check's pod and ReplicaSet: the devices they hold are free for the next."""
        replicasets = self._api().get(f"{REPLICASETS}?labelSelector={CHECK_LABEL}")["items"]
        for rs in replicasets:
            self._delete_replicaset(rs["metadata"]["name"])
        for pod in self._listed(CHECK_LABEL):
            self._delete_pod(pod["metadata"]["name"])
            (self.workloads / f"{pod['metadata']['uid']}.json").unlink(missing_ok=True)

    def pod_resources(self) -> PodResources:
        """List (every pod the kubelet holds, by UID) and GetAllocatableResources."""
        self._listed("")  # names of pods made since the last look (allocations' too)
        devices: dict[str, tuple[str, ...]] = {}
        for entry in self.podresources.pods():
            uid = self._pod_uids.get(entry.name)
            if entry.namespace == NAMESPACE and uid is not None:
                held = devices.get(uid, ()) + tuple(entry.devices.get(self.resource, []))
                devices[uid] = held
        allocatable = self.podresources.allocatable().get(self.resource, [])
        return PodResources(devices, tuple(sorted(allocatable)))

    def pod_device_health(self, uid: str) -> dict[str, bool]:
        """allocatedResourcesStatus of the pod's container: device ID -> Healthy (KEP-4680:
        Unhealthy and Unknown are not)."""
        pod = self._pod_by_uid(uid)
        health: dict[str, bool] = {}
        for container in pod.get("status", {}).get("containerStatuses") or []:
            for status in container.get("allocatedResourcesStatus") or []:
                if status.get("name") == self.resource:
                    for res in status.get("resources") or []:
                        health[res["resourceID"]] = res.get("health") == HEALTHY
        return health
