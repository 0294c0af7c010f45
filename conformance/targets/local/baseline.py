"""Isolation between checks on the local node, and discovery of the plugin's CDI spec file.

After every check, pass or fail, the node is put back to its baseline and that is verified
before the next check: no fault of the harness left in place (read-only storage, redirected or
isolated sockets, a remapped or hidden device), nothing but the plugin's own spec at the spec
path, the kubelet up, the plugin running and registered with every device allocatable, and the
spec byte-identical to its baseline with its baseline mode. A plugin that lost its spec is given
one restart (plugins write it at start). What cannot be restored is returned, named, so the
remaining checks on this node end `blocked`, never failed on account of an earlier check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.base import discover_spec
from conformance.contract.node import CAP_GUEST, CAP_LONG_GUEST, Allocation
from conformance.contract.wait import WaitExpired, wait_for

RESTORE_TIMEOUT_S = 30.0
FIRST_TRY_S = 5.0


class BaselineRestore:
    """Mixin for the local node (it provides the attributes and primitives used here)."""

    _faults: set[str]
    spec_name: str
    baseline_spec: bytes
    baseline_mode: int = 0
    # how often the restore asks for allocatable and readiness (the real node's answers cost more)
    _allocatable_poll_s = 0.01
    _ready_poll_s = 0.005

    def _take_baseline(self, allocation: Allocation, spec_timeout: float) -> None:
        """At node setup, with the first admitted allocation: the plugin's CDI spec (the
        profile's, else the one declaring the allocated kind) and its mode are the baseline; the
        session guest holds that allocation, or (nothing injected) the guest checks do not apply."""
        node: Any = self
        self.spec_name = self.spec_name or discover_spec(node, allocation.cdi_devices)
        if self.spec_name:
            self.baseline_spec = wait_for(
                lambda: node.read_file("cdi", self.spec_name),
                spec_timeout,
                "the plugin's CDI spec at node setup",
            )
            info = node.stat("cdi", self.spec_name)
            self.baseline_mode = info.mode if info is not None else 0
        if allocation.cdi_devices or allocation.device_specs:  # the runtime injects either
            node.session_guest = node.start_long_guest(allocation)
        else:
            node.release(allocation)
            node.capabilities -= {CAP_GUEST, CAP_LONG_GUEST}

    def restore_baseline(self) -> list[str]:
        node: Any = self
        problems: list[str] = []
        for fault in sorted(self._faults):
            try:
                _undo(node, fault)
            except Exception as exc:
                problems.append(f"could not undo {fault}: {exc}")
        if problems:
            return problems
        if self.spec_name:
            problem = _clear_spec_path(node)
            if problem:
                return [problem]
        self._restore_kubelet()
        if not node.plugin_running():
            node.restart_plugin()
        try:
            # Short first: a plugin that lost its spec (and will not repair it) gets its
            # restart without the whole timeout spent on every dirty check.
            _wait_baseline(node, FIRST_TRY_S)
        except WaitExpired as first:
            node.restart_plugin()  # a plugin that lost its spec writes it again at start
            try:
                _wait_baseline(node)
            except WaitExpired as second:
                return [f"{second} (also before a plugin restart: {first})"]
        return []

    def _restore_kubelet(self) -> None:
        """The kubelet up again, with no pod of a check left (a hook: the real node's kubelet
        is a process)."""
        node: Any = self
        if not node.kubelet.emulator.running:
            node.kubelet.start()
        if node.kubelet.emulator.pods is not None:
            node.delete_check_pods()  # the devices they hold are free for the next check

    def _spec_path_cleared(self) -> None:
        """A hook: what the harness left at the spec path was removed."""


def _undo(node: Any, fault: str) -> None:
    if fault.startswith("read-only "):
        node.set_storage_read_only(fault.removeprefix("read-only "), False)
    elif fault == "sockets":
        node.redirect_plugin_sockets(False)
    elif fault == "isolated":
        node._stop_plugin()
        node._start_plugin()  # a fresh sandbox, with the kubelet's own directory bound
        node._faults.discard("isolated")
    elif fault == "remap":
        node.remap_device_unusable(False)
    elif fault == "device":
        node.set_device_present(True)
    elif fault == "reboot":
        node.undo_reboot()


def _clear_spec_path(node: Any) -> str:
    """Remove whatever the harness left at the spec path that is not a regular file."""
    info = node.stat("cdi", node.spec_name)
    if info is None or info.kind == "file":
        return ""
    path = Path(node.dirs["cdi"]) / node.spec_name
    try:
        if info.kind == "dir":
            path.rmdir()  # never rm -r: whatever is inside is the plugin's doing, and evidence
        else:
            path.unlink()
    except OSError as exc:
        listing = ", ".join(sorted(p.name for p in path.iterdir())) if path.is_dir() else ""
        return (
            f"the {info.kind} at the spec path {node.spec_name} cannot be removed "
            f"({exc.strerror}{': holds ' + listing if listing else ''})"
        )
    node._spec_path_cleared()
    return ""


def _wait_baseline(node: Any, timeout: float = RESTORE_TIMEOUT_S) -> None:
    def spec_back() -> bool:
        if not node.spec_name:
            return True
        info = node.stat("cdi", node.spec_name)
        return bool(
            node.read_file("cdi", node.spec_name) == node.baseline_spec
            and info is not None
            and info.mode == node.baseline_mode
        )

    wait_for(node.plugin_running, 5, "plugin running (restore)")
    wait_for(
        lambda: node.capacity() > 0 and node.allocatable() == node.capacity(),
        timeout,
        "every device allocatable again (restore)",
        interval=node._allocatable_poll_s,
    )
    wait_for(spec_back, timeout, "CDI spec bytes and mode as at baseline (restore)")
    if "readiness" in node.capabilities:
        wait_for(
            node.plugin_ready, timeout, "plugin readiness (restore)", interval=node._ready_poll_s
        )
