"""The node interface scenarios are written against; targets implement it.

Scenarios know nothing of targets, and targets know nothing of scenarios: this Protocol is the
whole contract. A target declares what it can do in `capabilities`; a scenario that needs a
capability the target lacks ends as not_applicable, never as a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from hvconform.contract.ran import PluginRan
from hvconform.contract.results import NotApplicable

Area = Literal["cdi", "host_dev"]

# Capabilities a target may declare.
CAP_KUBELET_RESTART = "kubelet-restart"
CAP_KUBELET_CRASH = "kubelet-crash"
CAP_PLUGIN_RESTART = "plugin-restart"
CAP_READ_ONLY = "read-only-storage"
CAP_DEVICE_VIEW = "device-view"
CAP_DEVICE_REMAP = "device-remap"
CAP_SOCKET_REDIRECT = "socket-redirect"
CAP_GUEST = "guest"
CAP_LONG_GUEST = "long-guest"
CAP_READ_STORM = "read-storm"
# The plugin is deployed by something that can roll it (a DaemonSet): an operator's upgrade.
CAP_ROLLOUT = "rollout"
# Optional RPCs the plugin declares in GetDevicePluginOptions (csi-sanity asks a driver for its
# capabilities the same way): the checks of an optional RPC apply only when it is declared.
CAP_PREFERRED_ALLOCATION = "preferred-allocation"
# The target reads the plugin's GetDevicePluginOptions answer and sees its GetPreferredAllocation
# answers (the local target's kubelet emulator does; a real kubelet keeps both to itself).
CAP_PLUGIN_OPTIONS = "plugin-options"
CAP_PRE_START = "pre-start-container"
# The plugin's own health can be observed (its profile names a probe); without it a plugin is
# judged on what the kubelet sees: health in ListAndWatch, allocatable, Allocate answers.
CAP_READINESS = "readiness"
CAP_LIVENESS = "liveness"
# Workloads as pods: admitted by the kubelet, re-admitted after its restarts, reported by its
# pod-resources API (List, GetAllocatableResources), replaced by their controller when they fail.
CAP_PODS = "pods"
# The whole node rebooted: kubelet stopped, every pod sandbox removed, the kubelet and the plugin
# started again as the target starts them; the kubelet's checkpoint and event record readable.
CAP_NODE_REBOOT = "node-reboot"
# The plugin (re)started while its hypervisor device is absent from where it looks.
CAP_DEVICE_LATE = "device-late"
# The kubelet ends the plugin's ListAndWatch stream while it runs on (and disconnects it).
CAP_STREAM_END = "stream-end"
# The kubelet reports each held device's health in pod status (allocatedResourcesStatus, KEP-4680).
CAP_POD_DEVICE_HEALTH = "pod-device-health"


@dataclass(frozen=True)
class FileInfo:
    kind: str  # "file", "dir", "symlink", "char", "block", "fifo", "socket"
    mode: int
    uid: int
    gid: int
    rdev_major: int = 0
    rdev_minor: int = 0


@dataclass(frozen=True)
class DeviceSpec:
    """One DeviceSpec of an Allocate answer: the runtime makes host_path's node at container_path."""

    container_path: str
    host_path: str
    permissions: str = ""  # cgroup access: any of "r", "w", "m"


@dataclass
class Allocation:
    ok: bool
    device_ids: list[str] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)
    device_specs: list[DeviceSpec] = field(default_factory=list)
    envs: dict[str, str] = field(default_factory=dict)
    phase: str = ""  # "Failed" when admission failed
    reason: str = ""  # e.g. UnexpectedAdmissionError
    message: str = ""
    preferred: list[str] | None = None  # the plugin's GetPreferredAllocation answer, if asked


@dataclass
class GuestOutcome:
    ok: bool
    detail: str
    value: int | None = None


@dataclass
class ReadStats:
    reads: int
    errors: int
    unexpected: int  # reads that were neither of the accepted contents (torn or foreign)
    first_seen: dict[int, float]  # accepted content index -> first monotonic time it was read
    detail: str = ""


@dataclass(frozen=True)
class PodView:
    """One workload pod holding the device, as the API and the kubelet report it."""

    uid: str
    name: str
    owner: str  # the controller that runs it again when it fails ("": a bare pod)
    phase: str  # Pending, Running, Failed
    reason: str  # e.g. UnexpectedAdmissionError
    message: str
    container_id: str
    restart_count: int


@dataclass(frozen=True)
class PodResources:
    """The kubelet's pod-resources API for the plugin's resource."""

    devices: dict[str, tuple[str, ...]]  # List: active pod uid -> device IDs of its container
    allocatable: tuple[str, ...]  # GetAllocatableResources: the healthy device IDs


@dataclass(frozen=True)
class NodeEvent:
    """What the kubelet did, in order: "registered", "allocatable" (value: healthy devices
    after a change), "admitted" and "refused" (detail: the reason and message)."""

    t: float  # monotonic
    kind: str
    value: int = 0
    detail: str = ""


class ReadStorm(Protocol):
    def stop(self) -> ReadStats: ...


class Node(Protocol):
    """What a scenario may do to, and observe on, one node running the plugin under test."""

    name: str
    resource: str
    capabilities: frozenset[str]
    spec_name: str  # the CDI spec file the plugin owns
    baseline_spec: bytes  # its content when the plugin was first healthy
    sentinels: dict[str, bytes]  # unrelated CDI files planted at setup, name -> content
    host_metadata_at_start: dict[str, int | str]
    session_guest: str | None  # a long-running guest started at setup, kept through all faults

    # files in the node's CDI dir and host-device view
    def read_file(self, area: Area, name: str) -> bytes | None: ...
    def write_file(self, area: Area, name: str, data: bytes) -> None: ...
    def stat(self, area: Area, name: str) -> FileInfo | None: ...
    def remove(self, area: Area, name: str) -> None: ...
    def make_dir(self, area: Area, name: str) -> None: ...
    def remove_dir(self, area: Area, name: str) -> None: ...
    def list_files(self, area: Area) -> list[str]: ...
    def make_char_device(self, area: Area, name: str, major: int, minor: int) -> None: ...
    def set_storage_read_only(self, area: Area, read_only: bool) -> None: ...

    # the plugin under test
    def plugin_live(self) -> bool: ...
    def plugin_ready(self) -> bool: ...
    def plugin_instance(self) -> str: ...  # changes only when the plugin process is replaced
    def restart_plugin(self) -> None: ...
    def redirect_plugin_sockets(self, empty: bool) -> None: ...
    def remap_device_unusable(self, unusable: bool) -> None: ...
    def plugin_log_tail(self, lines: int = 50) -> str: ...
    def plugin_cpu_seconds(self) -> float: ...
    # What really runs as the plugin, read back from the running process or pod (never from
    # the profile): results.json records it and a read-back that contradicts the profile fails.
    def plugin_ran(self) -> PluginRan: ...

    # the kubelet
    def restart_kubelet(self, graceful: bool) -> float: ...  # monotonic time it was back
    def last_registration_at(self) -> float | None: ...
    def capacity(self) -> int: ...
    def allocatable(self) -> int: ...

    # workloads
    def allocate(self) -> Allocation: ...
    def release(self, allocation: Allocation) -> None: ...
    def run_guest(self, allocation: Allocation) -> GuestOutcome: ...
    def start_long_guest(self, allocation: Allocation) -> str: ...
    def long_guest_counter(self, handle: str) -> int: ...
    def start_read_storm(self, area: Area, name: str, accepted: list[bytes]) -> ReadStorm: ...
    def host_device_metadata(self) -> dict[str, int | str]: ...

    # faults and isolation built on the above (hvconform.contract.base has the defaults)
    def set_device_present(self, present: bool) -> None: ...
    def start_plugin_isolated(self) -> None: ...
    def restore_plugin_sockets(self) -> None: ...
    def restore_baseline(self) -> list[str]: ...

    # a rolling update of whatever deploys the plugin (CAP_ROLLOUT)
    def start_rollout(self) -> None: ...
    def rollout_done(self) -> bool: ...

    # pods holding one device each, running a counting guest (CAP_PODS)
    def start_pod(self, owner: str = "") -> PodView: ...  # admitted (or refused) on return
    def pods(self) -> list[PodView]: ...  # every pod the API knows on this node
    def pod_counter(self, uid: str) -> int: ...  # the guest counter of its running container
    def delete_pod(self, uid: str) -> None: ...  # deleted and not replaced
    def pod_resources(self) -> PodResources: ...
    def pod_device_health(self, uid: str) -> dict[str, bool]: ...  # device ID -> Healthy

    # whole-node faults
    def plugin_running(self) -> bool: ...  # the plugin process (or container) is up
    def stop_node(self) -> None: ...  # CAP_NODE_REBOOT: kubelet, plugin, sandboxes all gone
    def boot_node(self, device_usable: bool) -> float: ...  # monotonic kubelet start
    def checkpoint_pod_uids(self) -> set[str]: ...  # pods assigned devices in the checkpoint
    def node_events(self, since: float) -> list[NodeEvent]: ...
    def start_plugin_without_device(self) -> float: ...  # CAP_DEVICE_LATE: its start
    def end_plugin_stream(self) -> float: ...  # CAP_STREAM_END: monotonic time it ended


def require(node: Node, *caps: str) -> None:
    """Raise NotApplicable when the target cannot do what the scenario needs."""
    missing = [c for c in caps if c not in node.capabilities]
    if missing:
        # A target may say why it lacks one (e.g. an opt-in flag not given): optional, by name.
        why: dict[str, str] = getattr(node, "capability_notes", None) or {}
        reasons = "; ".join(f"{c}: {why[c]}" for c in missing if why.get(c))
        raise NotApplicable(
            f"target '{node.name}' lacks {', '.join(missing)}"
            + (f" ({reasons})" if reasons else "")
        )
