"""Isolation between checks on the local node, and discovery of the plugin's CDI spec file.

After every check, pass or fail, the node is put back to its baseline and that is verified on
both sides before the next check: no fault of the harness left in place (read-only storage,
redirected or isolated sockets, a remapped or hidden device), nothing but the plugin's own spec
at the spec path, the kubelet up, and then the kubelet's view back to node setup's (as many
devices as then, every one allocatable) AND the plugin's own word: it runs, says it is ready
(when observable), its latest ListAndWatch list has every device healthy (sent after the undo
when the restore undid a fault; where the target sees the lists), one real allocation is
answered, and its spec is byte-identical to its baseline with its baseline mode. A plugin that
does not come back is restarted as the target restarts it (plugins write their spec at start,
and register afresh). What that does not bring back is returned, named, so the remaining checks
on this node end `blocked`, never failed on account of an earlier check.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hvconform.contract.base import discover_spec
from hvconform.contract.dra_profile import API_DEVICE_PLUGIN
from hvconform.contract.node import CAP_GUEST, CAP_LONG_GUEST, CAP_READINESS, Allocation
from hvconform.contract.wait import WaitExpired, wait_for

RESTORE_TIMEOUT_S = 30.0
FIRST_TRY_S = 5.0


class BaselineRestore:
    """Mixin for the local node (it provides the attributes and primitives used here)."""

    _faults: set[str]
    spec_name: str
    baseline_spec: bytes
    baseline_mode: int = 0
    baseline_capacity: int = 0  # the kubelet's count of the plugin's devices at node setup
    # how often the restore asks for allocatable and readiness (the real node's answers cost more)
    _allocatable_poll_s = 0.01
    _ready_poll_s = 0.005

    def _take_baseline(self, allocation: Allocation, spec_timeout: float) -> None:
        """At node setup, with the first admitted allocation: the plugin's CDI spec (the
        profile's, else the one declaring the allocated kind) and its mode are the baseline; the
        session guest holds that allocation, or (nothing injected) the guest checks do not apply."""
        node: Any = self
        self.baseline_capacity = node.capacity()
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
        # A fault undone here: the plugin must say so itself, in a list sent after the undo.
        since = time.monotonic() if self._faults else 0.0
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
            since = time.monotonic()
            node.restart_plugin()
        # Short first: a plugin that lost its spec (and will not repair it) gets its
        # restart without the whole timeout spent on every dirty check.
        first = _wait_baseline(node, since, FIRST_TRY_S)
        if first:
            since = time.monotonic()
            node.restart_plugin()  # a plugin that lost its spec writes it again at start
            second = _wait_baseline(node, since)
            if second:
                return [f"{second}, also after a restart of the plugin (before it: {first})"]
        return []

    def listed_healthy(self, since: float) -> str:
        """What the plugin's latest ListAndWatch list lacks: "" when it came after `since` and
        lists every device of node setup healthy, or when the target cannot see the lists (a
        hook: the local node reads its kubelet emulator's)."""
        return ""

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


def _unmet(node: Any, since: float) -> str:
    """The first thing not back at its baseline, in words ("" when everything is)."""
    if not node.plugin_running():
        return "the plugin is not running"
    cap, alloc, want = node.capacity(), node.allocatable(), node.baseline_capacity
    if (cap != want if want else cap <= 0) or alloc != cap:
        return f"the kubelet counts {alloc} allocatable of {cap} devices (at node setup: {want})"
    if node.spec_name:
        info = node.stat("cdi", node.spec_name)
        if node.read_file("cdi", node.spec_name) != node.baseline_spec:
            return f"the CDI spec {node.spec_name} is not byte-identical to its baseline"
        if info is None or info.mode != node.baseline_mode:
            return f"the CDI spec {node.spec_name} does not have its baseline mode"
    if CAP_READINESS in node.capabilities and not node.plugin_ready():
        return f"the plugin does not say it is ready ({node.plugin.readiness.type} probe)"
    listed: str = node.listed_healthy(since)
    return listed


def _allocation_refused(node: Any) -> str:
    """One real allocation through the kubelet, released at once: what was refused ("" when
    answered, or when no device is free to ask with)."""
    allocation = node.allocate()
    try:
        # a full node is no word of the plugin's: the emulator's, and the kubelet's OutOf<name>
        full = allocation.reason == "InsufficientResources" or allocation.reason.startswith("OutOf")
        if allocation.ok or full:
            return ""
        return f"an allocation was refused: {allocation.reason} {allocation.message}".strip()
    finally:
        node.release(allocation)


def _wait_baseline(node: Any, since: float, timeout: float = RESTORE_TIMEOUT_S) -> str:
    """Nothing once both sides are back within `timeout`; else what was last missing, in
    words."""
    last = {"why": ""}

    def back() -> bool:
        last["why"] = _unmet(node, since)
        return not last["why"]

    try:
        poll = max(node._ready_poll_s, node._allocatable_poll_s)
        wait_for(back, timeout, "the node back at its baseline (restore)", poll)
    except WaitExpired:
        return f"{last['why']} after {timeout:g}s"
    if node.plugin.api != API_DEVICE_PLUGIN:
        return ""
    return _allocation_refused(node)
