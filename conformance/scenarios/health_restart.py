"""`health-after-kubelet-restart`: device health still reaches the kubelet after its restarts.

The behaviour verified is the kubelet's: every registration makes a new endpoint whose client
opens a new ListAndWatch stream and reads every device update from that stream only (v1.37.2
pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go, `Run`: `ListAndWatch`, then a `Recv`
loop handing each snapshot to the manager). A restarted kubelet therefore hears nothing a
plugin sends on the streams of the kubelet before it. Issue 35: "after graceful and crash
kubelet restarts, the device is removed and restored: the kubelet must see the change within
the bound (a plugin whose old streams survive and swallow updates fails it)". Faults injected
only into a plugin that never lived through a kubelet restart cannot find that defect, so here
each restart is followed by the identity checks' own fault (the device gone from where the
plugin looks, then back), judged where it matters: the kubelet's allocatable.

A plugin that marks the device Unhealthy and one that drops it from its list both bring the
kubelet's allocatable to 0: either passes, as long as the new stream carries it.
"""

from __future__ import annotations

from hvconform.contract.node import (
    CAP_DEVICE_VIEW,
    CAP_KUBELET_CRASH,
    CAP_KUBELET_RESTART,
    Node,
    require,
)
from hvconform.contract.results import EventKind, Recorder
from hvconform.contract.wait import WaitExpired, wait_for
from hvconform.scenarios.common import FAULT_TIMEOUT_S, RECOVERY_TIMEOUT_S, wait_ready


def _allocatable_becomes(node: Node, want: int, timeout: float, what: str) -> None:
    """Wait for the kubelet's allocatable to be `want`; the failure says what it still was."""
    try:
        wait_for(lambda: node.allocatable() == want, timeout, what, interval=0.01)
    except WaitExpired:
        raise AssertionError(
            f"{what}: the kubelet still counted {node.allocatable()} allocatable "
            f"{node.resource} after {timeout:g} s (wanted {want})"
        ) from None


def _fault_after_restart(node: Node, rec: Recorder, graceful: bool) -> None:
    label = "graceful" if graceful else "crash"
    wait_ready(node, rec, f"before the kubelet {label} restart")
    back = node.restart_kubelet(graceful=graceful)
    rec.event(f"kubelet back after {label} restart", back, kind=EventKind.FAULT)
    wait_for(
        lambda: (node.last_registration_at() or 0.0) > back,
        RECOVERY_TIMEOUT_S,
        f"re-registration after the kubelet {label} restart",
    )
    wait_ready(node, rec, f"after the kubelet {label} restart")
    # Every device allocatable again: what the fault must take away and give back. On a real
    # kubelet capacity is the node status, written once its plugin is back: wait for it too.
    full = wait_for(
        lambda: c if (c := node.capacity()) > 0 and node.allocatable() == c else None,
        RECOVERY_TIMEOUT_S,
        f"every device allocatable after the kubelet {label} restart",
        interval=0.05,
    )
    node.set_device_present(False)
    t0 = rec.event(f"device removed ({label} restart behind)", kind=EventKind.FAULT)
    try:
        _allocatable_becomes(
            node, 0, FAULT_TIMEOUT_S,
            f"the kubelet to see the device gone after its {label} restart",
        )  # fmt: skip
        rec.metric(
            f"detected_{label}_s",
            rec.event(f"allocatable 0 ({label})", kind=EventKind.DETECTED) - t0,
        )
    finally:
        node.set_device_present(True)
    t1 = rec.event(f"device restored ({label} restart behind)", kind=EventKind.REPAIRED)
    _allocatable_becomes(
        node, full, RECOVERY_TIMEOUT_S,
        f"the kubelet to see the device back after its {label} restart",
    )  # fmt: skip
    rec.metric(f"recovery_{label}_s", rec.event(f"allocatable {full} again ({label})") - t1)


def health_after_kubelet_restart(node: Node, rec: Recorder) -> None:
    require(node, CAP_KUBELET_RESTART, CAP_DEVICE_VIEW)
    _fault_after_restart(node, rec, graceful=True)
    if CAP_KUBELET_CRASH in node.capabilities:
        _fault_after_restart(node, rec, graceful=False)
    else:
        rec.note("crash restart not available on this target: graceful only")
    wait_ready(node, rec, "after the last restore")
    for what in ("detected", "recovery"):
        rec.metric(
            f"{what}_s",
            max(float(v) for k, v in rec.record.metrics.items() if k.startswith(f"{what}_")),
        )
