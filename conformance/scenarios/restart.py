"""Restarts: the plugin replaced (running guests keep state); the kubelet, graceful and crash."""

from __future__ import annotations

import time

from hvconform.contract.node import (
    CAP_GUEST,
    CAP_KUBELET_CRASH,
    CAP_KUBELET_RESTART,
    CAP_LONG_GUEST,
    CAP_PLUGIN_RESTART,
    CAP_ROLLOUT,
    Node,
    require,
)
from hvconform.contract.results import EventKind, Recorder
from hvconform.contract.wait import expired, wait_for
from hvconform.scenarios.common import RECOVERY_TIMEOUT_S, fresh_guest, wait_ready

ROLLOUT_TIMEOUT_S = 300.0


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
    t0 = rec.event("plugin restarted", kind=EventKind.FAULT)
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
    t0 = rec.event(f"kubelet back after {label} restart", back, kind=EventKind.FAULT)
    wait_for(
        lambda: (node.last_registration_at() or 0.0) > back,
        RECOVERY_TIMEOUT_S,
        f"re-registration after kubelet {label} restart",
    )
    latency = (node.last_registration_at() or back) - back
    rec.event(
        f"plugin re-registered ({label})",
        (node.last_registration_at() or back),
        kind=EventKind.REPAIRED,
    )
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


def rollout_safety(node: Node, rec: Recorder) -> None:
    """An operator's upgrade: the plugin's DaemonSet rolled with the same code. Guests running
    before keep running; a guest admitted while the old plugin goes and the new one comes must
    really run (being refused then is fine, being admitted without a usable device is not);
    allocatable returns to capacity."""
    require(node, CAP_ROLLOUT)
    wait_ready(node, rec, "before rollout")
    # Ready means allocatable > 0, so capacity is too: a 0 is a Node status written before the
    # plugin re-registered (the kubelet posts one at every restart, kept up to its 10 s status
    # period on a cluster), and waiting for allocatable to get back to it would never end.
    capacity = wait_for(node.capacity, RECOVERY_TIMEOUT_S, "capacity > 0 before the rollout", 0.2)
    guest = node.session_guest if CAP_LONG_GUEST in node.capabilities else None
    counter_before = node.long_guest_counter(guest) if guest else 0
    t0 = rec.event("rollout started")
    node.start_rollout()
    admitted = refused = 0
    deadline = time.monotonic() + ROLLOUT_TIMEOUT_S
    while not node.rollout_done():
        if time.monotonic() > deadline:
            raise expired("rollout done on this node", ROLLOUT_TIMEOUT_S, f"{admitted=} {refused=}")
        allocation = node.allocate()  # pinned to this node: admission is the kubelet's
        try:
            if not allocation.ok:
                refused += 1
                continue
            admitted += 1
            if CAP_GUEST in node.capabilities:
                outcome = node.run_guest(allocation)
                assert outcome.ok, (
                    f"a guest admitted during the rollout could not run: {outcome.detail}"
                )
        finally:
            node.release(allocation)
    rec.metric("rollout_s", rec.event("rollout done") - t0)
    rec.metric("admitted_during_rollout", admitted)
    rec.metric("refused_during_rollout", refused)
    wait_for(lambda: node.allocatable() == capacity, RECOVERY_TIMEOUT_S,
             f"allocatable back to capacity ({capacity}) after the rollout")  # fmt: skip
    wait_ready(node, rec, "after rollout")
    if guest:
        wait_for(
            lambda: node.long_guest_counter(guest) > counter_before,
            30,
            "the guest started before the rollout to keep counting",
        )
    fresh_guest(node, rec, "rollout")
