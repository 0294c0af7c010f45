"""The plugin pod of a cluster node: found, probed, restarted, varied, read back.

A mixin of ClusterNode (conformance.targets.cluster.node): the plugin runs as the profile's
DaemonSet pod; its health comes through the API server's pod proxy (or the pod's conditions when
no HTTP endpoint was found), a restart deletes the pod and waits for its replacement, and the
faults that need another plugin view swap the DaemonSet for a variant (or act inside the running
plugin's namespaces when the target can).
"""

from __future__ import annotations

from conformance.contract.base import NodeBase
from conformance.contract.ran import PluginRan
from conformance.contract.results import NotApplicable
from conformance.contract.wait import wait_for
from conformance.targets.cluster.access import NodeAccess, NodeFiles
from conformance.targets.cluster.guests import CRICTL_SNIPPET, container_id, running
from conformance.targets.cluster.inside import InsideFaults
from conformance.targets.cluster.kube import ApiError, KubeApi, Obj
from conformance.targets.cluster.plan import ClusterOptions
from conformance.targets.cluster.ran import pod_ran
from conformance.targets.cluster.workloads import (
    Layout,
    variant_device_unusable,
    variant_sockets_empty,
)

CPU = (
    CRICTL_SNIPPET + "pid=$($c inspect --output go-template --template '{{.info.pid}}' \"$1\") "
    '&& cat "/proc/$pid/stat" && getconf CLK_TCK'
)


class PluginPod(InsideFaults, NodeBase):
    api: KubeApi
    access: NodeAccess
    files: NodeFiles
    layout: Layout
    options: ClusterOptions
    node_name: str
    plugin_ds: Obj
    host_metadata_at_start: dict[str, int | str]
    _real: tuple[int, int]
    _poll: float

    def _node(self, argv: list[str]) -> str:
        raise NotImplementedError  # ClusterNode's

    def _plugin_pods(self) -> list[Obj]:
        """Every plugin pod on this node, terminating ones included."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(self.layout.selector.items()))
        pods: list[Obj] = self.api.list_objects(
            "v1",
            "Pod",
            self.layout.namespace,
            labels=selector,
            fields=f"spec.nodeName={self.node_name}",
        )
        return pods

    def plugin_pod(self) -> Obj | None:
        """The newest plugin pod on this node that is not terminating."""
        live = [p for p in self._plugin_pods() if not p["metadata"].get("deletionTimestamp")]
        live.sort(key=lambda p: str(p["metadata"].get("creationTimestamp", "")))
        return live[-1] if live else None

    def _pod(self) -> Obj:
        pod = self.plugin_pod()
        assert pod is not None, f"no plugin pod on node {self.node_name}"
        return pod

    def _health(self, path: str, condition: str) -> bool:
        pod = self.plugin_pod()
        if pod is None or not running(pod, self.layout.container):
            return False
        if self.layout.health_port is None:  # no HTTP health endpoint found: the pod condition
            conds = pod.get("status", {}).get("conditions", [])
            return any(c["type"] == condition and c["status"] == "True" for c in conds)
        port = self.layout.health_port
        return self.api.pod_proxy(self.layout.namespace, pod["metadata"]["name"], port, path) == 200

    def plugin_live(self) -> bool:
        return self._health("/healthz", "ContainersReady")

    def plugin_ready(self) -> bool:
        return self._health("/readyz", "Ready")

    def plugin_instance(self) -> str:
        pod = self._pod()
        return f"{pod['metadata']['uid']}/{container_id(pod, self.layout.container)}"

    def replaced_by_running_pod(self, old_uid: str) -> bool:
        """A plugin pod other than `old_uid` runs here, with its container started."""
        pod = self.plugin_pod()
        return bool(
            pod
            and pod["metadata"]["uid"] != old_uid
            and running(pod, self.layout.container)
            and container_id(pod, self.layout.container)
        )

    def _wait_new_plugin(self, old_uid: str) -> None:
        wait_for(lambda: self.replaced_by_running_pod(old_uid), self.options.pod_timeout,
                 "replacement plugin pod running", self._poll)  # fmt: skip

        # The old pod may still be terminating while the new one registers: the restart is done
        # when it is gone, so a check always sees the old plugin's last word to the kubelet
        # (its empty list or stream end, which the kubelet applies to the resource name).
        def old_gone() -> bool:
            return all(p["metadata"]["uid"] != old_uid for p in self._plugin_pods())

        wait_for(old_gone, self.options.pod_timeout,
                 "the replaced plugin pod gone (terminated and deleted)", self._poll)  # fmt: skip

    def restart_plugin(self) -> None:
        pod = self._pod()
        self.api.delete("v1", "Pod", pod["metadata"]["name"], self.layout.namespace)
        self._wait_new_plugin(pod["metadata"]["uid"])

    def _swap_daemonset(self, ds: Obj) -> None:
        if self.options.extra.get("scope") == "node":
            raise NotApplicable(
                "replacing the plugin DaemonSet restarts the plugin on every node of the run, "
                "where other nodes' checks are running: not with several nodes at once"
            )
        old = self._pod()["metadata"]["uid"]
        self.api.replace(ds)
        self._wait_new_plugin(old)

    def redirect_plugin_sockets(self, empty: bool) -> None:
        if self.inside is not None:  # the plugin stays; its view of the dir is replaced
            return self.inside_sockets(empty)
        variant = variant_sockets_empty(self.plugin_ds, self.layout)
        self._swap_daemonset(variant if empty else self.plugin_ds)

    def start_plugin_isolated(self) -> None:
        """A new plugin pod whose socket dir is an empty directory (a DaemonSet variant)."""
        self._swap_daemonset(variant_sockets_empty(self.plugin_ds, self.layout))

    def restore_plugin_sockets(self) -> None:
        self._swap_daemonset(self.plugin_ds)

    def set_device_present(self, present: bool) -> None:
        if self.inside is not None:
            return self.inside_device_present(present)
        return super().set_device_present(present)

    def _plugin_container(self) -> str:
        return container_id(self._pod(), self.layout.container)

    def remap_device_unusable(self, unusable: bool) -> None:
        if self.inside is not None:
            return self.inside_unusable(unusable)
        device = self.options.hypervisor
        if unusable:
            real = self.host_metadata_at_start
            self.files.replace_char_device("host_dev", device, 1, 3)  # identity made to match
            self._swap_daemonset(
                variant_device_unusable(self.plugin_ds, self.layout, f"/dev/{device}")
            )
            self._real = (int(real["major"]), int(real["minor"]))
        else:
            major, minor = self._real
            self.files.replace_char_device("host_dev", device, major, minor)
            self._swap_daemonset(self.plugin_ds)

    def plugin_log_tail(self, lines: int = 50) -> str:
        pod = self.plugin_pod()
        if pod is None:
            return "(no plugin pod)"
        name = pod["metadata"]["name"]
        try:
            return self.api.pod_log(self.layout.namespace, name, self.layout.container, tail=lines)
        except ApiError as exc:  # the kubelet serves logs: evidence must not hide the failure
            return f"(plugin log unavailable: {exc})"

    def plugin_ran(self) -> PluginRan:
        """What runs as the plugin, read back from its pod: the spec's image, command and args,
        and the image ID the kubelet reports (conformance.targets.cluster.ran)."""
        return pod_ran(self._pod(), self.layout.container)

    def plugin_cpu_seconds(self) -> float:
        cid = container_id(self._pod(), self.layout.container)
        out = self._node(["sh", "-c", CPU, "sh", cid]).split("\n")
        fields = out[0].rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / int(out[1])
