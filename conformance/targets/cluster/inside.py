"""Faults made inside the plugin container's own mount namespace, from the node.

With the manifests applied unchanged, the plugin sees the node's real /dev, its real CDI dir and
the kubelet's real socket dir; a fault made there would change the node for everyone (and the
real /dev/kvm must never change). So the fault is made where only the plugin looks: the node
(root, through its node access) enters the container's mount namespace (`nsenter -t <pid> -m`)
and mounts over the plugin's own view, then unmounts to restore. Nothing on the node changes,
the plugin process is never replaced, and the runtime keeps seeing the real device.

With `sh`, `mount`, `umount` and `mknod` in the plugin image the scripts below run there. An
image without them (one static binary, no shell: how many plugins ship) gets the same faults
from python3 on the node or in the diagnostic pod, which enters the container's mount namespace
with setns(2) and makes the mounts with the system calls themselves (hvconform.targets.cluster.
setns_faults): a system call needs nothing in the container's file system. Without either,
`probe` says why for both, and the checks that need it are not_applicable.
"""

from __future__ import annotations

from hvconform.contract.node import CAP_DEVICE_REMAP, CAP_DEVICE_VIEW, CAP_READ_ONLY
from hvconform.targets.cluster.access import (
    RO_STAGING,
    NodeAccess,
    NodeAccessError,
    NodeFiles,
)
from hvconform.targets.cluster.guests import CRICTL_SNIPPET
from hvconform.targets.cluster.plan import ClusterOptions
from hvconform.targets.cluster.setns_faults import SetnsFaults
from hvconform.targets.cluster.workloads import Layout

# $1: container id; the rest is `sh -c SCRIPT sh ARGS...`, run in its mount namespace, and its
# PID namespace too: umount reads /proc/self/mountinfo, and the container's /proc only knows
# the container's processes.
ENTER = (
    CRICTL_SNIPPET + "pid=$($c inspect --output go-template --template '{{.info.pid}}' \"$1\") "
    '|| exit 1; shift; exec nsenter -t "$pid" -m -p -- sh -c "$@"'
)
SCRIPTS = {
    "probe": "command -v mount && command -v umount && command -v mknod",
    # an empty directory over $1 (the socket dir replaced while registered)
    "empty": 'mount -t tmpfs -o size=64k,mode=0755 hvconform-empty "$1"',
    # an empty read-only file system over $1 (CDI storage read-only, spec missing)
    "ro-empty": 'mount -t tmpfs -o ro,size=64k,mode=0755 hvconform-ro "$1"',
    # lazily: a socket the plugin bound there keeps the mount busy until the plugin lets go
    "undo": 'umount -l "$1"',
    # $1 the host-device view, $2 the device's name in it, $3 the device path: /dev/null's
    # node at both, so the identity check matches and only using the device can tell
    "unusable": 'mount -t tmpfs -o size=64k,mode=0755 hvconform-view "$1" '
    '&& mknod -m 0600 "$1/$2" c 1 3 && mount --bind /dev/null "$3"',
    "usable": 'umount -l "$3"; umount -l "$1"',
}


class InsidePlugin:
    """Runs the faults above in one plugin container, found by its container id each time:
    with the container's own tools when it has them, else through setns(2) (SetnsFaults)."""

    def __init__(self, access: NodeAccess) -> None:
        self.access = access
        self.setns: SetnsFaults | None = None  # chosen by probe() when the image has no tools
        # the device a plugin mounts itself, taken away and back: by setns(2) only
        self.device: SetnsFaults | None = None

    def run(self, container: str, name: str, *args: str) -> None:
        if self.setns is not None:
            self.setns.run(container, name, *args)
            return
        argv = ["sh", "-c", ENTER, "sh", container, SCRIPTS[name], "sh", *args]
        result = self.access.run(argv)
        if result.rc != 0:
            raise NodeAccessError(
                f"inside plugin container {container[:12]}: {name} {' '.join(args)} exited "
                f"{result.rc}: {result.stderr.decode(errors='replace').strip()[-300:]}"
            )

    def probe(self, container: str) -> str:
        """'' when faults can be made inside this container, else why not (one line)."""
        setns = SetnsFaults(self.access)
        by_setns = setns.probe(container)
        self.device = None if by_setns else setns
        try:
            self.run(container, "probe")
        except NodeAccessError as exc:
            tools = f"no mount/umount/mknod usable in the plugin container ({exc})"
        else:
            return ""
        if not by_setns:
            self.setns = setns
            return ""
        return f"{tools}; {by_setns}"


class InsideFaults:
    """Mixin of ClusterNode: the Node protocol's faults made inside the plugin container."""

    access: NodeAccess
    files: NodeFiles
    layout: Layout
    options: ClusterOptions
    capabilities: frozenset[str]
    capability_notes: dict[str, str]
    inside: InsidePlugin | None = None
    cdi_inside: InsidePlugin | None = None  # enable_cdi_inside's: this one fault made inside

    def _plugin_container(self) -> str:
        raise NotImplementedError

    def enable_inside(self) -> str:
        """Use in-container faults when the manifests were applied unchanged and the plugin
        image allows them; '' when enabled, else the reason (the checks say not_applicable)."""
        if self.layout.host_view_isolated:
            return "the harness's isolated host-device view is in use"
        inside = InsidePlugin(self.access)
        why = inside.probe(self._plugin_container())
        if why:
            self.layout.notes.append(f"faults inside the plugin container unavailable: {why}")
            return why
        self.inside = inside
        caps = set(self.capabilities)
        if "cdi" in self.layout.mounts:
            caps.add(CAP_READ_ONLY)
        kvm = self.options.hypervisor == "kvm"  # the identity scenario names the entry "kvm"
        if "host_dev" in self.layout.mounts and kvm:
            caps |= {CAP_DEVICE_VIEW, CAP_DEVICE_REMAP}
        elif "device" in self.layout.mounts and kvm and inside.device is not None:
            caps.add(CAP_DEVICE_VIEW)  # the device's own mount, taken away and back (setns)
        self.capabilities = frozenset(caps)
        return ""

    def enable_cdi_inside(self) -> None:
        """Read-only CDI storage made in the plugin's own view as well as the node's, where
        nothing else gives it (the chart's CDI mount does not propagate node mounts and the
        other in-container faults are off with the isolated host-device view): a spec written
        meanwhile fails as on a read-only node."""
        if CAP_READ_ONLY in self.capabilities or "cdi" not in self.layout.mounts:
            return
        inside = InsidePlugin(self.access)
        why = inside.probe(self._plugin_container())
        if why:
            self.capability_notes[CAP_READ_ONLY] = why
            return
        self.cdi_inside = inside
        self.capabilities |= {CAP_READ_ONLY}

    def _in(self, name: str, *args: str, via: InsidePlugin | None = None) -> None:
        inside = via or self.inside
        assert inside is not None
        inside.run(self._plugin_container(), name, *args)

    def inside_read_only(self, read_only: bool, via: InsidePlugin | None = None) -> None:
        """The node's CDI dir (what the runtime and the checks read) and the plugin's view of
        it: both an empty read-only file system, then both back. `via`: this fault alone made
        inside (a DRA node's; hvconform.targets.cluster.dra_node)."""
        if read_only:
            self.files.sh("ro-on", self.files.dirs["cdi"], RO_STAGING)
            self._in("ro-empty", self.layout.mounts["cdi"], via=via)
        else:
            self._in("undo", self.layout.mounts["cdi"], via=via)
            self.files.sh("ro-off", self.files.dirs["cdi"], RO_STAGING)

    def inside_sockets(self, empty: bool) -> None:
        self._in("empty" if empty else "undo", self.layout.mounts["sockets"])

    def inside_device_present(self, present: bool) -> None:
        if "host_dev" in self.layout.mounts:
            self._in("undo" if present else "empty", self.layout.mounts["host_dev"])
            return
        assert self.inside is not None and self.inside.device is not None
        op = "device-present" if present else "device-absent"
        self.inside.device.run(self._plugin_container(), op, self.layout.mounts["device"])

    def inside_unusable(self, unusable: bool) -> None:
        view, name = self.layout.mounts["host_dev"], self.options.hypervisor
        self._in("unusable" if unusable else "usable", view, name, self.options.device)
