"""Health that must arrive late, or come back, without anyone restarting the plugin.

`device-late`: a plugin started before its device exists (kubevirt/kubevirt#4748) must neither
die nor advertise it, and must advertise it healthy once it appears, with no restart by hand
(NVIDIA/k8s-device-plugin#1014 and #234, Project-HAMi/ascend-device-plugin#129: a device that
recovers is never advertised again).

`stream-lost`: when its ListAndWatch stream ends, the kubelet stops reading that plugin: v1.37.2
client.go `Run` returns, handler.go `runClient` disconnects the endpoint and every device of the
resource turns unhealthy at once; only a new Register brings them back. A plugin that keeps
serving and waits for a kubelet restart leaves the node at zero until it is restarted by hand
(kubevirt/kubevirt#2098 and #6748: capacity 0 until the plugin was restarted).
"""

from __future__ import annotations

import time

from hvconform.contract.node import CAP_DEVICE_LATE, CAP_READINESS, CAP_STREAM_END, Node, require
from hvconform.contract.results import EventKind, Recorder
from hvconform.contract.wait import wait_for
from hvconform.scenarios.common import (
    RECOVERY_TIMEOUT_S,
    expect_live,
    expect_unready,
    fresh_guest,
    wait_ready,
)

# How long the plugin is watched while its device is absent: alive, nothing healthy, not ready.
ABSENT_WINDOW_S = 3.0


def _healthy_advertised(node: Node, since: float) -> list[str]:
    """When (seconds after `since`) the kubelet counted healthy devices since `since`."""
    return [
        f"{e.value} at +{e.t - since:.3f}s"
        for e in node.node_events(since)
        if e.kind == "allocatable" and e.value > 0
    ]


def device_late(node: Node, rec: Recorder) -> None:
    require(node, CAP_DEVICE_LATE)
    wait_ready(node, rec, "before the plugin restarts")
    started = node.start_plugin_without_device()
    t0 = rec.event("plugin started with its device absent", started)
    instance = node.plugin_instance()
    try:
        expect_unready(node, rec, "device absent at start", since=t0)
        refused = node.allocate()
        node.release(refused)
        assert not refused.ok, "a device was allocated while it did not exist"

        def watched() -> bool:
            assert node.plugin_running(), (
                f"the plugin exited while its device was absent:\n{node.plugin_log_tail(15)}"
            )
            assert node.allocatable() == 0, "a device is allocatable while it does not exist"
            if CAP_READINESS in node.capabilities:
                assert not node.plugin_ready(), "the plugin is ready while its device is absent"
            return time.monotonic() - started >= ABSENT_WINDOW_S

        wait_for(watched, ABSENT_WINDOW_S + 30, "the window with the device absent", interval=0.05)
        expect_live(node, rec, "device absent")
        healthy = _healthy_advertised(node, started)
        assert not healthy, f"healthy devices advertised while the device was absent: {healthy}"
        registered = (node.last_registration_at() or 0.0) > started
        rec.metric("registered_while_absent", int(registered))
        rec.event(
            "alive, nothing healthy, not ready, for the whole window", kind=EventKind.DETECTED
        )
    finally:
        node.set_device_present(True)
    t1 = rec.event("device appeared")
    rec.metric("recovery_s", wait_ready(node, rec, "device appeared", since=t1) - t1)
    assert node.plugin_instance() == instance, "the plugin needed a restart to see its device"
    fresh_guest(node, rec, "device appeared")


def stream_lost(node: Node, rec: Recorder) -> None:
    require(node, CAP_STREAM_END)
    wait_ready(node, rec, "before the stream ends")
    instance = node.plugin_instance()
    ended = node.end_plugin_stream()
    t0 = rec.event("the kubelet ended the plugin's ListAndWatch stream", ended)
    zeroed = [e for e in node.node_events(ended) if e.kind == "allocatable" and e.value == 0]
    assert zeroed, "the kubelet did not disconnect the endpoint (the fault was not made)"
    wait_for(
        lambda: (node.last_registration_at() or 0.0) > ended,
        RECOVERY_TIMEOUT_S,
        "a new registration after the kubelet ended the plugin's stream",
    )
    registered = node.last_registration_at() or ended
    rec.event("plugin registered again", registered)
    rec.metric("reregistration_s", registered - ended)
    rec.metric("recovery_s", wait_ready(node, rec, "after the stream ended", since=t0) - t0)
    if node.plugin_instance() != instance:
        rec.note("the plugin process was replaced to recover")
    fresh_guest(node, rec, "stream ended by the kubelet")
