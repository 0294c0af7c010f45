"""Faults the local node injects where the plugin under test really looks.

Each fault is recorded in `_faults` before it is made, so a fault that fails half-way is still
undone by the restore between checks (baseline.py). Paths of the plugin's own view (its profile's
directories, its /dev) are reached through its mount namespace (sandbox.ns_path).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from hvconform.contract.node import Area
from hvconform.contract.plugin import PluginUnderTest
from hvconform.targets.host.hostfiles import HostFiles, umount
from hvconform.targets.host.sandbox import PluginSandbox


class LocalFaults(HostFiles):
    """Mixin of LocalNode: the fault half of the Node contract."""

    plugin: PluginUnderTest
    plugin_dir: Path
    root: Path
    _faults: set[str]
    _mounts: list[Path]

    def _sandbox(self) -> PluginSandbox:
        raise NotImplementedError

    def _mount(self, args: list[str], mountpoint: Path) -> None:
        raise NotImplementedError

    def _stop_plugin(self) -> None:
        raise NotImplementedError

    def _start_plugin(self, sockets: Path | None = None) -> None:
        raise NotImplementedError

    # -- storage --------------------------------------------------------------------------

    def set_storage_read_only(self, area: Area, read_only: bool) -> None:
        target = self.dirs[area]
        staging = self.state / f"ro-{area}"
        if read_only:
            # An empty tmpfs made read-only at the superblock, then bound over the area: the
            # spec is missing and cannot be written, in every namespace that sees the area.
            staging.mkdir(exist_ok=True)
            self._faults.add(f"read-only {area}")
            self._mount(["-t", "tmpfs", "-o", "size=1m,mode=0755", "hv-ro", str(staging)], staging)
            subprocess.run(["mount", "-o", "remount,ro", str(staging)], check=True)
            self._mount(["--bind", str(staging), str(target)], target)
        else:
            self._faults.discard(f"read-only {area}")
            # Unmounting reveals the storage as it was (the seed restored exact bytes).
            for mp in (target, staging):
                if mp in self._mounts:  # a half-made fault is undone as far as it got
                    umount(mp)
                    self._mounts.remove(mp)

    def redirect_plugin_sockets(self, empty: bool) -> None:
        target = self.plugin.paths.device_plugin_dir
        if empty:
            hole = self.state / "empty-sockets"
            hole.mkdir(exist_ok=True)
            self._faults.add("sockets")  # first: a half-made fault is still undone
            self._sandbox().bind_mount(hole, target)
        else:
            self._sandbox().umount(target, lazy=True)
            self._faults.discard("sockets")

    def start_plugin_isolated(self) -> None:
        """Replace the plugin by one started into an isolated, empty socket directory."""
        hole = self.state / "isolated-sockets"
        hole.mkdir(exist_ok=True)
        self._faults.add("isolated")
        self._stop_plugin()
        self._start_plugin(sockets=hole)

    def restore_plugin_sockets(self) -> None:
        """Give the isolated plugin the kubelet's directory back, where it looks for it."""
        self._sandbox().bind_mount(self.plugin_dir, self.plugin.paths.device_plugin_dir)
        # "isolated" stays a fault: this sandbox would restart into the empty dir, so the
        # restore after the check replaces it by one started normally.

    def remap_device_unusable(self, unusable: bool) -> None:
        kvm = os.stat("/dev/kvm").st_rdev
        if unusable:
            null = self.state / "null-at-kvm"
            if not null.exists():
                os.mknod(null, stat.S_IFCHR | 0o600, os.makedev(1, 3))
            self._faults.add("remap")
            self._sandbox().bind_mount(null, Path("/dev/kvm"))
            self.replace_char_device("host_dev", "kvm", 1, 3)  # identity made to match
        else:
            self._sandbox().umount(Path("/dev/kvm"))
            self.replace_char_device("host_dev", "kvm", os.major(kvm), os.minor(kvm))
            self._faults.discard("remap")

    def set_device_present(self, present: bool) -> None:
        """Remove the hypervisor node from where the plugin looks, or put it back: its host-dev
        view when it has one, else its own /dev (as a device unplugged from the host: the node
        made again with mknod, the real device's numbers and mode, in the plugin's /dev only)."""
        if self.plugin.paths.host_dev_dir:
            if not present:
                self._faults.add("device")
            super().set_device_present(present)
        else:
            inside = self._sandbox().ns_path("/dev/kvm")
            if present and not self._sandbox().running:
                self._faults.discard("device")  # no namespace left: its next start injects it
                return
            if present:
                real = os.stat("/dev/kvm")
                mode = f"{stat.S_IMODE(real.st_mode):o}"
                major, minor = str(os.major(real.st_rdev)), str(os.minor(real.st_rdev))
                self._in_ns(["mknod", "-m", mode, inside, "c", major, minor])
            else:
                self._faults.add("device")
                if "/dev/kvm" in self._sandbox().plugin_mounts():
                    self._sandbox().umount("/dev/kvm")
                self._in_ns(["rm", "-f", inside])
        if present:
            self._faults.discard("device")

    def _in_ns(self, argv: list[str]) -> None:
        done = self._sandbox().in_plugin_ns(argv)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} in the plugin's namespace: {done.stderr.strip()}")
