"""Liveness as the kubelet judges it, for the targets that run the plugin themselves (the local
node's sandbox or container, the real node's sandbox).

A kubelet kills a container for two reasons only: its process ended, or its liveness probe
failed `failureThreshold` times in a row, `periodSeconds` apart (defaults 3 and 10 s,
pkg/kubelet/prober/worker.go). One failed probe kills nothing, and readiness never does: a
plugin that correctly reports not-ready during a fault is alive. So a reading here is: the
process (or container) still runs, and the profile's liveness probe, when it names one, did not
fail that many times in a row. A plugin whose liveness cannot be probed is judged on its process.
"""

from __future__ import annotations

from collections.abc import Callable

from hvconform.contract.wait import WaitExpired, wait_for

# The kubelet's defaults for a probe that sets neither (v1 Probe: periodSeconds,
# failureThreshold); profiles name no period, so the plugin gets the kubelet's patience.
PERIOD_S = 10.0
FAILURE_THRESHOLD = 3


def kubelet_live(
    running: Callable[[], bool],
    probe: Callable[[], bool] | None,
    *,
    period_s: float = PERIOD_S,
    failures: int = FAILURE_THRESHOLD,
) -> bool:
    """False once the process is gone, or once `probe` failed `failures` times in a row
    `period_s` apart; True at the first success (the kubelet resets its count there)."""
    if not running():
        return False
    if probe is None:
        return True
    try:
        wait_for(
            lambda: (not running()) or probe(),
            period_s * (failures - 1),
            f"the liveness probe passing once in {failures} tries {period_s:g}s apart",
            interval=period_s,
        )
    except WaitExpired:
        return False
    return running()
