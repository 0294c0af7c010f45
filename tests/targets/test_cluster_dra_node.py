"""The cluster family's DRA node without a cluster: what it observes from the API server's
objects (the driver's slices, the scheduler's and the kubelet's refusals), how its pods reach the
node (scheduled, not bound by hand), and what it declares (no device-plugin-only capability).
The live proof is `nox -s conformance-kind -- --plugin-profile conformance/profiles/
hv-dra-driver.yaml`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hvconform.contract.dra import (
    CAP_DRA,
    CAP_REGISTRATION_SOCKET,
    DELETION_GRACE_S,
    DEVICE_PLUGIN_ONLY,
    UNPREPARE_FAILED,
    slice_view,
)
from hvconform.contract.node import CAP_NODE_REBOOT, CAP_PLUGIN_RESTART
from hvconform.targets.cluster.dra_node import PREPARE_FAILED, ClusterDraNode
from hvconform.targets.cluster.kubelet import KUBELET_STOP
from hvconform.targets.cluster.workloads import workload_pod

NODE, DRIVER, NS = "hvt-control-plane", "hypervisor.hyperlight.dev", "hvconform-work-x"


def _slice(uid: str, node: str = NODE, driver: str = DRIVER, **device: Any) -> dict[str, Any]:
    return {"metadata": {"uid": uid},
            "spec": {"driver": driver, "nodeName": node, "devices": [{"name": "kvm", **device}]}}  # fmt: skip


class _Api:
    def __init__(self, pod: dict[str, Any], events: list[dict[str, Any]]) -> None:
        self.pod, self.events = pod, events
        self.fields: list[str] = []

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> Any:
        return self.pod

    def list_objects(self, api_version: str, kind: str, namespace: str = "", **kw: Any) -> Any:
        self.fields.append(kw.get("fields", ""))
        return self.events if kind == "Event" else []


def _node(api: Any = None) -> ClusterDraNode:
    node = ClusterDraNode.__new__(ClusterDraNode)
    node.api, node.node_name, node.capability_notes = api, NODE, {}
    node.access = SimpleNamespace(where="the diagnostic pod", local_path=None)  # type: ignore[assignment]
    node.options = SimpleNamespace(work_namespace=NS)  # type: ignore[assignment]
    return node


def test_only_the_drivers_slices_of_this_node_count_and_blocking_taints_leave_devices_out() -> None:
    assert slice_view(_slice("a", node="other"), DRIVER, NODE) is None
    assert slice_view(_slice("a", driver="x.io"), DRIVER, NODE) is None
    view = slice_view(_slice("a", taints=[{"effect": "NoExecute"}], allowMultipleAllocations=True),
                      DRIVER, NODE)  # fmt: skip
    assert view is not None and (view.devices, view.tainted, view.shared) == (1, 1, 1)
    kept = slice_view(_slice("b", taints=[{"effect": "PreferNoSchedule"}]), DRIVER, NODE)
    assert kept is not None and kept.tainted == 0


def test_a_dra_node_declares_no_device_plugin_only_capability_and_says_why() -> None:
    node = _node()
    caps = node._dra_capabilities(frozenset({CAP_NODE_REBOOT, CAP_PLUGIN_RESTART}))
    assert caps == {CAP_PLUGIN_RESTART, CAP_DRA} and not caps & DEVICE_PLUGIN_ONLY
    assert "DRA driver" in node.capability_notes[CAP_NODE_REBOOT]


def test_workload_pods_are_scheduled_to_the_node_not_bound_by_hand() -> None:
    pod = workload_pod("p", NS, NODE, "img", "/dev/kvm", taint=False, guest=True)
    placed = _node()._placed(pod)
    assert "nodeName" not in placed["spec"]  # a pod bound by hand never gets a claim allocated
    assert placed["spec"]["nodeSelector"] == {"kubernetes.io/hostname": NODE}


def _pending(conditions: list[dict[str, str]]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": NS},
            "status": {"phase": "Pending", "conditions": conditions}}  # fmt: skip


def test_the_schedulers_and_the_kubelets_refusals_are_refusals() -> None:
    unschedulable = _pending([{"type": "PodScheduled", "reason": "Unschedulable",
                               "message": "0/1 nodes: cannot allocate all claims"}])  # fmt: skip
    got = _node(_Api(unschedulable, []))._admitted(unschedulable)
    assert got is not None and not got["ok"] and got["reason"] == "Unschedulable"
    assert "cannot allocate" in got["message"]
    pending = _pending([{"type": "PodScheduled", "status": "True"}])
    events = [{"message": "read-only file system", "count": 3}]
    api = _Api(pending, events)
    node = _node(api)
    got = node._admitted(pending)
    assert got is not None and got["reason"] == PREPARE_FAILED and "read-only" in got["message"]
    assert node.prepare_failures("p") == 3  # an event's count is that many failed prepares
    assert f"involvedObject.name=p,reason={PREPARE_FAILED}" in api.fields
    assert _node(_Api(pending, []))._admitted(pending) is None  # still being scheduled


def test_a_stopped_kubelet_stays_down_until_started_and_a_failed_check_has_it_started() -> None:
    node, ran = _node(), []

    def run(argv: list[str]) -> str:
        ran.append(argv)
        return "1700000000.5\n"

    node._node = run  # type: ignore[method-assign]
    node.stop_kubelet(graceful=False)
    # systemd's Restart=always (or the node init) would start a killed kubelet again: the
    # script holds it stopped (tests/realnode/test_nodeinit_hold.py runs the node init's side)
    assert ran == [["sh", "-c", KUBELET_STOP, "sh", "crash"]]
    assert "systemctl kill --signal=SIGKILL kubelet && systemctl stop kubelet" in KUBELET_STOP
    assert node._node_down  # what undo_reboot (restore_baseline) starts again
    node.stop_kubelet(graceful=True)
    assert ran[-1] == ["sh", "-c", KUBELET_STOP, "sh", "graceful"]


def test_failed_unprepares_are_read_from_the_kubelets_log_in_the_node() -> None:
    node, ran = _node(), []
    node._since = 1700000000
    line = ('1700000100.5 kind kubelet[7]: E0101 10:00:00.000000 7 pod_workers.go:1338] "Error '
            'syncing pod, skipping" err="unprepare dynamic resources: NodeUnprepareResources '
            f'failed for ResourceClaim c: read-only" pod="{NS}/p" podUID="u"')  # fmt: skip
    other = line.replace(f"{NS}/p", f"{NS}/q")

    def run(argv: list[str]) -> str:
        ran.append(argv)
        return f"{line}\n{other}\n{line}\n"

    node._node = run  # type: ignore[method-assign]
    assert node.unprepare_failures("p") == 2 and node.unprepare_failures("q") == 1
    assert ran[0][-2:] == ["1700000000", UNPREPARE_FAILED]  # since the run began, grepped


def test_a_graceful_deletion_is_asked_and_not_waited_for() -> None:
    deleted: list[tuple[Any, ...]] = []
    api = SimpleNamespace(delete=lambda *a, **kw: deleted.append((*a, kw["grace"])))
    _node(api).request_pod_deletion("p")
    assert deleted == [("v1", "Pod", "p", NS, DELETION_GRACE_S)] and DELETION_GRACE_S > 0


def test_the_registration_socket_fault_is_not_declared_and_says_why() -> None:
    node = _node()
    assert CAP_REGISTRATION_SOCKET not in node._dra_capabilities(frozenset())
    assert "GetInfo" in node.capability_notes[CAP_REGISTRATION_SOCKET]
