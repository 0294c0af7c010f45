"""Whole-node faults of the local node: a reboot, a plugin started before its device exists, a
ListAndWatch stream the kubelet ends while it runs on.

A reboot here is what one does to a node's state, emulated: the kubelet crashes (kubelet.sock
left behind), the plugin is SIGKILLed (its socket left behind), every sandbox is gone with its
guest. Volatile state goes too: the CDI dir is a tmpfs (/var/run/cdi), so the plugin's spec is
lost; the host's /dev is rebuilt at boot, so the device node is missing until then. The kubelet's
own state (its checkpoint) stays, as does the API's record of the pods. At boot the device node
may come back before the hypervisor is usable (a module still loading): a node that is no
hypervisor is then where the plugin looks, exactly as `remap_device_unusable(True)` makes it, and
undone the same way.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

from hvconform.contract.node import Area
from hvconform.contract.plugin import PluginUnderTest
from hvconform.kubelet import ThreadedKubeletEmulator
from hvconform.targets.host.sandbox import PluginSandbox
from hvconform.targets.local.pods import kill_guests, null_node, real_kvm_numbers

DEVICE = "/dev/kvm"


class LocalNodeFaults:
    """Mixin of LocalNode: node reboot, device-late start and a kubelet-ended stream."""

    plugin: PluginUnderTest
    resource: str
    spec_name: str
    state: Path
    session_guest: str | None
    _faults: set[str]
    _guests: dict[str, subprocess.Popen[bytes]]

    def _kubelet(self) -> ThreadedKubeletEmulator:
        raise NotImplementedError

    def _sandbox(self) -> PluginSandbox:
        raise NotImplementedError

    def remove(self, area: Area, name: str) -> None:
        raise NotImplementedError

    def make_char_device(self, area: Area, name: str, major: int, minor: int) -> None:
        raise NotImplementedError

    def set_device_present(self, present: bool) -> None:
        raise NotImplementedError

    # -- reboot ---------------------------------------------------------------------------

    def stop_node(self) -> None:
        """Power cut: kubelet, plugin and every sandbox gone; the volatile state with them."""
        self._faults.add("reboot")  # first: a half-made reboot is still undone
        self._kubelet().crash()
        self._sandbox().kill()
        kill_guests(self._guests)
        self.session_guest = None  # its sandbox went with the rest: no guest kept its state
        if self.spec_name:
            self.remove("cdi", self.spec_name)
        self.remove("host_dev", "kvm")

    def boot_node(self, device_usable: bool) -> float:
        """The device node back (usable or not yet), the kubelet started, then the plugin, as
        its DaemonSet pod comes back after the kubelet; the kubelet's start time."""
        sandbox = self._sandbox()
        if device_usable:
            self.make_char_device("host_dev", "kvm", *real_kvm_numbers())
        else:
            self._faults.add("remap")  # undone by remap_device_unusable(False)
            self.make_char_device("host_dev", "kvm", 1, 3)  # the identity made to match
            sandbox.dev_covers = [(str(null_node(self.state)), DEVICE)]
        kubelet = self._kubelet()
        kubelet.start()
        started = kubelet.emulator.started_at
        assert started is not None, "the emulator started but recorded no start time"
        try:
            sandbox.start()
        finally:
            sandbox.dev_covers = []  # a later restart finds the device as the node has it
        self._faults.discard("reboot")
        return started

    def undo_reboot(self) -> None:
        """A reboot that never booted (a check failed between the two): the device node back;
        the restore then starts the kubelet and the plugin."""
        with contextlib.suppress(FileExistsError):
            self.make_char_device("host_dev", "kvm", *real_kvm_numbers())
        self._faults.discard("reboot")

    # -- device late ----------------------------------------------------------------------

    def start_plugin_without_device(self) -> float:
        """Restart the plugin while its device is absent from where it looks: its host-dev
        view's entry, else its own /dev (the sandbox started without the node: the one
        `set_device_present(True)` makes later is the first it ever sees). Returns the
        monotonic time the new plugin process started (the old one was gone by then)."""
        sandbox = self._sandbox()
        sandbox.stop()
        started = time.monotonic()  # nothing the old plugin said comes after this
        if self.plugin.paths.host_dev_dir:
            self.set_device_present(False)
            sandbox.start()
            return started
        self._faults.add("device")  # set_device_present(True) makes the node in its /dev
        original = sandbox.dev_nodes
        sandbox.dev_nodes = tuple(d for d in original if d != DEVICE)
        try:
            sandbox.start()
        finally:
            sandbox.dev_nodes = original
        return started

    # -- stream ended by the kubelet ------------------------------------------------------

    def end_plugin_stream(self) -> float:
        return self._kubelet().end_stream(self.resource)
