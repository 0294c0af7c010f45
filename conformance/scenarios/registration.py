"""Registration failure as the seed defines it, and the harder variant under its own id.

`registration-failure`: the plugin is started into an isolated, empty socket directory: its
registration attempts are bounded (no busy loop: CPU measured), it is not ready, and giving it the
kubelet's directory recovers it. `registration-dir-replaced`: the directory is replaced under a
plugin that is already registered; a plugin that meets the seed's definition may still fail this
one, and is not failed under the seed's name for it.
"""

from __future__ import annotations

import time

from hvconform.contract.node import CAP_READINESS, CAP_SOCKET_REDIRECT, Node, require
from hvconform.contract.results import EventKind, Recorder
from hvconform.contract.wait import wait_for
from hvconform.scenarios.common import (
    FAULT_TIMEOUT_S,
    RECOVERY_TIMEOUT_S,
    expect_live,
    expect_unready,
    fresh_guest,
    wait_ready,
)

# Retrying must cost next to nothing: a busy loop shows up as CPU time in this window.
QUIET_WINDOW_S = 4.0
MAX_CPU_SHARE = 0.25


def _quiet_and_unready(node: Node, rec: Recorder, t0: float) -> None:
    expect_unready(node, rec, "no kubelet", since=t0)
    wait_for(lambda: node.allocatable() == 0, FAULT_TIMEOUT_S, "allocatable 0 (no kubelet)")
    rec.metric("detected_s", rec.event("not ready", kind=EventKind.DETECTED) - t0)
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
    expect_live(node, rec, "kubelet unreachable")
    if CAP_READINESS in node.capabilities:
        assert not node.plugin_ready(), "ready without a kubelet to register with"


def _recovered(node: Node, rec: Recorder, restored: float, label: str) -> None:
    t1 = rec.event("kubelet socket dir restored", restored, kind=EventKind.REPAIRED)
    wait_for(
        lambda: (node.last_registration_at() or 0.0) > restored,
        RECOVERY_TIMEOUT_S,
        "registration after the socket dir was restored",
    )
    rec.metric("reregistration_s", (node.last_registration_at() or restored) - restored)
    rec.metric("recovery_s", wait_ready(node, rec, "after restore", since=t1) - t1)
    fresh_guest(node, rec, label)


def registration_failure(node: Node, rec: Recorder) -> None:
    require(node, CAP_SOCKET_REDIRECT)
    wait_ready(node, rec, "before fault")
    node.start_plugin_isolated()
    t0 = rec.event("plugin started into an isolated empty socket dir")
    try:
        _quiet_and_unready(node, rec, t0)
    finally:
        restored = time.monotonic()  # before the call: a fast plugin may register during it
        node.restore_plugin_sockets()
    _recovered(node, rec, restored, "registration restored")


def registration_dir_replaced(node: Node, rec: Recorder) -> None:
    require(node, CAP_SOCKET_REDIRECT)
    wait_ready(node, rec, "before fault")
    node.redirect_plugin_sockets(empty=True)
    t0 = rec.event("plugin socket dir replaced by an empty dir", kind=EventKind.FAULT)
    try:
        _quiet_and_unready(node, rec, t0)
    finally:
        restored = time.monotonic()
        node.redirect_plugin_sockets(empty=False)
    _recovered(node, rec, restored, "socket dir restored")
