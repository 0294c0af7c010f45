"""Liveness on the cluster targets is what the kubelet does to the plugin's container, never its
readiness (issue 35): read from recorded pod status objects and events of the shapes a v1.37
kubelet writes (a plugin that reports not-ready during a fault, one the kubelet killed after
failed liveness probes, one that crashed and was restarted in place)."""

from __future__ import annotations

import copy
from typing import Any

from hvconform.targets.cluster.plugin_pod import live_window, liveness_problem
from tests.targets.conftest import Recorded
from tests.targets.test_kind_contract import kind_run

CONTAINER = "plugin"
STARTED = "2026-12-06T10:00:00Z"


def pod(*, ready: bool = True, restarts: int = 0, started: str = STARTED) -> dict[str, Any]:
    """A plugin pod as the API server returns it (the fields the kubelet's status manager
    writes), with exec probes only and no HTTP port."""
    flag = "True" if ready else "False"
    return {
        "metadata": {"name": "hv-plugin-x7k2p", "uid": "pod-uid-1"},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": flag},
                {"type": "ContainersReady", "status": flag},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [
                {
                    "name": CONTAINER,
                    "ready": ready,
                    "started": True,
                    "restartCount": restarts,
                    "state": {"running": {"startedAt": started}},
                    "containerID": "containerd://abc",
                }
            ],
        },
    }


def event(reason: str, message: str, uid: str, count: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid},
        "involvedObject": {
            "kind": "Pod",
            "uid": "pod-uid-1",
            "fieldPath": f"spec.containers{{{CONTAINER}}}",
        },
        "reason": reason,
        "message": message,
        "count": count,
        "type": "Warning",
    }


READINESS_FAILED = event("Unhealthy", "Readiness probe failed: not ready: cdi spec", "ev-r")


def test_a_plugin_unready_during_a_fault_but_never_restarted_is_live() -> None:
    window = live_window(pod(), CONTAINER, [])
    assert window is not None
    during = pod(ready=False)  # ContainersReady False: the readiness probe, not liveness
    assert liveness_problem(during, CONTAINER, window, [READINESS_FAILED]) == ""
    # the same again with the readiness failures counted up by the kubelet
    again = copy.deepcopy(READINESS_FAILED) | {"count": 7}
    assert liveness_problem(during, CONTAINER, window, [again]) == ""


def test_a_restart_since_the_window_began_is_not_live() -> None:
    window = live_window(pod(), CONTAINER, [])
    restarted = pod(restarts=1, started="2026-12-06T10:01:30Z")
    restarted["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"reason": "Error", "exitCode": 2, "finishedAt": "2026-12-06T10:01:29Z"}
    }
    why = liveness_problem(restarted, CONTAINER, window, [])
    assert "restarted 1 time(s)" in why and "exitCode 2" in why, why
    # a restart that happened before the window began is not this check's
    later = live_window(restarted, CONTAINER, [])
    assert liveness_problem(restarted, CONTAINER, later, []) == ""


def test_a_kill_for_failed_liveness_probes_is_not_live_even_before_the_restart_shows() -> None:
    old = event("Unhealthy", "Liveness probe failed: timeout", "ev-l", count=2)
    window = live_window(pod(), CONTAINER, [old])
    # failures already there when the window began are not this window's
    assert liveness_problem(pod(), CONTAINER, window, [old]) == ""
    more = copy.deepcopy(old) | {"count": 3}
    kill = event("Killing", "Container plugin failed liveness probe, will be restarted", "ev-k")
    assert "Liveness probe failed" in liveness_problem(pod(), CONTAINER, window, [more])
    why = liveness_problem(pod(), CONTAINER, window, [kill])
    assert why.startswith("the kubelet reported Killing"), why
    # a kill of the harness's own deletion is not a liveness verdict
    stop = event("Killing", "Stopping container plugin", "ev-s")
    assert liveness_problem(pod(), CONTAINER, window, [stop]) == ""


def test_a_container_not_running_or_a_replaced_pod_is_not_live() -> None:
    window = live_window(pod(), CONTAINER, [])
    waiting = pod()
    waiting["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    assert "waiting (reason CrashLoopBackOff)" in liveness_problem(waiting, CONTAINER, window, [])
    assert live_window(waiting, CONTAINER, []) is None
    other = pod()
    other["metadata"]["uid"] = "pod-uid-2"
    assert "replaced" in liveness_problem(other, CONTAINER, window, [])
    assert liveness_problem(None, CONTAINER, window, []) == "no plugin pod on the node"


def test_kind_restore_verifies_both_sides_and_a_restart_ends_the_plugins_life(
    recorded: Recorded,
) -> None:
    """Against the recorded kind contract: the restore after a check verifies the plugin back
    (ready, the setup's devices, one pod admitted) and opens a new liveness window; a restart of
    the container the kubelet made behind the harness's back is then read as the plugin's death,
    in words, while a pod that only turned unready is still alive."""
    _, _, _, cm = kind_run(recorded)
    with cm as node:
        assert node.restore_baseline() == []
        assert node.plugin_live() and node.liveness_problem() == ""
        pod_path = next(
            p for p, o in recorded.kube.state.objects.items()
            if "/pods/" in p and o.get("metadata", {}).get("uid") == node._pod()["metadata"]["uid"]
        )  # fmt: skip
        status = recorded.kube.state.objects[pod_path]["status"]
        for cond in status["conditions"]:
            cond["status"] = "False"  # the readiness probe failing: Ready, ContainersReady
        status["containerStatuses"][0]["ready"] = False
        assert node.plugin_live(), node.liveness_problem()
        status["containerStatuses"][0]["restartCount"] = 1
        assert not node.plugin_live()
        assert "restarted 1 time(s) since the check began" in node.liveness_problem()
