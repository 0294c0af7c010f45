"""Restarts: the plugin replaced (running guests keep state); the kubelet, graceful and crash."""

from __future__ import annotations

from conformance.contract.node import (
    CAP_KUBELET_CRASH,
    CAP_KUBELET_RESTART,
    CAP_LONG_GUEST,
    CAP_PLUGIN_RESTART,
    Node,
    require,
)
from conformance.contract.results import Recorder
from conformance.contract.wait import wait_for
from conformance.scenarios.common import RECOVERY_TIMEOUT_S, fresh_guest, wait_ready


def restart_plugin(node: Node, rec: Recorder) -> None:
    require(node, CAP_PLUGIN_RESTART)
    wait_ready(node, rec, "before restart")
    guest = ""
    if CAP_LONG_GUEST in node.capabilities:
        # The session guest is such a running guest; another one would hold a device for the
        # rest of the run, and with the fresh guest below need three (a plugin may offer two).
        guest = node.session_guest or ""
        if not guest:
            allocation = node.allocate()
            assert allocation.ok, f"allocation for the long guest refused: {allocation.message}"
            guest = node.start_long_guest(allocation)
        wait_for(lambda: node.long_guest_counter(guest) > 2, 30, "long-running guest counting")
    before = node.plugin_instance()
    counter_before = node.long_guest_counter(guest) if guest else 0
    t0 = rec.event("plugin restarted")
    node.restart_plugin()
    assert node.plugin_instance() != before, "the plugin process was not replaced"
    rec.metric("recovery_s", wait_ready(node, rec, "after plugin restart") - t0)
    if guest:
        wait_for(
            lambda: node.long_guest_counter(guest) > counter_before,
            30,
            "long-running guest to keep counting across the plugin restart",
        )
        rec.metric("guest_counter", node.long_guest_counter(guest))
    fresh_guest(node, rec, "plugin restart")


def _kubelet_restart(node: Node, rec: Recorder, graceful: bool) -> float:
    label = "graceful" if graceful else "crash"
    wait_ready(node, rec, f"before kubelet {label} restart")
    back = node.restart_kubelet(graceful=graceful)
    t0 = rec.event(f"kubelet back after {label} restart", back)
    wait_for(
        lambda: (node.last_registration_at() or 0.0) > back,
        RECOVERY_TIMEOUT_S,
        f"re-registration after kubelet {label} restart",
    )
    latency = (node.last_registration_at() or back) - back
    rec.event(f"plugin re-registered ({label})", (node.last_registration_at() or back))
    wait_ready(node, rec, f"after kubelet {label} restart")
    rec.metric(f"reregistration_{label}_s", latency)
    fresh_guest(node, rec, f"kubelet {label} restart")
    return t0


def restart_kubelet(node: Node, rec: Recorder) -> None:
    require(node, CAP_KUBELET_RESTART)
    _kubelet_restart(node, rec, graceful=True)
    if CAP_KUBELET_CRASH in node.capabilities:
        _kubelet_restart(node, rec, graceful=False)
    else:
        rec.note("crash restart not available on this target: graceful only")
    rec.metric(
        "reregistration_s",
        max(
            float(rec.record.metrics.get("reregistration_graceful_s", 0.0)),
            float(rec.record.metrics.get("reregistration_crash_s", 0.0)),
        ),
    )
