"""Device identity faults: entry missing from the host view; an unusable device behind the path."""

from __future__ import annotations

from hvconform.contract.node import CAP_DEVICE_REMAP, CAP_DEVICE_VIEW, Node, require
from hvconform.contract.results import EventKind, Recorder
from hvconform.contract.wait import wait_for
from hvconform.scenarios.common import FAULT_TIMEOUT_S, expect_unready, fresh_guest, wait_ready


def identity_missing(node: Node, rec: Recorder) -> None:
    require(node, CAP_DEVICE_VIEW)
    wait_ready(node, rec, "before fault")
    instance = node.plugin_instance()
    host_before = node.host_device_metadata()
    node.set_device_present(False)
    t0 = rec.event("device removed from where the plugin looks", kind=EventKind.FAULT)
    try:
        expect_unready(node, rec, "identity missing", since=t0)
        wait_for(
            lambda: node.allocatable() == 0, FAULT_TIMEOUT_S, "allocatable 0 (identity missing)"
        )
        rec.metric("detected_s", rec.event("allocatable 0", kind=EventKind.DETECTED) - t0)
        assert node.capacity() > 0, "capacity must stay advertised while devices are unhealthy"
    finally:
        node.set_device_present(True)
    t1 = rec.event("device restored", kind=EventKind.REPAIRED)
    rec.metric("recovery_s", wait_ready(node, rec, "after restore", since=t1) - t1)
    assert node.plugin_instance() == instance, "recovery needed a plugin restart"
    assert node.host_device_metadata() == host_before, "the real host device changed"
    fresh_guest(node, rec, "identity restored")


def device_unusable(node: Node, rec: Recorder) -> None:
    require(node, CAP_DEVICE_REMAP)
    wait_ready(node, rec, "before fault")
    node.remap_device_unusable(True)  # /dev/null's node at the path, identity made to match
    t0 = rec.event("unusable device mapped at the hypervisor path", kind=EventKind.FAULT)
    try:
        allocation = node.allocate()
        assert not allocation.ok, "allocation succeeded on a device that is not a hypervisor"
        rec.metric("refused_s", rec.event("allocation refused", kind=EventKind.DETECTED) - t0)
        rec.note(f"refusal: {allocation.reason}: {allocation.message}")
        wait_for(
            lambda: node.allocatable() == 0, FAULT_TIMEOUT_S, "allocatable 0 (unusable device)"
        )
    finally:
        node.remap_device_unusable(False)
    t1 = rec.event("device mapping restored", kind=EventKind.REPAIRED)
    rec.metric("recovery_s", wait_ready(node, rec, "after restore", since=t1) - t1)
    fresh_guest(node, rec, "unusable device restored")
