"""Whole-node faults of the real node: a reboot, a plugin started before its device exists, a
ListAndWatch stream the kubelet ends while it runs on.

A reboot is made as the kubelet's own e2e test simulates one (test/e2e_node/
device_plugin_test.go): the kubelet stopped (SIGTERM, as systemd stops it), the plugin gone with
the node (SIGKILL: no goodbye), every pod sandbox removed through CRI (`crictl rmp -af` on the
stack's containerd); the volatile state with them: the CDI dir is a tmpfs, and /dev is rebuilt
at boot, so the plugin's spec and the host-device view's node are gone. The kubelet's own state
stays (its device-manager checkpoint), as does the API's record of the pods. At boot the kubelet
starts first, and the plugin as this target starts it, once the kubelet's registration socket
is there (as its DaemonSet pod comes back through the kubelet); the device may come back before
it is usable (a module still loading): /dev/null's node is then where the plugin looks, as
`remap_device_unusable(True)` makes it, and undone the same way. Measured here: the first pod
the kubelet refuses after its start reaches the API about 9.4 s later (later ones within 0.1 s;
the status manager's 10 s periodic sync publishes it), so node-reboot's requests during the
unusable window are few on this target, and it needs a --recovery-timeout above 10 s.

The kubelet ends a plugin's stream by itself only on a broken connection (v1.37.2 client.go
`Run`: any Recv error returns; handler.go `runClient` then disconnects the endpoint, manager.go
`PluginDisconnected` marks every device unhealthy). So the connection is broken from the
kubelet's side: its socket to the plugin's endpoint (found by its peer's name, as `ss -x`
reports it) is duplicated out of the kubelet with pidfd_getfd(2) and shut down; the kubelet's read ends,
nothing is restarted, and the node's allocatable shows whether the kubelet disconnected it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import subprocess
import time
from pathlib import Path, PurePosixPath

from hv_device_plugin.api.wire import KUBELET_SOCKET
from hvconform.contract.node import Area, NodeEvent
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.wait import WaitExpired, wait_for
from hvconform.targets.host.sandbox import PluginSandbox
from hvconform.targets.local.pods import null_node, real_kvm_numbers
from hvconform.targets.realnode import PLUGIN_DIR, procs, stack
from hvconform.targets.realnode.events import NodeEventLog
from hvconform.targets.realnode.kubeapi import Api

DEVICE = "/dev/kvm"
CHECKPOINT = PLUGIN_DIR / "kubelet_internal_checkpoint"  # v1.37.2 types.go
SYS_PIDFD_GETFD = 438  # x86_64 and every other architecture since 5.6 (asm-generic)
DISCONNECT_TIMEOUT_S = 5.0


def kubelet_sock_made(since_wall: float, proc: procs.Proc | None = None) -> float:
    """The monotonic time a kubelet.sock made after `since_wall` appeared: the kubelet's device
    manager listening (a plugin may register before the kubelet's healthz answers)."""
    sock = PLUGIN_DIR / KUBELET_SOCKET

    def made() -> float | None:
        if proc is not None and not proc.alive:
            raise RuntimeError(f"the kubelet exited at start:\n{procs.log_tail('kubelet')}")
        with contextlib.suppress(FileNotFoundError):
            if (mtime := sock.stat().st_mtime) >= since_wall:
                return mtime
        return None

    made_wall = wait_for(made, 30, "the new kubelet.sock")
    return made_wall - (time.time() - time.monotonic())


def _unix_streams() -> dict[int, tuple[str, int]]:
    """Unix stream sockets of this network namespace: inode -> (name, peer inode), by
    sock_diag through `ss`. A server's accepted socket lives in its client's namespace (the
    kernel makes it in the connecting socket's, af_unix.c `unix_stream_connect`) and carries
    the listener's name: the kubelet's side of a connection to the plugin is seen here, with
    the plugin's endpoint as its peer's name, though the plugin has a namespace of its own."""
    out = subprocess.run(["ss", "-x", "-a", "-n", "-H"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    table: dict[int, tuple[str, int]] = {}
    for line in out.splitlines():
        tokens = line.split()
        if len(tokens) == 8 and tokens[0] == "u_str":
            with contextlib.suppress(ValueError):
                table[int(tokens[5])] = (tokens[4], int(tokens[7]))
    return table


def kubelet_plugin_fds(kubelet_pid: int, plugin_dir: str, endpoint: str = "") -> list[int]:
    """The kubelet's fds connected to a plugin endpoint in `plugin_dir` (as the plugin names
    it; only `endpoint` when given), other than the kubelet's own registration socket."""
    table = _unix_streams()
    fds = []
    for inode, fd in _socket_fds(kubelet_pid).items():
        peer = table.get(table.get(inode, ("", 0))[1])
        if peer is not None:
            name = PurePosixPath(peer[0])
            ours = name.name == endpoint if endpoint else name.name != KUBELET_SOCKET
            if str(name.parent) == plugin_dir and ours:
                fds.append(fd)
    return fds


def _socket_fds(pid: int) -> dict[int, int]:
    """The process's socket fds: inode -> fd."""
    fds: dict[int, int] = {}
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            link = str(entry.readlink())
            if link.startswith("socket:["):
                fds[int(link[8:-1])] = int(entry.name)
    return fds


def shut_down_in(pid: int, fd: int) -> None:
    """shutdown(SHUT_RDWR) on another process's socket: pidfd_getfd(2) hands us the same open
    socket (root: PTRACE_MODE_ATTACH), and shutting it down ends the connection for both."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        dup = int(libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0))
        if dup < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"pidfd_getfd({pid}, {fd}): {os.strerror(err)}")
    finally:
        os.close(pidfd)
    with socket.socket(fileno=dup) as sock:
        sock.shutdown(socket.SHUT_RDWR)


class RealNodeFaults:
    """Mixin of RealNode: node reboot, device-late start and a kubelet-ended stream."""

    api: Api | None
    plugin: PluginUnderTest
    resource: str
    spec_name: str
    state: Path
    dirs: dict[str, Path]
    session_guest: str | None
    sandbox: PluginSandbox | None
    events_log: NodeEventLog | None
    _faults: set[str]

    def _sandbox(self) -> PluginSandbox:
        raise NotImplementedError

    def touched(self) -> None:
        raise NotImplementedError

    def set_device_present(self, present: bool) -> None:
        raise NotImplementedError

    def replace_char_device(self, area: Area, name: str, major: int, minor: int) -> None:
        raise NotImplementedError

    # -- reboot ---------------------------------------------------------------------------

    def stop_node(self) -> None:
        self._faults.add("reboot")  # first: a half-made reboot is still undone
        self.touched()
        kubelet = procs.recorded("kubelet")
        if kubelet is not None:
            kubelet.stop()
        if self.sandbox is not None and self.sandbox.running:
            self.sandbox.kill()
        stack._crictl("rmp", "-af")  # every sandbox, the session guest's too
        self.session_guest = None
        if self.spec_name:
            (self.dirs["cdi"] / self.spec_name).unlink(missing_ok=True)
        (self.dirs["host_dev"] / "kvm").unlink(missing_ok=True)
        self.touched()

    def boot_node(self, device_usable: bool) -> float:
        """The device node back (usable or not yet), the kubelet started, then the plugin once
        the kubelet's socket is there; the monotonic time that socket was made."""
        sandbox = self._sandbox()
        if device_usable:
            self.replace_char_device("host_dev", "kvm", *real_kvm_numbers())
        else:
            self._faults.add("remap")  # undone by remap_device_unusable(False)
            self.replace_char_device("host_dev", "kvm", 1, 3)  # the identity made to match
            sandbox.dev_covers = [(str(null_node(self.state)), DEVICE)]
        wall = time.time()
        kubelet = stack.spawn_kubelet(self.api)
        booted = kubelet_sock_made(wall, kubelet)
        try:
            procs.record("plugin", sandbox.start())
        finally:
            sandbox.dev_covers = []  # a later restart finds the device as the node has it
        self._faults.discard("reboot")
        self.touched()
        return booted

    def undo_reboot(self) -> None:
        """A reboot that never booted (a check failed between the two): the device node back;
        the restore then starts the kubelet and the plugin."""
        self.replace_char_device("host_dev", "kvm", *real_kvm_numbers())
        self._faults.discard("reboot")

    def checkpoint_pod_uids(self) -> set[str]:
        """Pods with devices in the kubelet's device-manager checkpoint (checkpoint.go
        `PodDevicesEntry`)."""
        try:
            doc = json.loads(CHECKPOINT.read_text())
        except FileNotFoundError:
            return set()
        return {str(e["PodUID"]) for e in doc["Data"].get("PodDeviceEntries") or []}

    def node_events(self, since: float) -> list[NodeEvent]:
        assert self.events_log is not None
        return self.events_log.events(since)

    # -- device late ----------------------------------------------------------------------

    def start_plugin_without_device(self) -> float:
        """Restart the plugin while its device is absent from where it looks: its host-dev
        view's entry, else its own /dev (its sandbox started without the node: the one
        `set_device_present(True)` makes later is the first it ever sees)."""
        sandbox = self._sandbox()
        sandbox.stop()
        self.touched()
        started = time.monotonic()  # nothing the old plugin said comes after this
        if self.plugin.paths.host_dev_dir:
            self.set_device_present(False)
            procs.record("plugin", sandbox.start())
            return started
        self._faults.add("device")  # set_device_present(True) makes the node in its /dev
        original = sandbox.dev_nodes
        sandbox.dev_nodes = tuple(d for d in original if d != DEVICE)
        try:
            procs.record("plugin", sandbox.start())
        finally:
            sandbox.dev_nodes = original
        return started

    # -- stream ended by the kubelet ------------------------------------------------------

    def end_plugin_stream(self) -> float:
        """Break the kubelet's connection to the plugin's endpoint from the kubelet's side;
        the monotonic time it was broken, once the kubelet's allocatable showed 0 (or 5 s)."""
        kubelet = procs.recorded("kubelet")
        assert kubelet is not None and kubelet.alive, "the kubelet is not running"
        assert self.events_log is not None
        fds = kubelet_plugin_fds(kubelet.pid, self.plugin.paths.device_plugin_dir)
        assert fds, "the kubelet holds no connection to the plugin's endpoint"
        self.events_log.burst(DISCONNECT_TIMEOUT_S)
        ended = time.monotonic()
        for fd in fds:
            shut_down_in(kubelet.pid, fd)
        self.touched()
        with contextlib.suppress(WaitExpired):  # the check says the fault was not made
            wait_for(lambda: self.events_log is not None and self.events_log.allocatable_seen(
                0, ended), DISCONNECT_TIMEOUT_S, "the kubelet disconnecting the plugin")  # fmt: skip
        return ended
