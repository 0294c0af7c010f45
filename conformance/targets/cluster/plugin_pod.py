"""The plugin pod of a cluster node: found, probed, restarted, varied, read back.

A mixin of ClusterNode (hvconform.targets.cluster.node): the plugin runs as the profile's
DaemonSet pod. Its readiness comes through the API server's pod proxy (or the pod's Ready
condition, which the kubelet's readiness probe drives, when no HTTP endpoint was found). Its
liveness is what the kubelet does about it, never a readiness signal: the container running,
not restarted since the window began (restartCount, the running state's startedAt, the pod's
uid), and no kubelet event of a failed liveness probe or a kill for one (`liveness_problem`). A
plugin that says not-ready during a fault, as it should, is alive as long as the kubelet keeps it
running. A restart deletes the pod and waits for its replacement, and the faults that need
another plugin view swap the DaemonSet for a variant (or act inside the running plugin's
namespaces when the target can).
"""

from __future__ import annotations

from dataclasses import dataclass

from hvconform.contract.base import NodeBase
from hvconform.contract.dra_profile import API_DEVICE_PLUGIN
from hvconform.contract.node import CAP_READINESS, Allocation
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.ran import PluginRan
from hvconform.contract.results import NotApplicable
from hvconform.contract.runtime_facts import CRICTL_FACTS, RuntimeFacts, from_output
from hvconform.contract.wait import WaitExpired, wait_for
from hvconform.targets.cluster.access import NodeAccess, NodeFiles
from hvconform.targets.cluster.guests import CRICTL_SNIPPET, container_id, running
from hvconform.targets.cluster.inside import InsideFaults
from hvconform.targets.cluster.kube import ApiError, KubeApi, Obj
from hvconform.targets.cluster.plan import ClusterOptions
from hvconform.targets.cluster.ran import pod_ran
from hvconform.targets.cluster.workloads import (
    Layout,
    variant_device_unusable,
    variant_sockets_empty,
)

CPU = (
    CRICTL_SNIPPET + "pid=$($c inspect --output go-template --template '{{.info.pid}}' \"$1\") "
    '&& cat "/proc/$pid/stat" && getconf CLK_TCK'
)


@dataclass(frozen=True)
class LiveWindow:
    """The plugin container as a liveness window began (node setup, a restart the harness made,
    the restore after each check): what a later reading is compared with."""

    pod_uid: str
    restarts: int
    started_at: str
    seen: frozenset[tuple[str, int]]  # liveness events already there: (event uid, count)


def _container_status(pod: Obj, container: str) -> Obj | None:
    for cs in pod.get("status", {}).get("containerStatuses", []) or []:
        if cs.get("name") == container:
            found: Obj = cs
            return found
    return None


# The kubelet's event reasons for a probe that failed and for the kill it orders
# (pkg/kubelet/events: ContainerUnhealthy, KillingContainer): event reasons, not a device's
# health, although the first is the same word as the device plugin API's "Unhealthy".
EVENT_PROBE_FAILED = "Unhealthy"
EVENT_KILLING = "Killing"


def liveness_events(events: list[Obj], container: str) -> list[Obj]:
    """The kubelet's events that say it judged the container dead: a failed (or errored)
    liveness probe (`Unhealthy`, "Liveness probe failed: ...") and the kill that follows
    (`Killing`, "Container X failed liveness probe, will be restarted"). A readiness probe's
    failures and a deletion's kill are not liveness."""
    found = []
    for ev in events:
        where = str(ev.get("involvedObject", {}).get("fieldPath", ""))
        if where and where != f"spec.containers{{{container}}}":
            continue
        reason, message = str(ev.get("reason", "")), str(ev.get("message", ""))
        if (reason == EVENT_PROBE_FAILED and message.startswith("Liveness probe")) or (
            reason == EVENT_KILLING and "liveness probe" in message.lower()
        ):
            found.append(ev)
    return found


def _event_key(ev: Obj) -> tuple[str, int]:
    count = ev.get("count") or (ev.get("series") or {}).get("count") or 1
    return str(ev.get("metadata", {}).get("uid", "")), int(count)


def live_window(pod: Obj | None, container: str, events: list[Obj]) -> LiveWindow | None:
    """The window a liveness reading starts from; None without a running plugin container."""
    cs = None if pod is None else _container_status(pod, container)
    if pod is None or cs is None or "running" not in (cs.get("state") or {}):
        return None
    return LiveWindow(
        pod_uid=str(pod["metadata"].get("uid", "")),
        restarts=int(cs.get("restartCount", 0)),
        started_at=str(cs["state"]["running"].get("startedAt", "")),
        seen=frozenset(_event_key(e) for e in liveness_events(events, container)),
    )


def liveness_problem(
    pod: Obj | None, container: str, window: LiveWindow | None, events: list[Obj]
) -> str:
    """Why the kubelet would call the plugin container dead since `window` began, in words;
    "" while it is alive. Readiness (the Ready and ContainersReady conditions) plays no part."""
    if pod is None:
        return "no plugin pod on the node"
    name = str(pod["metadata"].get("name", ""))
    cs = _container_status(pod, container)
    if cs is None:
        return f"pod {name} has no status for container {container}"
    state: Obj = cs.get("state") or {}
    if "running" not in state:
        what, raw = next(iter(state.items()), ("unknown", None))
        detail: Obj = raw or {}
        why = ", ".join(f"{k} {detail[k]}" for k in ("reason", "exitCode") if k in detail)
        return f"container {container} of pod {name} is {what}" + (f" ({why})" if why else "")
    if window is None:
        return ""
    if str(pod["metadata"].get("uid", "")) != window.pod_uid:
        return f"the plugin pod was replaced (now {name}) by something other than the harness"
    restarts = int(cs.get("restartCount", 0)) - window.restarts
    last: Obj = (cs.get("lastState") or {}).get("terminated") or {}
    ended = ", ".join(f"{k} {last[k]}" for k in ("reason", "exitCode", "finishedAt") if k in last)
    if restarts > 0 or str(state["running"].get("startedAt", "")) != window.started_at:
        return (
            f"container {container} of pod {name} restarted {max(restarts, 1)} time(s) since "
            "the check began" + (f" (last ended: {ended})" if ended else "")
        )
    new = [e for e in liveness_events(events, container) if _event_key(e) not in window.seen]
    if new:
        ev = new[-1]
        return f"the kubelet reported {ev.get('reason')}: {str(ev.get('message', ''))[:200]}"
    return ""


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
    _live_window: LiveWindow | None = None
    baseline_capacity = 0  # the kubelet's capacity for the resource at node setup
    capabilities: frozenset[str]
    resource: str
    plugin: PluginUnderTest | None

    def capacity(self) -> int:
        raise NotImplementedError  # ClusterPods'

    def allocatable(self) -> int:
        raise NotImplementedError  # ClusterPods'

    def plugin_running(self) -> bool:
        raise NotImplementedError  # ClusterPods'

    def allocate(self) -> Allocation:
        raise NotImplementedError  # GuestPods'

    def release(self, allocation: Allocation) -> None:
        raise NotImplementedError  # GuestPods'

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

    def plugin_ready(self) -> bool:
        """The profile's readiness endpoint through the pod proxy, else the pod's Ready
        condition (the kubelet's readiness probe, run where it runs: in the container)."""
        pod = self.plugin_pod()
        if pod is None or not running(pod, self.layout.container):
            return False
        if self.layout.health_port is None:
            conds = pod.get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
        port, name = self.layout.health_port, pod["metadata"]["name"]
        return self.api.pod_proxy(self.layout.namespace, name, port, "/readyz") == 200

    def _pod_events(self, pod: Obj | None) -> list[Obj]:
        """The kubelet's events about the plugin pod; none when the cluster serves none to us
        (the container's own state still says whether it was killed)."""
        if pod is None:
            return []
        uid = pod["metadata"].get("uid", "")
        try:
            found: list[Obj] = self.api.list_objects(
                "v1", "Event", self.layout.namespace, fields=f"involvedObject.uid={uid}"
            )
        except ApiError:
            return []
        return found

    def begin_liveness_window(self) -> None:
        """From now on a restart, a kill or a failed liveness probe is the plugin's death."""
        pod = self.plugin_pod()
        self._live_window = live_window(pod, self.layout.container, self._pod_events(pod))

    def liveness_problem(self) -> str:
        pod = self.plugin_pod()
        events = self._pod_events(pod)
        return liveness_problem(pod, self.layout.container, self._live_window, events)

    def plugin_live(self) -> bool:
        return not self.liveness_problem()

    # -- restore: both sides' word before the next check ------------------------------------

    def _unrestored(self) -> str:
        """What is not back yet, in words: "" once the plugin's container runs, it says it is
        ready (when that is observable) and the kubelet counts the setup's devices again."""
        if not self.plugin_running():
            return "the plugin's container is not running"
        if CAP_READINESS in self.capabilities and not self.plugin_ready():
            return "the plugin does not say it is ready (its pod's readiness)"
        cap, alloc = self.capacity(), self.allocatable()
        if cap != self.baseline_capacity or alloc != cap:
            return (
                f"the kubelet counts {alloc} allocatable of {cap} {self.resource} (at node "
                f"setup: {self.baseline_capacity} of {self.baseline_capacity})"
            )
        return ""

    def _restored_within(self, timeout: float) -> str:
        """Nothing when both sides are back within `timeout` and one real allocation is
        answered; else what was last seen missing."""
        last = {"why": ""}

        def back() -> bool:
            last["why"] = self._unrestored()
            return not last["why"]

        try:
            wait_for(back, timeout, "the node back at its baseline (restore)", self._poll)
        except WaitExpired:
            return f"{last['why']} after {timeout:g}s"
        allocation = self.allocate()
        try:
            if not allocation.ok:
                return (
                    f"the kubelet refused a pod one {self.resource}: {allocation.reason} "
                    f"{allocation.message}".strip()
                )
        finally:
            self.release(allocation)
        return ""

    def verify_plugin_restored(self, timeout: float) -> list[str]:
        """After every check: the kubelet's view back to node setup's and the plugin's own word
        (ready, one allocation answered). A plugin that does not come back is restarted as its
        DaemonSet restarts it (the pod deleted); if that does not bring it back, what is
        missing is returned and every later check on the node is blocked."""
        if self.plugin is not None and self.plugin.api != API_DEVICE_PLUGIN:
            return []  # a DRA driver's node has its own baseline
        first = self._restored_within(timeout)
        if first:
            self.restart_plugin()
            second = self._restored_within(timeout)
            if second:
                return [f"{second}, also after a restart of the plugin pod (before: {first})"]
        self.begin_liveness_window()
        return []

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
        self.begin_liveness_window()  # the harness replaced it: the new one's window begins

    def restart_plugin(self) -> None:
        pod = self._pod()
        self.api.delete("v1", "Pod", pod["metadata"]["name"], self.layout.namespace)
        self._wait_new_plugin(pod["metadata"]["uid"])

    def _swap_daemonset(self, ds: Obj) -> None:
        if self.options.per_node:
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

    def container_runtime(self) -> RuntimeFacts:
        """The node's runtime as its daemon says it runs, through CRI on the node (the suite
        records it per node). Asked once per node: the setup's CDI check and the run's record
        share the answer (each is a command through the node access route)."""
        facts: RuntimeFacts | None = self.__dict__.get("_runtime_facts")
        if facts is None:
            output = self._node(["sh", "-c", CRICTL_SNIPPET + CRICTL_FACTS])
            facts = from_output(output, f"crictl on node {self.access.where}")
            self.__dict__["_runtime_facts"] = facts
        return facts

    def plugin_ran(self) -> PluginRan:
        """What runs as the plugin, read back from its pod: the spec's image, command and args,
        and the image ID the kubelet reports (hvconform.targets.cluster.ran)."""
        return pod_ran(self._pod(), self.layout.container)

    def plugin_cpu_seconds(self) -> float:
        cid = container_id(self._pod(), self.layout.container)
        out = self._node(["sh", "-c", CPU, "sh", cid]).split("\n")
        fields = out[0].rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / int(out[1])
