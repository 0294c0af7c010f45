"""Whole-node faults of a cluster node, against its real kubelet: a reboot, a plugin started
before its device exists, a ListAndWatch stream the kubelet ends while it runs on.

A reboot is made as the kubelet's own e2e test simulates one (test/e2e_node/
device_plugin_test.go): the kubelet stopped, every pod sandbox removed through CRI (`crictl rmp`),
the kubelet started again; the plugin comes back as its DaemonSet pod through the kubelet. On a
node that also runs the control plane (kind) its static pods' sandboxes are kept (label
tier=control-plane): without the API server nothing could observe the boot.

The kubelet's record (node_events) is read from where it is kept, typed: allocatable from its
pod-resources API (GetAllocatableResources, sampled every 0.1 s: the node status the API server
holds lags by its 10 s update period), requests refused or admitted from the pods' status,
registrations and ended streams from its own log (no typed record of those exists).
"""

from __future__ import annotations

import posixpath
import threading
import time
from typing import TYPE_CHECKING

from hvconform.contract.node import (
    CAP_DEVICE_LATE,
    CAP_DEVICE_REMAP,
    CAP_NODE_REBOOT,
    CAP_POD_DEVICE_HEALTH,
    CAP_PODS,
    CAP_STREAM_END,
    NodeEvent,
)
from hvconform.contract.nodeinit import KUBELET_PID
from hvconform.contract.results import NotApplicable
from hvconform.targets.cluster.access import NodeAccess, NodeAccessError, NodeFiles
from hvconform.targets.cluster.guests import CRICTL_SNIPPET
from hvconform.targets.cluster.kube import KubeApi, Obj
from hvconform.targets.cluster.kubelet import KUBELET_LOG_SINCE, to_monotonic
from hvconform.targets.cluster.plan import ClusterOptions
from hvconform.targets.cluster.podresources import (
    CHECKPOINT,
    PodResourcesClient,
    checkpoint_pods,
)
from hvconform.targets.cluster.workloads import Layout, variant_device_unusable

SAMPLE_EVERY_S = 0.1
RESOURCE_HEALTH_BETA = 36  # ResourceHealthStatus: beta, on by default (v1.37.2 kube_features.go)
# Stopped, then every sandbox but the control plane's removed (crictl rmp -f stops it first).
STOP = (
    CRICTL_SNIPPET + "set -e; systemctl stop kubelet; "
    'keep=" $($c pods -q --label tier=control-plane | tr "\\n" " ") "; '
    'for p in $($c pods -q); do case "$keep" in *" $p "*) ;; *) $c rmp -f "$p" >/dev/null;; '
    "esac; done"
)
START = "date +%s.%N; systemctl start kubelet"
# The kubelet's log lines for the resource ($2) since $1 (unix time): registrations, and the
# ListAndWatch stream ending (v1.37.2 client.go Run: then runClient disconnects the endpoint).
JOURNAL = (
    f"{KUBELET_LOG_SINCE} "
    '| grep -E "Got registration request|ListAndWatch ended unexpectedly" | grep -F "$2" '
    "|| true"  # none yet is no error (a plugin started with its device absent, not registered)
)
# $1: the plugin container's pid on the node, $2 the device-plugin dir. Prints "PID FD" for each
# of the kubelet's connections to a socket there that a process of the plugin's PID namespace
# serves: the peer inode of the plugin's side is the local inode of the kubelet's (ss -xpn).
KUBELET_FDS = r"""ns=$(readlink "/proc/$1/ns/pid"); pids=""
for p in /proc/[0-9]*; do [ "$(readlink "$p/ns/pid" 2>/dev/null)" = "$ns" ] && pids="$pids ${p#/proc/}"; done
ss -xpn | awk -v pids="$pids" -v dir="$2/" '
BEGIN { n = split(pids, a, " "); for (i = 1; i <= n; i++) own["pid=" a[i] ","] = 1 }
{ mine = 0; s = $0
  while (match(s, /pid=[0-9]+,/)) {
    if (substr(s, RSTART, RLENGTH) in own) mine = 1
    s = substr(s, RSTART + RLENGTH) } }
mine && index($5, dir) == 1 { peer[$8] = 1 }
/\("kubelet",pid=/ { line[$6] = $0 }
END { for (i in line) if (i in peer) { s = line[i]
  while (match(s, /pid=[0-9]+,fd=[0-9]+/)) { split(substr(s, RSTART, RLENGTH), f, /[=,]/); print f[2], f[4]
    s = substr(s, RSTART + RLENGTH) } } }'"""
# pidfd_open (434) and pidfd_getfd (438) are the same on every architecture; shutdown is not.
SHUTDOWN = (
    'case "$(uname -m)" in x86_64) sd=48;; aarch64) sd=210;; *) exit 5;; esac; '
    "pid=$1; shift; date +%s.%N; exec perl -e 'my ($sd, $pid, @fds) = @ARGV; "
    'my $p = syscall(434, $pid + 0, 0); die "pidfd_open: $!\\n" if $p < 0; '
    'for my $fd (@fds) { my $l = syscall(438, $p, $fd + 0, 0); die "pidfd_getfd: $!\\n" if $l < 0; '
    'syscall($sd, $l, 2) == 0 or die "shutdown: $!\\n"; }\' "$sd" "$pid" "$@"'
)
STREAM_TOOLS = ("ss", "perl", "readlink")
REBOOT_TOOLS = (*STREAM_TOOLS, "systemctl")  # a kubelet run by systemd (kind, AKS)


def _kubelet_minor(node: Obj) -> int:
    version = str(node.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", ""))
    parts = version.lstrip("v").split(".")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


class AllocatableSampler:
    """GetAllocatableResources every 0.1 s: each change, at the time its read began."""

    def __init__(self, client: PodResourcesClient) -> None:
        self.client = client
        self.changes: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="allocatable-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last: int | None = None
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                now = len(self.client.allocatable())
            except Exception:  # the kubelet is down (restart, reboot): the next read counts
                last = None
            else:
                if now != last:
                    self.changes.append((t, now))
                last = now
            self._stop.wait(SAMPLE_EVERY_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class ClusterNodeFaults:
    """Mixin of ClusterNode: node reboot, device-late start, a kubelet-ended stream, the record."""

    api: KubeApi
    access: NodeAccess
    files: NodeFiles
    options: ClusterOptions
    layout: Layout
    capabilities: frozenset[str]
    resource: str
    socket_path: str
    session_guest: str | None
    host_metadata_at_start: dict[str, int | str]
    plugin_ds: Obj
    _pods: dict[int, Obj]
    _events: list[NodeEvent]
    _node_down: bool = False
    _sampler: AllocatableSampler | None = None
    _real: tuple[int, int]
    node_name: str
    capability_notes: dict[str, str]
    _podres: PodResourcesClient | None
    _podres_local: bool

    if TYPE_CHECKING:  # ClusterPods' and ClusterNode's (a stub here would shadow them)

        def podresources_reason(self) -> str: ...
        def _node(self, argv: list[str]) -> str: ...
        def _pod(self) -> Obj: ...
        def plugin_pod(self) -> Obj | None: ...
        def _wait_new_plugin(self, old_uid: str) -> None: ...
        def set_device_present(self, present: bool) -> None: ...

    def enable_workload_faults(self) -> None:
        """Declare what the real kubelet of this node lets the issue-26 checks do; say why
        not for each capability left out (the checks' not_applicable reasons)."""
        caps, notes = set(self.capabilities), self.capability_notes
        pods = self.podresources_reason()
        if pods:
            notes[CAP_PODS] = pods
        else:
            caps.add(CAP_PODS)
            assert self._podres is not None
            if self._podres_local:  # an exec every 0.1 s through the API server: not here
                self.start_sampler(self._podres)
        minor = _kubelet_minor(self.api.get("v1", "Node", self.node_name) or {})
        if not pods and minor >= RESOURCE_HEALTH_BETA:
            caps.add(CAP_POD_DEVICE_HEALTH)
        elif not pods:
            notes[CAP_POD_DEVICE_HEALTH] = (
                f"the kubelet is v1.{minor}: ResourceHealthStatus (allocatedResourcesStatus) is on "
                f"by default from v1.{RESOURCE_HEALTH_BETA}"
            )
        tools = self.node_tools_reason(STREAM_TOOLS)
        if tools:
            notes[CAP_STREAM_END] = tools
        else:
            caps.add(CAP_STREAM_END)
        reboot = (
            self.reboot_reason() or self.node_tools_reason(REBOOT_TOOLS) or self._systemd() or pods
        )
        if reboot:
            notes[CAP_NODE_REBOOT] = reboot
        else:
            caps.add(CAP_NODE_REBOOT)
        if self.layout.host_view_isolated:
            caps.add(CAP_DEVICE_LATE)
        else:
            notes[CAP_DEVICE_LATE] = (
                "the plugin sees the node's real /dev (manifests applied unchanged): its device "
                "cannot be absent when it starts without changing the node for everyone"
            )
        self.capabilities = frozenset(caps)

    def reboot_reason(self) -> str:
        """'' when this node may be rebooted (its sandboxes all removed), else why not."""
        if self.options.target == "cluster" and not self.options.allow_node_reboot:
            return (
                f"rebooting node {self.node_name} removes every pod sandbox on it, other people's "
                "workloads too, on a cluster this run did not create: opt in with "
                "--allow-node-reboot"
            )
        if getattr(self.access, "local_path", None) is None:
            return (
                f"node access through {self.access.where} rides on the kubelet and on a pod "
                "sandbox, which the reboot stops and removes"
            )
        # InsideFaults' in-container device remap (a host /dev view the plugin reads); a plugin
        # that mounts its device itself gets no remap there, so nothing is lost at the reboot
        layout = getattr(self, "layout", None)
        remap_inside = layout is not None and "host_dev" in layout.mounts
        if getattr(self, "inside", None) is not None and remap_inside:
            return (
                "the plugin's device is made unusable inside its running container here; a "
                "rebooted node's plugin starts in a new one, before that could be done"
            )
        return ""

    def _systemd(self) -> str:
        """'' when the kubelet is a running systemd unit (stopped and started by the reboot)."""
        probe = f"[ ! -r {KUBELET_PID} ] && systemctl is-active --quiet kubelet"
        if self.access.run(["sh", "-c", probe]).rc == 0:
            return ""
        return "the kubelet is not a running systemd unit here (a node init runs it)"

    def node_tools_reason(self, tools: tuple[str, ...]) -> str:
        """'' when the node has the tools a fault runs, else which it lacks."""
        probe = 'for t in "$@"; do command -v "$t" >/dev/null || echo "$t"; done'
        lacking = self.access.run(["sh", "-c", probe, "sh", *tools]).stdout.decode().split()
        return f"the node lacks {', '.join(lacking)}" if lacking else ""

    # -- reboot ---------------------------------------------------------------------------

    def stop_node(self) -> None:
        """The kubelet stopped, then every pod sandbox removed through CRI."""
        self._node_down = True  # first: a half-made reboot is still undone
        self._node(["sh", "-c", STOP])
        if self.session_guest:  # its sandbox went with the rest: no guest kept its state
            ns, name, _ = self.session_guest.split("/")
            self.api.delete("v1", "Pod", name, ns, grace=0)
            for key, pod in list(self._pods.items()):
                if pod["metadata"]["name"] == name:
                    del self._pods[key]
            self.session_guest = None

    def boot_node(self, device_usable: bool) -> float:
        """The device held unusable first when asked (the DaemonSet variant with /dev/null at
        the device path, applied while the kubelet is down: the pod the kubelet starts is the
        variant's), then the kubelet started; the plugin comes back as its DaemonSet pod.
        Returns the kubelet's start on this process's monotonic clock."""
        if not device_usable:
            if CAP_DEVICE_REMAP not in self.capabilities or not self.layout.host_view_isolated:
                raise NotApplicable("the device cannot be held unusable at boot on this node")
            device = self.options.hypervisor
            self.files.replace_char_device("host_dev", device, 1, 3)  # identity made to match
            real = self.host_metadata_at_start
            self._real = (int(real["major"]), int(real["minor"]))
            self.api.replace(variant_device_unusable(self.plugin_ds, self.layout, f"/dev/{device}"))
        started = to_monotonic(float(self._node(["sh", "-c", START]).split()[0]))
        self._node_down = False
        return started

    def undo_reboot(self) -> None:
        """A reboot that never booted (a check failed between the two): the kubelet started."""
        if self._node_down:
            self._node(["sh", "-c", "systemctl start kubelet"])
            self._node_down = False

    def restore_baseline(self) -> list[str]:
        """After a check: a node a failed check left down is started again."""
        self.undo_reboot()
        return []

    def checkpoint_pod_uids(self) -> set[str]:
        path = posixpath.join(posixpath.dirname(self.socket_path), posixpath.basename(CHECKPOINT))
        return checkpoint_pods(self.files.read_path(path), self.resource)

    # -- the kubelet's record -------------------------------------------------------------

    def start_sampler(self, client: PodResourcesClient) -> None:
        self._sampler = AllocatableSampler(client)

    def stop_sampler(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None

    def node_events(self, since: float) -> list[NodeEvent]:
        events = [e for e in self._events if e.t >= since]
        if self._sampler is not None:
            events += [
                NodeEvent(t, "allocatable", n) for t, n in list(self._sampler.changes) if t >= since
            ]
        wall = int(since + (time.time() - time.monotonic())) - 1
        for line in self._node(["sh", "-c", JOURNAL, "sh", str(wall), self.resource]).splitlines():
            t = to_monotonic(float(line.split()[0]))
            if t < since:
                continue
            if "Got registration request" in line:
                events.append(NodeEvent(t, "registered"))
            else:  # the endpoint disconnected: every device of the resource unhealthy
                events.append(NodeEvent(t, "allocatable", 0))
        return sorted(events, key=lambda e: e.t)

    # -- device late ----------------------------------------------------------------------

    def start_plugin_without_device(self) -> float:
        """The device's node out of the plugin's host-device view, then the plugin pod replaced
        (through its DaemonSet); returns when the old plugin was gone: nothing it said comes
        after that."""
        if not self.layout.host_view_isolated:
            raise NotApplicable("the plugin sees the node's real /dev: its device cannot be absent")
        self.set_device_present(False)
        old = self._pod()["metadata"]["uid"]
        self.api.delete("v1", "Pod", self._pod()["metadata"]["name"], self.layout.namespace)
        self._wait_new_plugin(old)
        return time.monotonic()

    # -- stream ended by the kubelet ------------------------------------------------------

    def end_plugin_stream(self) -> float:
        """The kubelet's own connections to the plugin's socket shut down from its side
        (pidfd_getfd on the kubelet's fds, then shutdown): its ListAndWatch stream ends with
        an error, and v1.37.2's runClient disconnects the endpoint. The kubelet runs on."""
        pid = self._node(["sh", "-c", CRICTL_SNIPPET + "$c inspect --output go-template "
                          "--template '{{.info.pid}}' \"$1\"", "sh", self._plugin_cid()]).strip()  # fmt: skip
        plugin_dir = posixpath.dirname(self.socket_path)
        found = self._node(["sh", "-c", KUBELET_FDS, "sh", pid, plugin_dir]).split()
        if not found:
            raise NodeAccessError(
                f"no kubelet connection to a socket of plugin pid {pid} in {plugin_dir}"
            )
        kubelet, fds = found[0], sorted(set(found[1::2]))
        out = self._node(["sh", "-c", SHUTDOWN, "sh", kubelet, *fds])
        return to_monotonic(float(out.split()[0]))

    def _plugin_cid(self) -> str:
        from hvconform.targets.cluster.guests import container_id

        return container_id(self._pod(), self.layout.container)
