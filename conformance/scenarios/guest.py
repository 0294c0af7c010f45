"""Real guest execution through an allocation, repeated, with fresh execution after disposal."""

from __future__ import annotations

from hvconform.contract.node import CAP_GUEST, Node, require
from hvconform.contract.results import Recorder

RUNS = 6


def guest_execution(node: Node, rec: Recorder) -> None:
    require(node, CAP_GUEST)
    values = []
    for i in range(RUNS):
        allocation = node.allocate()
        assert allocation.ok, f"allocation {i} refused: {allocation.reason} {allocation.message}"
        assert allocation.cdi_devices or allocation.device_specs, (
            "allocation carries no device: neither a CDI device nor a DeviceSpec"
        )
        try:
            outcome = node.run_guest(allocation)
        finally:
            node.release(allocation)  # disposal: the next run gets a fresh VM and allocation
        assert outcome.ok, f"guest run {i} failed: {outcome.detail}"
        values.append(outcome.value)
    rec.metric("runs", RUNS)
    if allocation.cdi_devices:
        rec.metric("cdi_device", ",".join(allocation.cdi_devices))
    if allocation.device_specs:  # what a runtime made from a DeviceSpec answer
        rec.metric("device_spec", ",".join(d.container_path for d in allocation.device_specs))
    rec.note(f"guest values: {values}")
