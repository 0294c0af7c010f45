"""Steps shared by scenarios: fresh guest after a fault, readiness and capacity waits."""

from __future__ import annotations

import time

from hvconform.contract import runcontext
from hvconform.contract.node import CAP_GUEST, CAP_LIVENESS, CAP_READINESS, Node
from hvconform.contract.results import EventKind, NotApplicable, Recorder
from hvconform.contract.wait import wait_for

# How long a plugin may take to notice a fault and to recover from it. The seed measured 22-32 s
# of recovery on AKS with a polling plugin; `hvconform run --recovery-timeout` adjusts both.


def _recovery_timeout() -> float:
    try:
        return runcontext.current().recovery_timeout_s
    except RuntimeError:  # imported outside a run (unit tests): the CLI's default
        return 60.0


RECOVERY_TIMEOUT_S = _recovery_timeout()
FAULT_TIMEOUT_S = min(30.0, RECOVERY_TIMEOUT_S)


# The plugin's own reaction to a fault and to its undoing, from its readiness: on a real kubelet
# the kubelet's figures come from a node status written once a second, which bounds detected_s
# and recovery_s there; these two say how fast the plugin itself was.
PLUGIN_DETECTED = "plugin_detected_s"
PLUGIN_RECOVERED = "plugin_recovery_s"


def wait_ready(
    node: Node, rec: Recorder, label: str, timeout: float = RECOVERY_TIMEOUT_S, since: float = 0.0
) -> float:
    """Ready as the plugin says (when observable) and as the kubelet sees it (always); the time
    the kubelet saw it. `since` (a fault's undoing): also record PLUGIN_RECOVERED."""
    if CAP_READINESS in node.capabilities:
        wait_for(node.plugin_ready, timeout, f"plugin readiness ({label})")
        if since:
            rec.metric(
                PLUGIN_RECOVERED, rec.event(f"plugin ready ({label})", kind=EventKind.READY) - since
            )
    wait_for(lambda: node.allocatable() > 0, timeout, f"allocatable > 0 ({label})")
    return rec.event(f"ready ({label})", kind=EventKind.READY)


def expect_unready(
    node: Node, rec: Recorder, label: str, timeout: float = FAULT_TIMEOUT_S, since: float = 0.0
) -> None:
    """Readiness must turn false; a plugin whose readiness cannot be observed is judged on
    what the kubelet sees instead, and the evidence says so (never a silent pass). `since` (the
    fault): also record PLUGIN_DETECTED."""
    if CAP_READINESS in node.capabilities:
        wait_for(lambda: not node.plugin_ready(), timeout, f"readiness false ({label})")
        if since:
            rec.metric(
                PLUGIN_DETECTED,
                rec.event(f"plugin unready ({label})", kind=EventKind.DETECTED) - since,
            )
    else:
        rec.note(f"readiness not observable ({label}): judged on allocatable and Allocate")


def expect_live(node: Node, rec: Recorder, label: str) -> None:
    """Liveness must hold during a fault the plugin should survive (when observable). The
    target judges it as the kubelet would (the process or container running, not restarted, its
    liveness probe not failing past the kubelet's threshold), never from readiness: a plugin
    that says not-ready during a fault, as it should, is alive."""
    if CAP_LIVENESS in node.capabilities:
        if not node.plugin_live():
            # A cluster target says why in words (a restart, a kill, a failed liveness probe).
            why = getattr(node, "liveness_problem", None)
            detail = why() if callable(why) else ""
            raise AssertionError(
                f"the plugin must stay alive during the fault ({label}), but the kubelet would "
                f"restart it: {detail or 'its process ended or its liveness probe failed'}"
            )
    else:
        rec.note(f"liveness not observable ({label})")


def require_spec(node: Node) -> None:
    """CDI checks need the spec file the plugin owns (discovered at node setup)."""
    if not node.spec_name:
        raise NotApplicable("the plugin answered Allocate with no CDI device: it owns no spec")


def fresh_guest(node: Node, rec: Recorder, label: str) -> None:
    """Allocate through the kubelet and run a real guest; assert it computed its value."""
    allocation = node.allocate()
    assert allocation.ok, (
        f"allocation refused after {label}: {allocation.reason} {allocation.message}"
    )
    try:
        if CAP_GUEST in node.capabilities:
            outcome = node.run_guest(allocation)
            assert outcome.ok, f"fresh guest failed after {label}: {outcome.detail}"
            rec.event(f"fresh guest passed ({label})", kind=EventKind.GUEST)
    finally:
        node.release(allocation)


def wait_spec_desired(node: Node, timeout: float, label: str) -> float:
    """Wait until the owned spec is byte-identical to the baseline; return the monotonic time."""

    def desired() -> float | None:
        return (
            time.monotonic()
            if node.read_file("cdi", node.spec_name) == node.baseline_spec
            else None
        )

    return wait_for(desired, timeout, f"CDI spec byte-exact again ({label})", interval=0.002)
