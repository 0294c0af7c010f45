"""Isolation between checks on the real node, as on the local node (local/baseline.py).

After every check, pass or fail, every fault the harness made is undone (read-only storage, the
plugin's socket dir redirected or isolated, its device remapped or gone), nothing but a regular
file is left at the spec path, the kubelet runs, the plugin runs and is registered with every
device allocatable (in a node status written after the restore), its spec is byte-identical to
its baseline with its baseline mode, and it is ready when that can be observed. A plugin that
lost its spec is given one restart (plugins write it at start). What cannot be restored is
returned, named: the checks after it on this node end `blocked`, never failed for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.node import CAP_READINESS
from conformance.contract.wait import WaitExpired, wait_for
from conformance.targets.realnode import procs, stack

RESTORE_TIMEOUT_S = 30.0
FIRST_TRY_S = 5.0


class RealRestore:
    """Mixin of RealNode (which provides the attributes and primitives used here)."""

    _faults: set[str]
    spec_name: str
    baseline_spec: bytes
    baseline_mode: int = 0

    def restore_baseline(self) -> list[str]:
        node: Any = self
        problems = []
        for fault in sorted(self._faults):
            try:
                _undo(node, fault)
            except Exception as exc:
                problems.append(f"could not undo {fault}: {exc}")
        if problems:
            return problems
        if self.spec_name and (problem := _clear_spec_path(node)):
            return [problem]
        kubelet = procs.recorded("kubelet")
        if kubelet is None or not kubelet.alive:
            node.touched()
            stack.start_kubelet(node.api)
        if not node.plugin_running():
            node.restart_plugin()
        try:
            # Short first: a plugin that lost its spec (and will not repair it) gets its
            # restart without the whole timeout spent on every dirty check.
            _wait_baseline(node, FIRST_TRY_S)
        except WaitExpired as first:
            node.restart_plugin()
            try:
                _wait_baseline(node)
            except WaitExpired as second:
                return [f"{second} (also before a plugin restart: {first})"]
        return []


def _undo(node: Any, fault: str) -> None:
    if fault.startswith("read-only "):
        node.set_storage_read_only(fault.removeprefix("read-only "), False)
    elif fault == "sockets":
        node.redirect_plugin_sockets(False)
    elif fault == "isolated":
        # restarting that sandbox would start it into the empty dir again: a fresh one, with
        # the kubelet's own directory bound
        node._stop_plugin()
        node._start_plugin()
        node._faults.discard("isolated")
    elif fault == "remap":
        node.remap_device_unusable(False)
    elif fault == "device":
        node.set_device_present(True)


def _clear_spec_path(node: Any) -> str:
    """Remove what the harness left at the spec path that is not a regular file (never rm -r:
    whatever is inside is the plugin's doing, and evidence)."""
    info = node.stat("cdi", node.spec_name)
    if info is None or info.kind == "file":
        return ""
    path = Path(node.dirs["cdi"]) / node.spec_name
    try:
        path.rmdir() if info.kind == "dir" else path.unlink()
    except OSError as exc:
        listing = ", ".join(sorted(p.name for p in path.iterdir())) if path.is_dir() else ""
        return (
            f"the {info.kind} at the spec path {node.spec_name} cannot be removed "
            f"({exc.strerror}{': holds ' + listing if listing else ''})"
        )
    node.touched()
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
        interval=0.05,
    )
    wait_for(spec_back, timeout, "CDI spec bytes and mode as at baseline (restore)")
    if CAP_READINESS in node.capabilities:
        wait_for(node.plugin_ready, timeout, "plugin readiness (restore)", interval=0.02)
