"""Isolation between checks on the real node: the local node's restore (local/baseline.py).

After every check, pass or fail, every fault the harness made is undone (read-only storage, the
plugin's socket dir redirected or isolated, its device remapped or gone), nothing but a regular
file is left at the spec path, the kubelet runs (no check's pod or ReplicaSet left on it), the
plugin runs and is registered with every device allocatable (in a node status written after the
restore), its spec is byte-identical to its baseline with its baseline mode, and it is ready
when that can be observed. A plugin that lost its spec is given one restart (plugins write it
at start). What cannot be restored is returned, named: the checks after it on this node end
`blocked`, never failed for it. Here the kubelet is a process, and every change the restore
makes stamps the time the kubelet's figures must be newer than.
"""

from __future__ import annotations

from typing import Any

from hvconform.targets.local.baseline import BaselineRestore
from hvconform.targets.realnode import procs, stack


class RealRestore(BaselineRestore):
    """Mixin of RealNode (which provides the attributes and primitives used here)."""

    # the node status and the probes are asked across processes: less often
    _allocatable_poll_s = 0.05
    _ready_poll_s = 0.02

    def _restore_kubelet(self) -> None:
        node: Any = self
        kubelet = procs.recorded("kubelet")
        if kubelet is None or not kubelet.alive:
            node.touched()
            stack.start_kubelet(node.api)
        node.delete_check_pods()  # the devices they hold are free for the next check

    def _spec_path_cleared(self) -> None:
        node: Any = self
        node.touched()
