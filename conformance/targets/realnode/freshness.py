"""The kubelet's figures on the real node, never older than the harness's last change.

Capacity and allocatable come from the Node's status: a copy the kubelet writes every second
(nodeStatusReportFrequency 1s), not the device manager itself. Read right after a fault or its
undoing, it still shows the devices from before: a read-only CDI dir set and cleared within
60 ms left allocatable at 1 in every status, the check went on, and its Allocate was refused
("no healthy devices"), a failure the plugin did not cause. So every change the harness makes to
the node (a file, a directory, a device node, a mount, a restart) is stamped, and a figure is
taken only from a status written after the last stamp, with a margin for the plugin to notice.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from hvconform.contract.node import Area
from hvconform.contract.quantity import quantity
from hvconform.contract.wait import wait_for
from hvconform.targets.host.hostfiles import HostFiles
from hvconform.targets.realnode import NODE_NAME
from hvconform.targets.realnode.kubeapi import Api

FRESH_MARGIN_S = 0.05  # a status this much after a change: the plugin's event path is ms
FRESH_TIMEOUT_S = 15.0  # the kubelet writes one every second; 15 s without one is a dead kubelet


class FreshStatus(HostFiles):
    """HostFiles whose changes stamp the time; capacity and allocatable read after the stamp."""

    api: Api | None
    resource: str  # the plugin's resource name (declared in its profile, or from its Register)
    _changed_at = 0.0

    def touched(self) -> None:
        """The node was just changed (by a fault, its undoing or a restart)."""
        self._changed_at = time.time()

    def _node_status(self) -> dict[str, Any]:
        assert self.api is not None
        status: dict[str, Any] = self.api.get(f"/api/v1/nodes/{NODE_NAME}")["status"]
        return status

    def _written_after_change(self) -> dict[str, Any] | None:
        status = self._node_status()
        for cond in status.get("conditions", []):
            if cond.get("type") == "Ready":
                beat = datetime.fromisoformat(cond["lastHeartbeatTime"].replace("Z", "+00:00"))
                # RFC 3339 seconds: a status stamped S was written in [S, S+1)
                return status if beat.timestamp() >= self._changed_at + FRESH_MARGIN_S else None
        return None

    def _status(self, key: str) -> int:
        what = "a node status written after the harness's last change to the node"
        status = (
            wait_for(self._written_after_change, FRESH_TIMEOUT_S, what)
            if self._changed_at
            else self._node_status()
        )
        return quantity(status.get(key, {}).get(self.resource, "0"))

    def capacity(self) -> int:
        return self._status("capacity")

    def allocatable(self) -> int:
        return self._status("allocatable")

    # -- every change to the node's files stamps the time ------------------------------------

    def write_file(self, area: Area, name: str, data: bytes) -> None:
        super().write_file(area, name, data)
        self.touched()

    def remove(self, area: Area, name: str) -> None:
        super().remove(area, name)
        self.touched()

    def make_dir(self, area: Area, name: str) -> None:
        super().make_dir(area, name)
        self.touched()

    def remove_dir(self, area: Area, name: str) -> None:
        super().remove_dir(area, name)
        self.touched()

    def make_char_device(self, area: Area, name: str, major: int, minor: int) -> None:
        super().make_char_device(area, name, major, minor)
        self.touched()

    def replace_char_device(self, area: Area, name: str, major: int, minor: int) -> None:
        super().replace_char_device(area, name, major, minor)
        self.touched()
