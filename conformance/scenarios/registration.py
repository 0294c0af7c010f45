"""Registration failure: the plugin sees an empty socket dir; bounded attempts; then recovery."""

from __future__ import annotations

import time

from conformance.contract.node import CAP_SOCKET_REDIRECT, Node, require
from conformance.contract.results import Recorder
from conformance.contract.wait import wait_for
from conformance.scenarios.common import (
    FAULT_TIMEOUT_S,
    RECOVERY_TIMEOUT_S,
    fresh_guest,
    wait_ready,
)

# Retrying must cost next to nothing: a busy loop shows up as CPU time in this window.
QUIET_WINDOW_S = 4.0
MAX_CPU_SHARE = 0.25


def registration_failure(node: Node, rec: Recorder) -> None:
    require(node, CAP_SOCKET_REDIRECT)
    wait_ready(node, rec, "before fault")
    node.redirect_plugin_sockets(empty=True)
    t0 = rec.event("plugin socket dir replaced by an empty dir")
    try:
        wait_for(lambda: not node.plugin_ready(), FAULT_TIMEOUT_S, "readiness false (no kubelet)")
        wait_for(lambda: node.allocatable() == 0, FAULT_TIMEOUT_S, "allocatable 0 (no kubelet)")
        rec.metric("detected_s", rec.event("not ready") - t0)
        cpu0, w0 = node.plugin_cpu_seconds(), time.monotonic()
        wait_for(
            lambda: time.monotonic() - w0 >= QUIET_WINDOW_S,
            QUIET_WINDOW_S + 5,
            "quiet window to elapse",
            interval=0.1,
        )
        share = (node.plugin_cpu_seconds() - cpu0) / (time.monotonic() - w0)
        rec.metric("retry_cpu_share", share)
        assert share < MAX_CPU_SHARE, f"plugin used {share:.0%} of a CPU while unregistered"
        assert node.plugin_live(), "liveness must stay true while the kubelet is unreachable"
        assert not node.plugin_ready(), "ready without a kubelet to register with"
    finally:
        # Taken before the restore starts: a fast plugin may register before the call returns.
        restored = time.monotonic()
        node.redirect_plugin_sockets(empty=False)
    t1 = rec.event("kubelet socket dir restored", restored)
    wait_for(
        lambda: (node.last_registration_at() or 0.0) > restored,
        RECOVERY_TIMEOUT_S,
        "registration after the socket dir was restored",
    )
    rec.metric("reregistration_s", (node.last_registration_at() or restored) - restored)
    rec.metric("recovery_s", wait_ready(node, rec, "after restore") - t1)
    fresh_guest(node, rec, "registration restored")
