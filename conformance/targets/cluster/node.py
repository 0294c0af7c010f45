"""The cluster node target: the Node protocol over the Kubernetes API plus node access.

Shared by kind and AKS. Three oracles, as in the kubelet's own e2e tests: node status (capacity,
allocatable), the plugin pod (readiness through the API server's pod proxy, logs), and what the
runtime and the workload saw (crictl's CDI devices, the guest's output). Node-level faults go
through a NodeAccess; kubelet times come from the node's own clock (socket mtime, journal), mapped
onto this process's monotonic clock.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from hv_device_plugin.api.names import SPEC_FILENAME
from hv_device_plugin.api.wire import DEVICE_PLUGIN_DIR, KUBELET_SOCKET
from hvconform.contract.base import NodeBase
from hvconform.contract.node import (
    CAP_DEVICE_REMAP,
    CAP_DEVICE_VIEW,
    CAP_GUEST,
    CAP_KUBELET_CRASH,
    CAP_KUBELET_RESTART,
    CAP_LIVENESS,
    CAP_LONG_GUEST,
    CAP_PLUGIN_RESTART,
    CAP_READ_ONLY,
    CAP_READINESS,
    CAP_ROLLOUT,
    CAP_SOCKET_REDIRECT,
    Area,
    FileInfo,
    NodeEvent,
    ReadStorm,
)
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.results import EnvironmentBlocked
from hvconform.contract.runtime_facts import runtime_side
from hvconform.contract.wait import WaitExpired, wait_for
from hvconform.targets.cluster.access import (
    CDI_DIR,
    RO_STAGING,
    NodeAccess,
    NodeAccessError,
    NodeFiles,
)
from hvconform.targets.cluster.deploy import Deployer
from hvconform.targets.cluster.guests import CRICTL_SNIPPET, GuestPods, container_id
from hvconform.targets.cluster.kube import KubeApi, Obj
from hvconform.targets.cluster.kubelet import KubeletControl
from hvconform.targets.cluster.plan import ClusterOptions
from hvconform.targets.cluster.plugin_pod import PluginPod
from hvconform.targets.cluster.pods import ClusterPods
from hvconform.targets.cluster.reboot import ClusterNodeFaults
from hvconform.targets.cluster.rollout import Rollout
from hvconform.targets.cluster.workloads import (
    RESOURCE,
    Layout,
)

SPEC_NAME = SPEC_FILENAME
# How long the restore after a check waits for the node to be back, before and after a restart
# of the plugin pod (a polling plugin needs its tick; the seed's is 30 s).
RESTORE_TIMEOUT_S = 60.0
# Validate mode looks for the plugin's spec this long (a plugin just started writes it soon).
OBSERVE_TIMEOUT_S = 15.0
SENTINELS = {
    "zz-unrelated-vendor.json": b'{\n  "cdiVersion": "0.5.0",\n  "kind": "example.com/sentinel",\n'
    b'  "devices": [{"name": "s0", "containerEdits": {"env": ["SENTINEL=1"]}}]\n}\n',
    "aa-operator-notes.yaml": b"# owned by the operator, never by the plugin\nkeep: true\n",
}
# What the plugin process may do, from the kernel's own view of it (recorded in the report).
PROCESS_STATUS = (
    CRICTL_SNIPPET + "pid=$($c inspect --output go-template --template '{{.info.pid}}' \"$1\") "
    '&& grep -E "^(Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):" "/proc/$pid/status"'
)


class ClusterNode(
    ClusterPods, GuestPods, ClusterNodeFaults, PluginPod, KubeletControl, Rollout, NodeBase
):
    """One node of a cluster, with the plugin deployed by the harness."""

    resource = RESOURCE  # the plugin's own, from its profile (cluster targets need it declared)
    spec_name = SPEC_NAME  # the plugin's own spec file: declared, or discovered at setup

    def __init__(
        self,
        *,
        name: str,
        api: KubeApi,
        access: NodeAccess,
        options: ClusterOptions,
        node_name: str,
        layout: Layout,
        plugin_ds: Obj,
        deployer: Deployer,
        taint: bool,
        plugin: PluginUnderTest | None = None,
    ) -> None:
        self.name = name
        self.api = api
        self.files = NodeFiles(access)
        self.files.dirs["cdi"] = layout.node_dirs.get("cdi", CDI_DIR)
        sockets = layout.node_dirs.get("sockets", DEVICE_PLUGIN_DIR)
        self.kubelet_root = "/var/lib/kubelet"  # read from the running kubelet at setup
        self.socket_path = f"{sockets}/{KUBELET_SOCKET}"
        self.plugin = plugin
        if plugin is not None and plugin.resource:
            self.resource = plugin.resource
        self.cdi_kind = plugin.cdi_kind if plugin is not None else None
        if plugin is not None:
            self.spec_name = plugin.cdi_spec or ""
        self.access = access
        self.options = options
        self.node_name = node_name
        self.layout = layout
        self.plugin_ds = plugin_ds
        self.deployer = deployer
        self.taint = taint
        self.baseline_spec = b""
        self.sentinels = dict(SENTINELS)
        self.host_metadata_at_start: dict[str, int | str] = {}
        self.session_guest: str | None = None
        self._pods: dict[int, Obj] = {}  # id(Allocation) -> workload pod
        self._serial = 0
        self._since = int(time.time()) - 5
        self.capabilities = self._capabilities()
        self._poll = options.poll_interval
        self._real = (0, 0)
        self._removed: tuple[Area, str] | None = None
        self._events: list[NodeEvent] = []  # requests the kubelet refused or admitted
        self.capability_notes: dict[str, str] = {}  # why a capability is not declared
        if CAP_READ_ONLY not in self.capabilities and "cdi" in self.layout.mounts:
            # enable_inside() may still add it (its in-container fault), not when isolated
            self.capability_notes[CAP_READ_ONLY] = (
                "the plugin's CDI mount does not propagate node mounts (mountPropagation None), "
                "and in-container faults are off with the harness's isolated host-device view"
                if self.layout.host_view_isolated
                else "the plugin's CDI mount does not propagate node mounts (mountPropagation "
                "None) and no fault could be made inside its container"
            )

    def _capabilities(self) -> frozenset[str]:
        caps = {CAP_KUBELET_RESTART, CAP_KUBELET_CRASH, CAP_PLUGIN_RESTART, CAP_ROLLOUT}
        # The plugin's own health, through the API server's pod proxy or the pod conditions its
        # probes drive. Without it a check waits on allocatable alone, a node status the kubelet
        # writes every 10 s on kind: a restart looked done before the new plugin registered.
        if self.layout.health_port is not None or self.layout.readiness_probe:
            caps.add(CAP_READINESS)
        # Liveness is what the kubelet does to the container (restarts, kills, failed liveness
        # probes: PluginPod.liveness_problem), always readable, never the pod's readiness.
        caps.add(CAP_LIVENESS)
        kvm = self.options.hypervisor == "kvm"
        if self.layout.host_view_isolated:
            caps.add(CAP_DEVICE_REMAP)
            if kvm:  # the identity scenario names the view's entry "kvm"
                caps.add(CAP_DEVICE_VIEW)
        if self.layout.sockets_volume:
            caps.add(CAP_SOCKET_REDIRECT)
        if self.layout.cdi_propagates:
            caps.add(CAP_READ_ONLY)
        if kvm:  # the guest workload drives KVM ioctls; MSHV nodes get no guest checks
            caps |= {CAP_GUEST, CAP_LONG_GUEST}
        return frozenset(caps)

    # -- lifecycle ------------------------------------------------------------------------

    def setup(self) -> None:
        if self.options.mode == "validate":
            return self._observe()
        t = self.options.rollout_timeout
        self.kubelet_root = self.kubelet_root_dir()
        wait_for(self.plugin_ready, t, "plugin readiness at node setup", self._poll)
        wait_for(lambda: self.allocatable() > 0, t, "allocatable > 0 at node setup", self._poll)
        self.baseline_capacity = self.capacity()
        self.begin_liveness_window()
        self.spec_name = self.spec_name or wait_for(
            self._discover_spec, t, "the plugin's CDI spec file at setup", self._poll
        )
        self.baseline_spec = wait_for(
            lambda: self.read_file("cdi", self.spec_name),
            t,
            "the plugin's CDI spec at setup",
            self._poll,
        )
        self._runtime_keeps_cdi()
        self.host_metadata_at_start = self.host_device_metadata()
        self.enable_inside()
        self.enable_cdi_inside()
        self.enable_workload_faults()
        for name, data in self.sentinels.items():
            self.write_file("cdi", name, data)
        if CAP_LONG_GUEST in self.capabilities:
            allocation = self.allocate()
            if allocation.ok:
                self.session_guest = self.start_long_guest(allocation)

    def _observe(self) -> None:
        """Validate mode: the node as it serves, read and never written (no sentinel, no fault
        wiring, no session guest). A plugin that is not ready, or has no spec, is what the
        validate checks judge, so nothing here waits for health: it looks once, briefly."""
        self.sentinels = {}
        self.kubelet_root = self.kubelet_root_dir()
        self.baseline_capacity = self.capacity()
        self.begin_liveness_window()
        with contextlib.suppress(WaitExpired):
            self.spec_name = self.spec_name or wait_for(
                self._discover_spec, OBSERVE_TIMEOUT_S, "the plugin's CDI spec", self._poll
            )
        if self.spec_name:
            self.baseline_spec = self.read_file("cdi", self.spec_name) or b""
            self._runtime_keeps_cdi()
        self.host_metadata_at_start = self.host_device_metadata()

    def _runtime_keeps_cdi(self) -> None:
        """A plugin that writes a CDI spec needs a runtime with CDI on that reads the dir the
        spec is in: otherwise the runtime drops (containerd 2.0) or refuses (2.2 and later)
        every device the plugin's allocations name, and that is the runtime's failure, never
        the plugin's (issue 38). A runtime that cannot be asked (no crictl on the node) is
        not judged."""
        try:
            facts = self.container_runtime()
        except Exception:  # reported in the environment (suite/identity) with its error
            return
        seen = f"the plugin writes CDI spec {self.spec_name}, whose devices it would not inject"
        if blamed := runtime_side(facts, self.files.dirs["cdi"], seen):
            raise EnvironmentBlocked(blamed)

    def _discover_spec(self) -> str | None:
        """The one spec file in the node's CDI dir (of the profile's CDI kind, if declared);
        the sentinels are planted only after this."""
        found = []
        for name in self.files.list_files("cdi"):
            data = self.read_file("cdi", name) or b""
            try:
                kind = json.loads(data).get("kind")
            except (ValueError, AttributeError):
                continue
            if kind and (self.cdi_kind is None or kind == self.cdi_kind):
                found.append(name)
        if len(found) > 1:
            raise AssertionError(
                f"several CDI specs in {self.files.dirs['cdi']} ({', '.join(found)}): declare "
                "the plugin's cdi.kind or cdi.spec in its profile"
            )
        return found[0] if found else None

    def restore_baseline(self) -> list[str]:
        """A node a check left down started again, then both sides verified back (or the
        plugin restarted): PluginPod.verify_plugin_restored."""
        if self.options.mode == "validate":
            # nothing was changed, so the node is as it was found: a plugin that was not healthy
            # is judged as it is, never restarted (the serving node's workloads depend on it)
            return super().restore_baseline()
        return super().restore_baseline() or self.verify_plugin_restored(RESTORE_TIMEOUT_S)

    def teardown(self) -> None:
        """Workload pods gone and sentinels removed; the lifecycle's cleanup does the rest."""
        self.stop_sampler()
        self.undo_reboot()
        self.delete_workloads()
        for pod in list(self._pods.values()):
            self._delete_pod(pod)
        self._pods.clear()
        for name in self.sentinels:
            self.files.remove("cdi", name)

    def environment(self) -> dict[str, Any]:
        node = self.api.get("v1", "Node", self.node_name) or {}
        info = node.get("status", {}).get("nodeInfo", {})
        return {
            "target": self.name,
            "contract": self.options.contract,
            "node": self.node_name,
            "hypervisor": self.options.hypervisor,
            "plugin_image": self.options.image,
            "kubelet": info.get("kubeletVersion", ""),
            "kernel": info.get("kernelVersion", ""),
            "os_image": info.get("osImage", ""),
            "container_runtime": info.get("containerRuntimeVersion", ""),
            "plugin_process": self.plugin_process_status(),
        }

    def plugin_process_status(self) -> dict[str, str]:
        """The plugin container's process as the node's kernel sees it (/proc/<pid>/status)."""
        cid = container_id(self._pod(), self.layout.container)
        result = self.access.run(["sh", "-c", PROCESS_STATUS, "sh", cid])
        if result.rc != 0:
            return {"error": result.stderr.decode(errors="replace").strip()[-200:]}
        pairs = (ln.split(":", 1) for ln in result.stdout.decode().splitlines() if ":" in ln)
        return {k.strip(): " ".join(v.split()) for k, v in pairs}

    # -- files ----------------------------------------------------------------------------

    def read_file(self, area: Area, name: str) -> bytes | None:
        return self.files.read_file(area, name)

    def write_file(self, area: Area, name: str, data: bytes) -> None:
        self.files.write_file(area, name, data)

    def stat(self, area: Area, name: str) -> FileInfo | None:
        return self.files.stat(area, name)

    def remove(self, area: Area, name: str) -> None:
        self.files.remove(area, name)
        self._removed = (area, name)

    def make_dir(self, area: Area, name: str) -> None:
        """A directory where a file was just removed goes in with the removal again, in one
        node command: through an exec round trip a plugin that repairs within milliseconds would
        always win the gap between two commands."""
        if self._removed == (area, name):
            self.files.make_dir(area, name, replace=True)
        else:
            self.files.make_dir(area, name)
        self._removed = None

    def remove_dir(self, area: Area, name: str) -> None:
        self.files.remove_dir(area, name)

    def list_files(self, area: Area) -> list[str]:
        return self.files.list_files(area)

    def make_char_device(self, area: Area, name: str, major: int, minor: int) -> None:
        self.files.make_char_device(area, name, major, minor)

    def set_storage_read_only(self, area: Area, read_only: bool) -> None:
        assert area == "cdi", "only the CDI dir can be made read-only on a cluster node"
        if self.inside is not None or self.cdi_inside is not None:
            return self.inside_read_only(read_only, via=self.cdi_inside)
        self.files.sh("ro-on" if read_only else "ro-off", self.files.dirs["cdi"], RO_STAGING)

    def host_device_metadata(self) -> dict[str, int | str]:
        return self.files.device_metadata(self.options.device)

    def _node(self, argv: list[str]) -> str:
        result = self.access.run(argv)
        if result.rc != 0:
            raise NodeAccessError(
                f"node {self.access.where}: {argv[:3]} exited {result.rc}: "
                f"{result.stderr.decode(errors='replace').strip()[-300:]}"
            )
        return result.stdout.decode()

    # -- the kubelet ----------------------------------------------------------------------

    def start_read_storm(self, area: Area, name: str, accepted: list[bytes]) -> ReadStorm:
        raise NotImplementedError("no read storm on cluster targets (capability not declared)")
